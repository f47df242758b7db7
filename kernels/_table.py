"""Block tables: how one kernel launch reads many tensors where they lie (no concatenated copy).

Each row describes one program's block: the tensors' addresses, the block's start inside the
tensor, the tensor's length and its segment (tensor index). Built once with numpy and kept on
the device. Gradients move: the training loop sets them to None between steps, as static AMP
does, and the caching allocator does not hand them back at the same addresses (profiled on an
H200: a table rebuilt every step costs ~1.8 ms of host time, a fifth of a B=96 step). So columns
named ``dynamic`` are refreshed in place instead: their n addresses (8 bytes each) travel from
a small pinned ring without blocking the host and are spread over the table's rows by one
gather on the device, in stream order before the launch that reads them.
"""
from __future__ import annotations

import numpy as np
import torch

_CACHE: dict = {}
_RING = 4  # pinned staging slots per table: a slot is rewritten only after its copy has run


class BlockTable:
    def __init__(self, groups: list[list[torch.Tensor]], block: int, extra: list[int] | None = None,
                 dynamic: tuple[int, ...] = ()):
        first = groups[0]
        numels = np.array([t.numel() for t in first], dtype=np.int64)
        nblk = (numels + block - 1) // block
        seg = np.repeat(np.arange(len(first), dtype=np.int64), nblk)
        start = (np.arange(len(seg), dtype=np.int64) - np.repeat(np.cumsum(nblk) - nblk, nblk)) * block
        cols = [np.repeat(np.array([t.data_ptr() for t in g], dtype=np.int64), nblk) for g in groups]
        ex = np.repeat(np.array(extra if extra is not None else [0] * len(first), dtype=np.int64), nblk)
        table = np.stack(cols + [start, numels[seg], seg, ex], axis=1) if len(seg) else \
            np.zeros((0, len(groups) + 4), np.int64)
        t = torch.from_numpy(np.ascontiguousarray(table))
        self.device = first[0].device if first else torch.device("cpu")
        self.cuda = self.device.type == "cuda"
        if self.cuda:  # the caching host allocator keeps the pinned block until the copy ran
            t = t.pin_memory().to(self.device, non_blocking=True)
        self.table = t
        self.dynamic = tuple(dynamic)
        self.last = {c: tuple(t.data_ptr() for t in groups[c]) for c in self.dynamic}
        self.uploads = 0
        if self.dynamic:
            self.seg = torch.from_numpy(seg).to(self.device)
            n = len(first)
            if self.cuda:
                self.ring = [torch.empty(n, dtype=torch.int64, pin_memory=True) for _ in range(_RING)]
                self.events: list[torch.cuda.Event | None] = [None] * _RING
                self.slot = 0
                self.ptrs = torch.empty(n, dtype=torch.int64, device=self.device)

    def update(self, col: int, tensors: list[torch.Tensor]) -> torch.Tensor:
        """The table, with column ``col`` (one of ``dynamic``) pointing at ``tensors``."""
        ptrs = tuple(t.data_ptr() for t in tensors)
        if ptrs == self.last[col]:
            return self.table
        if self.cuda:
            i = self.slot
            self.slot = (i + 1) % _RING
            if self.events[i] is not None:
                self.events[i].synchronize()  # long done in a running loop: a slot is reused 4 updates later
            self.ring[i].numpy()[:] = ptrs
            self.ptrs.copy_(self.ring[i], non_blocking=True)
            ev = self.events[i] or torch.cuda.Event()
            ev.record()
            self.events[i] = ev
            self.table[:, col] = self.ptrs[self.seg]
        else:
            self.table[:, col] = torch.tensor(ptrs, dtype=torch.int64)[self.seg]
        self.last[col] = ptrs
        self.uploads += 1
        return self.table


def block_table(groups: list[list[torch.Tensor]], block: int, extra: list[int] | None = None,
                dynamic: tuple[int, ...] = ()) -> torch.Tensor:
    """Rows [addr_0, ..., addr_{k-1}, start, numel, seg, extra] for tensors zipped across ``groups``.

    Cached by the static groups' addresses, the sizes and ``extra``; the ``dynamic`` groups'
    addresses are refreshed in place (``BlockTable.update``)."""
    first = groups[0]
    key = (block, tuple(None if gi in dynamic else tuple(t.data_ptr() for t in g) for gi, g in enumerate(groups)),
           tuple(t.numel() for t in first), tuple(extra or ()), first[0].device if first else None, tuple(dynamic))
    entry = _CACHE.get(key)
    if entry is None:
        if len(_CACHE) > 64:
            _CACHE.clear()
        entry = _CACHE[key] = BlockTable(groups, block, extra, dynamic)
    for c in dynamic:
        entry.update(c, groups[c])
    return entry.table
