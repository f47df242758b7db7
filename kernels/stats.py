"""One-launch gradient statistics over many tensors (paper §3.1's variance, and the inf check).

For every tensor, in one launch and reading each tensor where it lies:

    sum_i = sum_j g_ij,   sumsq_i = sum_j g_ij^2,   nonfinite_i = #{j : g_ij not finite}

(non-finite values are left out of the sums). Mean and variance follow on the host or device:
var = sumsq/n - (sum/n)^2. One program per block of ``BLOCK`` values; partial results are
combined with float32 atomics (summation order therefore varies in the last bits).
fp32, bf16 and fp16 inputs; accumulation in fp32.
Reference: ``triaccel.kernels.reference.grad_stats_ref``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from triaccel.kernels._table import block_table

BLOCK = 4096  # values per load
# Loads per program (a program covers BLOCK * ITERS values, then makes 3 atomics). Measured on
# the H200 (bench/results/h200_kernels.json): ITERS=1 was best for ResNet-18's 11.2 M values
# (36 us against 47 us at 4), ITERS=8 for 112 M values (197 us against 240 us at 1).
ITERS_SMALL, ITERS_LARGE, LARGE = 1, 8, 50_000_000

_TL = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit
def _grad_stats_kernel(table_ptr, out_ptr, DTYPE: tl.constexpr, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    row = table_ptr + pid * 5
    ptr = tl.load(row).to(tl.pointer_type(DTYPE))
    start = tl.load(row + 1)
    n = tl.load(row + 2)
    seg = tl.load(row + 3)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK], dtype=tl.float32)
    bad = tl.zeros([BLOCK], dtype=tl.float32)
    for i in tl.static_range(ITERS):  # unrolled: the loads of all iterations can be in flight together
        offs = start + i * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)
        finite = (x == x) & (tl.abs(x) < float("inf"))
        xf = tl.where(finite, x, 0.0)
        acc += xf
        acc2 += xf * xf
        bad += tl.where(mask & (finite == 0), 1.0, 0.0)
    tl.atomic_add(out_ptr + seg * 3 + 0, tl.sum(acc, axis=0))
    tl.atomic_add(out_ptr + seg * 3 + 1, tl.sum(acc2, axis=0))
    tl.atomic_add(out_ptr + seg * 3 + 2, tl.sum(bad, axis=0))


def grad_stats_triton(tensors: list[torch.Tensor], out: torch.Tensor | None = None, block: int = BLOCK,
                      iters: int | None = None, num_warps: int = 8) -> torch.Tensor:
    """Triton version of ``grad_stats_ref``: float32 [n, 3] of (sum, sumsq, nonfinite)."""
    n = len(tensors)
    if iters is None:
        iters = ITERS_LARGE if sum(t.numel() for t in tensors) > LARGE else ITERS_SMALL
    dev = tensors[0].device if tensors else torch.device("cpu")
    if out is None:
        out = torch.zeros(n, 3, dtype=torch.float32, device=dev)
    else:
        out.zero_()
    by_dtype: dict = {}
    for i, t in enumerate(tensors):
        if t.dtype not in _TL:
            raise TypeError(f"grad_stats: unsupported dtype {t.dtype}")
        if not t.is_contiguous():
            raise ValueError("grad_stats: tensors must be contiguous")
        by_dtype.setdefault(t.dtype, []).append(i)
    for dt, idx in by_dtype.items():
        ts = [tensors[i] for i in idx]
        table = block_table([ts], block * iters)
        if table.shape[0] == 0:
            continue
        target = out if len(by_dtype) == 1 else torch.zeros(len(ts), 3, dtype=torch.float32, device=dev)
        _grad_stats_kernel[(table.shape[0],)](table, target, DTYPE=_TL[dt], BLOCK=block, ITERS=iters,
                                              num_warps=num_warps)
        if target is not out:  # several dtypes: one launch each, then scatter into place
            out[torch.tensor(idx, device=dev)] = target
    return out
