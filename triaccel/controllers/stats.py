"""The statistics one control window hands to every controller: measured once, frozen.

The control loop (``triaccel.control``) reads the device once per window and builds one
``WindowStats``; each controller's ``decide`` reads the fields it needs. A window is one of:

- a control window (every ``control_every`` steps): ``variance``, ``overflow``, ``promote``,
  ``peak_bytes``, and, where the batch controller decides in it, ``seconds``, ``examples`` and
  ``pressure``;
- a batch window (every ``explore_steps`` while the score policy explores): the batch fields;
- a curvature refresh (every ``curvature.every`` steps): ``topk``.

A field the window did not measure is None.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WindowStats:
    window: int  # control windows so far, this one included
    step: int  # optimizer updates so far
    # per layer, in the precision runtime's order
    variance: tuple[float, ...] | None = None  # gradient-variance EMA
    overflow: tuple[bool, ...] | None = None  # non-finite gradients since the last control window
    # the GradScaler's scale at the window's end, read only in a window with an overflow (None: no
    # scaler, or nothing to judge)
    loss_scale: float | None = None
    topk: tuple[tuple[float, ...], ...] | None = None  # top-k curvature estimates of this refresh
    # the curvature controller's latest decision: tau_curv exceeded by the quantity its lr_rule uses
    # (lambda / median lambda under normalized, lambda under paper); None without a curvature controller
    promote: tuple[bool, ...] | None = None
    # memory and time, for the batch controller
    peak_bytes: float | None = None  # allocator peak since the batch controller's last decision
    pressure: bool = False  # the whole device nearly full (NVML, trials sharing a GPU): no growth
    seconds: float | None = None  # device time of the window's examples (curvature refreshes left out)
    examples: int = 0  # examples trained in the window
    # seconds the run's first training step took (this process's): the kernels of its shapes chosen or
    # tuned, the allocator grown. The batch controller reads it as what a new batch size costs once
    first_step_s: float | None = None
    # whether a precision plan not yet run may be taken (triaccel.controllers.precision.PlanBudget)
    new_plan: bool = True
