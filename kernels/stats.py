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
from triaccel.kernels.reference import segment_rows

BLOCK = 1024  # values per load (4 warps: 8 per thread)
# Loads per program, in a loop (a program covers BLOCK * ITERS values, then makes 3 atomics).
# Swept on an H200 (bench/results/kernels/h200_kernels.json, 13 launch shapes, two runs): on 112 M
# values a 1024 x 16 loop is best in both (130-132 us, 82-84 % of copy bandwidth; an unrolled
# 4096 x 8: 242-245 us); on ResNet-18's 11.2 M values one call is bound by the host's launch
# (the order of the shapes differs between the runs), and a 1024 x 4 loop takes 24 us of GPU time
# (CUDA graph) against 31 us for torch._foreach_norm; fewer iterations keep enough programs to
# fill the GPU when the model is small.
ITERS_SMALL, ITERS_LARGE, LARGE = 4, 16, 50_000_000

def _dense(t: torch.Tensor) -> bool:
    """Every element in one block of memory, each once (any order): sums may read it flat.
    channels_last weights and their gradients are dense without being contiguous."""
    return t.is_contiguous() or (t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)) or \
        (t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d))


_TL = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit
def _accumulate(ptr, offs, n, acc, acc2, bad):
    mask = offs < n
    x = tl.load(ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    finite = (x == x) & (tl.abs(x) < float("inf"))
    xf = tl.where(finite, x, 0.0)
    return acc + xf, acc2 + xf * xf, bad + tl.where(mask & (finite == 0), 1.0, 0.0)


@triton.jit
def _grad_stats_kernel(table_ptr, out_ptr, DTYPE: tl.constexpr, BLOCK: tl.constexpr, ITERS: tl.constexpr,
                       UNROLL: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    row = table_ptr + pid * 5
    ptr = tl.load(row).to(tl.pointer_type(DTYPE))
    start = tl.load(row + 1)
    n = tl.load(row + 2)
    # output row: the tensor's own, or its group's (segments). Spreading a big tensor's atomics
    # over several copies of its row measures no faster on an H200 (1024 x 16 loop,
    # 112 M values: 137 us with 8 copies vs 132 us with one): the atomics are not the bottleneck.
    seg = tl.load(row + 4)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK], dtype=tl.float32)
    bad = tl.zeros([BLOCK], dtype=tl.float32)
    base = start + tl.arange(0, BLOCK)
    if UNROLL:  # all loads of the program in flight together (more registers, fewer programs per SM)
        for i in tl.static_range(ITERS):
            acc, acc2, bad = _accumulate(ptr, base + i * BLOCK, n, acc, acc2, bad)
    else:  # a loop: fewer registers, more programs resident per SM
        for i in tl.range(0, ITERS):
            acc, acc2, bad = _accumulate(ptr, base + i * BLOCK, n, acc, acc2, bad)
    tl.atomic_add(out_ptr + seg * 3 + 0, tl.sum(acc, axis=0), sem="relaxed")
    tl.atomic_add(out_ptr + seg * 3 + 1, tl.sum(acc2, axis=0), sem="relaxed")
    tl.atomic_add(out_ptr + seg * 3 + 2, tl.sum(bad, axis=0), sem="relaxed")


def grad_stats_triton(tensors: list[torch.Tensor], out: torch.Tensor | None = None, block: int | None = None,
                      iters: int | None = None, num_warps: int = 4, unroll: bool = False,
                      segments: list[int] | None = None, n_segments: int | None = None) -> torch.Tensor:
    """Triton version of ``grad_stats_ref``: float32 [n, 3] of (sum, sumsq, nonfinite).

    ``segments[i]`` sends tensor i's sums to output row ``segments[i]`` (rows summed, e.g. one
    row per layer); default one row per tensor. One launch per gradient dtype, all into ``out``.
    """
    n = len(tensors)
    if block is None:
        block = BLOCK
    if iters is None:
        iters = ITERS_LARGE if sum(t.numel() for t in tensors) > LARGE else ITERS_SMALL
    dev = tensors[0].device if tensors else torch.device("cpu")
    rows, n_out = segment_rows(n, segments, n_segments)
    if out is None:
        out = torch.zeros(n_out, 3, dtype=torch.float32, device=dev)
    else:
        out.zero_()
    by_dtype: dict = {}
    for i, t in enumerate(tensors):
        if t.dtype not in _TL:
            raise TypeError(f"grad_stats: unsupported dtype {t.dtype}")
        if not _dense(t):
            raise ValueError("grad_stats: tensors must be dense (contiguous in some memory format)")
        by_dtype.setdefault(t.dtype, []).append(i)
    for dt, idx in by_dtype.items():
        table = block_table([[tensors[i] for i in idx]], block * iters, extra=[rows[i] for i in idx], dynamic=(0,))
        if table.shape[0] == 0:
            continue
        _grad_stats_kernel[(table.shape[0],)](table, out, DTYPE=_TL[dt], BLOCK=block, ITERS=iters,
                                              UNROLL=unroll, num_warps=num_warps)
    return out


@triton.jit
def _variance_ema_kernel(stats_ptr, numel_ptr, ema_ptr, nonfinite_ptr, fisher_ptr, G, beta, n_examples,
                         BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < G
    s = tl.load(stats_ptr + offs * 3, mask=m, other=0.0)
    ss = tl.load(stats_ptr + offs * 3 + 1, mask=m, other=0.0)
    bad = tl.load(stats_ptr + offs * 3 + 2, mask=m, other=0.0)
    n = tl.load(numel_ptr + offs, mask=m, other=1.0)
    mean = s / n
    var = tl.maximum(ss / n - mean * mean, 0.0)
    ema = tl.load(ema_ptr + offs, mask=m, other=0.0)
    tl.store(ema_ptr + offs, beta * ema + (1.0 - beta) * var, mask=m)
    tl.store(nonfinite_ptr + offs, tl.load(nonfinite_ptr + offs, mask=m, other=0.0) + bad, mask=m)
    tl.store(fisher_ptr + offs, tl.load(fisher_ptr + offs, mask=m, other=0.0) + ss * n_examples, mask=m)


def variance_ema_triton(stats: torch.Tensor, numel: torch.Tensor, ema: torch.Tensor, nonfinite: torch.Tensor,
                        fisher_acc: torch.Tensor, beta: float, n_examples: int) -> None:
    """Triton version of ``variance_ema_ref`` (one launch, in place)."""
    G = stats.shape[0]
    _variance_ema_kernel[(1,)](stats, numel, ema, nonfinite, fisher_acc, G, float(beta), float(n_examples),
                               BLOCK=max(16, triton.next_power_of_2(G)), num_warps=1)
