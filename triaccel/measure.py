"""Measurement hygiene in one place: synchronised timing, medians over repeats, memory peaks.

- ``sync(device)``: wait for queued device work, so a wall clock measures work and not submission.
- ``MemoryMeter``: peak memory per interval with nested intervals (an epoch contains many
  control windows): reading a window's peak folds it into the epoch's before the allocator's
  counter is reset, so neither reset hides the other's peak.
  On CUDA the figure is the caching allocator's ``max_memory_allocated`` (live tensors, not the
  cache, not the CUDA context); minus the bytes of the resident dataset, which a host pipeline
  would keep on the host, and minus what the process held before the run began (another run's
  tensors in the same process). On CPU there is no allocator counter, so the meter counts what
  training holds: parameters, gradients, optimizer state, and the bytes autograd saves for
  backward (deduplicated by storage), the part that grows with the batch. It is labelled
  ``source`` so nobody mistakes one for the other.
- ``bench(fn, ...)``: warm-up, synchronised repeats, median and spread.
"""
from __future__ import annotations

import gc
import statistics
import time
from contextlib import contextmanager

import torch


def free_device(device: torch.device | None = None) -> None:
    """Collect Python's garbage and hand the caching allocator's free blocks back to the device:
    after an out-of-memory step (the retry then finds the memory the failed one held) and between
    runs in one process (the next run's meter baseline starts from what is really held)."""
    gc.collect()
    if (device.type == "cuda") if device is not None else torch.cuda.is_available():
        torch.cuda.empty_cache()

GiB = float(2**30)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class MemoryMeter:
    def __init__(self, device: torch.device, baseline_bytes: int = 0):
        self.device = device
        self.cuda = device.type == "cuda"
        self.source = "cuda_allocator" if self.cuda else "cpu_tensor_accounting"
        self.baseline = baseline_bytes  # bytes not counted (the resident dataset, earlier runs' tensors)
        self._epoch_peak = 0
        self._persistent = 0  # CPU: params + grads + optimizer state
        self._saved = 0  # CPU: bytes saved for backward in the current forward
        self._saved_peak = 0
        self._seen: set = set()
        self._reserved_epoch_peak = 0
        # CUDA: bytes held outside the allocator's live-tensor count that training still needs,
        # added to every peak: the CUDA graphs' memory pool (a replay allocates nothing).
        self.extra_bytes = 0
        self._held = 0  # a peak kept across an interval the counter must not see (hold())

    # -- CPU accounting ------------------------------------------------------------------
    def set_persistent(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        n = sum(p.numel() * p.element_size() * (2 if p.requires_grad else 1) for p in model.parameters())
        n += sum(b.numel() * b.element_size() for b in model.buffers())
        if optimizer is not None:
            for st in optimizer.state.values():
                n += sum(v.numel() * v.element_size() for v in st.values() if torch.is_tensor(v))
        self._persistent = n

    @contextmanager
    def track_forward(self):
        """CPU: count bytes autograd saves during this forward (no-op on CUDA)."""
        if self.cuda:
            yield
            return
        self._saved, self._seen = 0, set()

        def pack(t):
            try:
                key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
            except RuntimeError:
                key = (id(t), t.numel())
            if key not in self._seen:
                self._seen.add(key)
                self._saved += key[1]
                self._saved_peak = max(self._saved_peak, self._saved)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield

    @contextmanager
    def hold(self):
        """CUDA: the peak so far is kept, and what is allocated inside the block does not count
        (a CUDA graph recording allocates in the graph's pool, counted through extra_bytes)."""
        self._held = max(self._held, self._current_peak())
        try:
            yield
        finally:
            if self.cuda:
                torch.cuda.reset_peak_memory_stats(self.device)

    # -- intervals ---------------------------------------------------------------------
    def _current_peak(self) -> int:
        if self.cuda:
            live = max(0, torch.cuda.max_memory_allocated(self.device) - self.baseline) + self.extra_bytes
            return max(live, self._held)
        return self._persistent + self._saved_peak

    def window_peak_bytes(self, reset: bool = True) -> int:
        """Peak since the last window reset; folds it into the epoch peak, then resets."""
        peak = self._current_peak()
        self._epoch_peak = max(self._epoch_peak, peak)
        if self.cuda:
            self._reserved_epoch_peak = max(self._reserved_epoch_peak, torch.cuda.max_memory_reserved(self.device))
        if reset:
            self._reset_counter()
        return peak

    def start_epoch(self) -> None:
        self._epoch_peak = 0
        self._reserved_epoch_peak = 0
        self._reset_counter()

    def epoch_peaks(self) -> dict:
        alloc = max(self._epoch_peak, self._current_peak())
        out = {"peak_mem_gib": alloc / GiB, "mem_source": self.source}
        if self.cuda:
            reserved = max(self._reserved_epoch_peak, torch.cuda.max_memory_reserved(self.device))
            out["peak_reserved_gib"] = reserved / GiB
            out["peak_alloc_raw_gib"] = (alloc + self.baseline - self.extra_bytes) / GiB
        return out

    def _reset_counter(self) -> None:
        self._held = 0
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._saved_peak = 0

    def capacity_bytes(self) -> int | None:
        """Total device memory (None on CPU)."""
        if self.cuda:
            return torch.cuda.get_device_properties(self.device).total_memory
        return None


def device_used_fraction(device: torch.device) -> float | None:
    """Whole-device memory in use (all processes) from NVML; None where NVML is unavailable."""
    if device.type != "cuda":
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        info = pynvml.nvmlDeviceGetMemoryInfo(h)
        return info.used / info.total
    except Exception:
        return None


def bench(fn, device: torch.device, *, warmup: int = 3, repeats: int = 10, inner: int = 1) -> dict:
    """Median and mean±std of ``fn`` wall time (seconds per call) after warm-up, synchronised."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        sync(device)
        times.append((time.perf_counter() - t0) / inner)
    return {"median_s": statistics.median(times), "mean_s": statistics.fmean(times),
            "std_s": statistics.stdev(times) if len(times) > 1 else 0.0, "repeats": repeats}
