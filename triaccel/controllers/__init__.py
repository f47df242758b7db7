"""The three Tri-Accel controllers (paper §3): small pure classes, one decision method each.

No model, no CUDA inside: they take statistics as plain numbers and return a frozen
decision; the control loop (``triaccel.control``) gathers the statistics and applies the
decisions. Step and window counts are passed in explicitly; ``state_dict`` round-trips.
"""
from triaccel.controllers.batch import BatchController, BatchDecision
from triaccel.controllers.curvature import CurvatureController, CurvatureDecision
from triaccel.controllers.precision import PrecisionController, PrecisionDecision

__all__ = ["BatchController", "BatchDecision", "CurvatureController", "CurvatureDecision",
           "PrecisionController", "PrecisionDecision"]
