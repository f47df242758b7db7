"""How callbacks talk to the Trainer: the hook points (``Callback``), what a step tells them
(``StepInfo``), and the one kind of change they may ask for (``Decisions``), which
``Trainer.apply`` puts into effect between steps."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from triaccel.trainer import Trainer


@dataclass
class Decisions:
    """Changes to the trainer's adaptive state that a callback asks for. Hooks return them;
    ``Trainer.apply`` is the one writer of that state (batch, micro-batch, lr multipliers,
    precision levels, the loss scale), so a decision takes effect at one point, between steps. None: unchanged."""
    batch_size: int | None = None
    micro_batch: int | None = None
    batch_lr_factor: float | None = None
    lr_scales: tuple | None = None  # multipliers of the first len(lr_scales) optimizer groups
    levels: dict | None = None  # layer name -> fp16 | bf16 | fp32
    cudnn_benchmark: bool | None = None
    loss_scale: float | None = None  # the GradScaler's scale, set anew

    def merged(self, later: "Decisions | None") -> "Decisions":
        """This decision updated by a later one (the later one's fields win)."""
        if later is None:
            return self
        out = Decisions(**self.__dict__)
        for k, v in later.__dict__.items():
            if v is not None:
                setattr(out, k, {**(out.levels or {}), **v} if k == "levels" else v)
        return out


class Callback:
    """Hook points. Each receives the trainer; it reads it, and asks for changes by returning
    ``Decisions`` from ``on_step_end``, ``on_oom`` and ``on_epoch_end`` (None: no change)."""

    def on_setup(self, trainer: "Trainer") -> None: ...
    def on_grads_ready(self, trainer: "Trainer", n_examples: int) -> None: ...
    def on_step_end(self, trainer: "Trainer", step: "StepInfo") -> "Decisions | None": ...
    def on_oom(self, trainer: "Trainer", micro_batch: int) -> "Decisions | None": ...
    def on_epoch_end(self, trainer: "Trainer", metrics: dict) -> "Decisions | None": ...
    def on_fit_end(self, trainer: "Trainer", summary: dict) -> None: ...
    def state_dict(self) -> dict: return {}
    def load_state_dict(self, state: dict) -> None: ...


@dataclass
class StepInfo:
    step: int  # optimizer updates so far (this one included; skipped ones too)
    n_examples: int
    skipped: bool | None  # None: deferred_skip, known at the next step
    scaler_used: bool
