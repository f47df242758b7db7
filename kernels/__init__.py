"""Triton kernels, each beside a plain-torch reference (importable as triaccel.kernels).

- ``grad_stats``: per-tensor sum, sum of squares and non-finite count of many tensors in one
  launch (``grad_stats_triton`` / ``reference.grad_stats_ref``).
- ``FusedSGD`` / ``FusedAdamW``: one-launch optimizer steps with a per-layer lr array, the
  GradScaler's unscale and inf-skip fused in (``reference.sgd_step_ref`` / ``adamw_step_ref``).

``grad_stats(tensors)`` picks Triton on CUDA (or under TRITON_INTERPRET=1) and the reference
elsewhere; the results agree within the tolerances in tests/test_kernels.py.
"""
from __future__ import annotations

import torch

from triaccel.kernels.reference import adamw_step_ref, grad_stats_ref, sgd_step_ref


def grad_stats(tensors: list[torch.Tensor], backend: str = "auto") -> torch.Tensor:
    from triaccel.kernels.fused_optim import triton_usable

    if not tensors:
        return torch.zeros(0, 3)
    if backend == "torch" or (backend == "auto" and not triton_usable(tensors[0].device)):
        return grad_stats_ref(tensors)
    from triaccel.kernels.stats import grad_stats_triton

    return grad_stats_triton(tensors)


def __getattr__(name):  # Triton is imported only when a fused optimizer is asked for
    if name in ("FusedSGD", "FusedAdamW"):
        from triaccel.kernels import fused_optim

        return getattr(fused_optim, name)
    raise AttributeError(name)


__all__ = ["grad_stats", "grad_stats_ref", "sgd_step_ref", "adamw_step_ref", "FusedSGD", "FusedAdamW"]
