"""The three Tri-Accel controllers (paper §3): small pure classes, one decision method each.

No model, no CUDA inside: each takes the window's statistics (``WindowStats``, built once per
window by the control loop, ``triaccel.control``) and returns a frozen decision, which the loop
turns into ``Decisions`` for ``Trainer.apply``. ``state_dict`` round-trips.
"""
from __future__ import annotations

from typing import Protocol, TypeVar, runtime_checkable

from triaccel.controllers.batch import BatchController, BatchDecision, OomSplit, oom_split
from triaccel.controllers.curvature import CurvatureController, CurvatureDecision
from triaccel.controllers.precision import PlanBudget, PrecisionController, PrecisionDecision
from triaccel.controllers.stats import WindowStats

D = TypeVar("D", covariant=True)


@runtime_checkable
class Controller(Protocol[D]):
    """What the control loop calls on every controller: one decision per window, and its state."""

    def decide(self, stats: WindowStats) -> D: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, s: dict) -> None: ...


__all__ = ["BatchController", "BatchDecision", "Controller", "CurvatureController", "CurvatureDecision",
           "OomSplit", "PlanBudget", "PrecisionController", "PrecisionDecision", "WindowStats", "oom_split"]
