"""Triton kernels, each beside a plain-torch reference (importable as triaccel.kernels).

- ``variance_ema``: §3.1's variance EMA (plus non-finite counts and the Fisher accumulator)
  from those sums, one launch (``variance_ema_triton`` / ``reference.variance_ema_ref``).
- ``grad_stats``: per-tensor sum, sum of squares and non-finite count of many tensors in one
  launch (``grad_stats_triton`` / ``reference.grad_stats_ref``).
- ``augment.gather_augment_triton``: a batch gathered from the resident uint8 dataset, padded,
  cropped, flipped and normalised in one launch (``reference.gather_augment_ref``).
- ``FusedSGD`` / ``FusedAdamW``: one-launch optimizer steps with a per-layer lr array, the
  GradScaler's unscale and inf-skip fused in (``reference.sgd_step_ref`` / ``adamw_step_ref``).

``grad_stats(tensors)`` picks Triton on CUDA (or under TRITON_INTERPRET=1) and the reference
elsewhere; the results agree within the tolerances in tests/test_kernels.py.
"""
from __future__ import annotations

import torch

from triaccel.kernels.reference import adamw_step_ref, grad_stats_ref, sgd_step_ref, variance_ema_ref


def _triton(backend: str, device: torch.device) -> bool:
    from triaccel.kernels.fused_optim import triton_usable

    return backend == "triton" or (backend == "auto" and triton_usable(device))


def grad_stats(tensors: list[torch.Tensor], backend: str = "auto", segments: list[int] | None = None,
               n_segments: int | None = None) -> torch.Tensor:
    if not tensors:
        return torch.zeros(n_segments or 0, 3)
    if not _triton(backend, tensors[0].device):
        return grad_stats_ref(tensors, segments, n_segments)
    from triaccel.kernels.stats import grad_stats_triton

    return grad_stats_triton(tensors, segments=segments, n_segments=n_segments)


def variance_ema(stats, numel, ema, nonfinite, fisher_acc, beta: float, n_examples: int,
                 backend: str = "auto") -> None:
    """In place: variance EMA, non-finite counts and Fisher accumulator from per-layer statistics."""
    if not _triton(backend, stats.device):
        return variance_ema_ref(stats, numel, ema, nonfinite, fisher_acc, beta, n_examples)
    from triaccel.kernels.stats import variance_ema_triton

    variance_ema_triton(stats, numel, ema, nonfinite, fisher_acc, beta, n_examples)


def __getattr__(name):  # Triton is imported only when a fused optimizer is asked for
    if name in ("FusedSGD", "FusedAdamW"):
        from triaccel.kernels import fused_optim

        return getattr(fused_optim, name)
    raise AttributeError(name)


__all__ = ["grad_stats", "grad_stats_ref", "variance_ema", "variance_ema_ref", "sgd_step_ref", "adamw_step_ref",
           "FusedSGD", "FusedAdamW"]
