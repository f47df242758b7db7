"""Block tables: how one kernel launch reads many tensors where they lie (no concatenated copy).

Each row describes one program's block: the tensors' addresses, the block's start inside the
tensor, the tensor's length and its segment (tensor index). Built once with numpy and cached
by the tensors' addresses and sizes, so a training loop whose buffers stay put (gradients
zeroed in place, not set to None) pays for it once.
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
    t = torch.from_numpy(np.ascontiguousarray(table)).to(first[0].device if first else "cpu")
    if len(_CACHE) > 64:
        _CACHE.clear()
    _CACHE[key] = t
    return t
