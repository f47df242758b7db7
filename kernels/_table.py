"""Block tables: how one kernel launch reads many tensors where they lie (no concatenated copy).

Each row describes one program's block: the tensors' addresses, the block's start inside the
tensor, the tensor's length and its segment (tensor index). Built once with numpy and cached
by the tensors' addresses and sizes: a training loop gets its gradients from the caching
allocator at the same addresses step after step, and pays for a table once per address set.
A new table travels from pinned memory without blocking the host (a pageable copy would wait
for the GPU to drain the stream).
"""
from __future__ import annotations

import numpy as np
import torch

_CACHE: dict = {}


def block_table(groups: list[list[torch.Tensor]], block: int, extra: list[int] | None = None) -> torch.Tensor:
    """Rows [addr_0, ..., addr_{k-1}, start, numel, seg, extra] for tensors zipped across ``groups``."""
    first = groups[0]
    key = (block, tuple(tuple(t.data_ptr() for t in g) for g in groups), tuple(t.numel() for t in first),
           tuple(extra or ()), first[0].device if first else None)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    numels = np.array([t.numel() for t in first], dtype=np.int64)
    nblk = (numels + block - 1) // block
    seg = np.repeat(np.arange(len(first), dtype=np.int64), nblk)
    start = (np.arange(len(seg), dtype=np.int64) - np.repeat(np.cumsum(nblk) - nblk, nblk)) * block
    cols = [np.repeat(np.array([t.data_ptr() for t in g], dtype=np.int64), nblk) for g in groups]
    ex = np.repeat(np.array(extra if extra is not None else [0] * len(first), dtype=np.int64), nblk)
    table = np.stack(cols + [start, numels[seg], seg, ex], axis=1) if len(seg) else np.zeros((0, len(groups) + 4), np.int64)
    t = torch.from_numpy(np.ascontiguousarray(table))
    dev = first[0].device if first else torch.device("cpu")
    if dev.type == "cuda":  # the caching host allocator keeps the pinned block until the copy ran
        t = t.pin_memory().to(dev, non_blocking=True)
    if len(_CACHE) > 64:
        _CACHE.clear()
    _CACHE[key] = t
    return t
