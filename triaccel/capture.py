"""A captured micro-batch: forward, loss and backward replayed as one CUDA graph.

Most of an eager ResNet-18 step is the host issuing ~300 kernels (an H200 is busy 3.0 ms of
a 9.9 ms step at B=96). A CUDA graph issues them in one launch.
What is captured is the trainer's own micro-batch function, unchanged: the autocast region
of the current precision plan, the summed cross-entropy, the division by the window's
example count n (a device scalar, so a window of any size replays the same graph) and by the GradScaler's scale (a
device tensor updated in place), and the backward, which adds into gradient buffers that
live outside the graph (``zero_grad(set_to_none=False)``): eager and replayed micro-batches
accumulate into the same buffers, so accumulation, the statistics kernels and the optimizer
see one set of gradients whatever ran.

Everything else stays eager: batch assembly, unscale, the statistics kernels, clipping, the
optimizer, the curvature probes. They are few launches each.

One graph per key (micro-batch shape, precision plan, scaler on/off); all graphs share one
memory pool (they never run concurrently, and nothing a graph leaves behind is read after
another one replays: the loss is read at once, the gradients are outside the pool), so the
pool is about one micro-batch's activations, as eager training needs. A key is captured on
its second occurrence (the first runs eager: it warms up cuDNN's autotuner and cuBLAS, which
must not run inside a capture; its activations are allocated outside the pool, and the memory
peak of that interval says so),
at most ``cap`` graphs live at once (least recently used dropped), and a capture that fails
switches capture off for the run with one log line; training goes on eager.

When the trainer's batch or micro-batch changes, or cuDNN autotuning is switched, every graph
is dropped and the pool released (``reset``): a shared pool keeps the largest working set any
of its graphs ever needed: without the reset, a memory-elastic batch that explored 328 and settled
at 192 would keep 328's activations in the pool (an H200: 1.17 GiB of pool against 0.26 at B=96,
and the score's peak with it), and a size measured after a larger one would be charged the larger
one's memory. Recording again costs one eager micro-batch and a few milliseconds per shape.

Gradients of a window's first micro-batch (``fresh``): when the window starts with a full
micro-batch, its graph is recorded with every gradient unset, so the backward writes the
gradients into the pool instead of adding into zeroed buffers (autograd's accumulation launches
one add per parameter: 62 for ResNet-18, 114 us of a 2.4 ms B=96 step on an H200, plus the
zeroing launch). Those pool tensors become the parameters' ``.grad`` and every replay overwrites
them: nothing is zeroed. The window's later micro-batches, a short last batch and eager runs add
into the same tensors as before (zeroed first). Recording a fresh graph drops every live graph
(they were recorded against the gradients it replaces, whose memory the pool may reuse), so one
set of gradients exists; a reset or the end of the run unsets the gradients, so the old pool
goes back whole.

Memory is reported honestly: a replay allocates nothing, so the allocator's peak does not
see the activations. The pool's bytes not held by live tensors (the allocator's snapshot
names each segment's pool) are added to every peak while graphs live (``extra_bytes``): that
is what the device holds for them. Recording allocates inside the pool, so the meter holds
its peak across a recording instead of counting those bytes twice.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from contextlib import nullcontext
from typing import Callable

import torch


class _Graph:
    __slots__ = ("graph", "x", "y", "n", "loss", "grads")

    def __init__(self, graph, x, y, n, loss, grads=None):
        self.graph, self.x, self.y, self.n, self.loss = graph, x, y, n, loss
        self.grads = grads  # fresh graphs: the gradient tensors each replay writes (in the pool)


class StepGraphs:
    def __init__(self, device: torch.device, cap: int = 8, warmup: int = 1, log: Callable = print, meter=None,
                 params: list | None = None, zero: Callable[[], None] | None = None, compiled: bool = False):
        self.device = device
        # the body runs a torch.compile'd forward: a new key (a new plan) may recompile, which must
        # not happen inside a recording (torch refuses: "cannot JIT compile during CUDA graph capture")
        self.compiled = compiled
        # fresh gradients (see above) need the parameters and a way to zero their gradients in place
        self.params = [p for p in (params or []) if p.requires_grad]
        self.zero = zero
        self.fresh_grads = bool(self.params) and zero is not None
        self.owner: _Graph | None = None  # the fresh graph whose tensors are the parameters' .grad now
        self.meter = meter  # a MemoryMeter: its extra_bytes follows the pool
        self.cap = cap
        self.warmup = warmup
        self.log = log
        self.graphs: OrderedDict = OrderedDict()
        self.seen: dict = {}
        self.shapes: set = set()  # micro-batch shapes recorded so far
        self.pool = torch.cuda.graph_pool_handle()
        self.captures = 0  # graphs recorded in this run (a dropped and re-recorded key counts twice)
        self.keys: set = set()  # distinct keys recorded in this run: bounded by buckets x plans (batch_buckets)
        self.replays = 0
        self.evictions = 0  # graphs dropped past the cap (least recently used first)
        self.resets = 0  # times every graph was dropped and the pool released (batch or autotuning changed)
        self.eager = 0  # micro-batches that ran eager (warm-up occurrences, keys past a failure)
        self.capture_s = 0.0  # time spent recording, reported apart from the step times
        self.extra_bytes = 0  # pool bytes not held by live tensors: added to the memory peaks
        self.disabled: str | None = None

    def stats(self) -> dict:
        return {"captures": self.captures, "graph_keys": len(self.keys), "graphs_live": len(self.graphs),
                "replays": self.replays,
                "graph_evictions": self.evictions, "graph_resets": self.resets,
                "eager_micro_batches": self.eager, "capture_s": self.capture_s,
                "graph_pool_gib": self.extra_bytes / 2**30}

    def run(self, key, x: torch.Tensor, y: torch.Tensor, n: float,
            body: Callable[[torch.Tensor, torch.Tensor, object], torch.Tensor], fresh: bool = False) -> torch.Tensor:
        """The micro-batch's summed loss (detached), from a replay when ``key`` has a graph,
        else from ``body`` run eager (and recorded once the key has been seen ``warmup`` times).

        ``fresh`` (only where ``fresh_grads``): the window's first micro-batch, whose gradients
        replace the parameters' instead of adding to them; the caller has not zeroed them."""
        fresh = fresh and self.fresh_grads
        if fresh:
            key = (*key, "fresh")
        if self.disabled is None:
            g = self.graphs.get(key)
            if g is None and self.seen.get(key, 0) >= self._warmup_for(key):
                g = self._capture(key, x, y, body, fresh)
            if g is not None:
                self.graphs.move_to_end(key)
                if fresh and (self.owner is not g or self.params[0].grad is not g.grads[0]):
                    self._own(g)  # also when something outside set the gradients anew (zero_grad(set_to_none))
                g.x.copy_(x)
                g.y.copy_(y)
                g.n.fill_(n)
                g.graph.replay()
                self.replays += 1
                return g.loss
            self.seen[key] = self.seen.get(key, 0) + 1
        if fresh:
            self.zero()  # eager: the backward adds into the gradients
        self.eager += 1
        return body(x, y, n)

    def _own(self, g: _Graph) -> None:
        """Point the parameters' .grad at a fresh graph's gradient tensors (the ones its replays write)."""
        for p, t in zip(self.params, g.grads):
            p.grad = t
        self.owner = g

    def _unset_grads(self) -> None:
        """Between steps (their gradients consumed): unset the gradients a fresh graph wrote, so
        its pool can go back whole; the next backward allocates them again."""
        if self.owner is not None:
            for p in self.params:
                p.grad = None
            self.owner = None

    def release(self) -> None:
        """Drop every graph at the end of a run (not counted as a reset): nothing may replay them
        once the run's cuBLAS workspaces are gone. Counters stay for the run's report."""
        self._unset_grads()
        self.graphs.clear()
        self.seen.clear()
        self.shapes.clear()
        self.extra_bytes = 0
        if self.meter is not None:
            self.meter.extra_bytes = 0

    def reset(self) -> None:
        """Drop every graph and release the pool: the shapes (or algorithms) recorded so far will
        not come back. The next occurrences of a shape run eager once, then record again."""
        if not self.graphs and not self.seen:
            return
        self.release()
        self.resets += 1
        if self.disabled is None:
            self._new_pool()

    def _new_pool(self) -> None:
        """A new pool for the next recordings; the old one's free blocks go back to the device."""
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        self.pool = torch.cuda.graph_pool_handle()

    def _warmup_for(self, key) -> int:
        """Eager occurrences before recording: cuDNN's autotuner runs kernels when it meets a new
        (shape, dtype), which a recording must not. With autotuning off (cudnn_benchmark: false, or
        the paper's batch rule before its plan settles), a new precision plan at a shape already
        recorded is recorded at once, with no eager micro-batch whose activations would sit beside
        the pool; with it on, that plan's new dtypes are tuned in eager occurrences first. A compiled forward always runs one
        eager occurrence first: its compile happens there, outside the recording."""
        if not torch.backends.cudnn.benchmark and key[0] in self.shapes and not self.compiled:
            return 0
        return self.warmup

    def _capture(self, key, x, y, body, fresh: bool = False) -> _Graph | None:
        torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        if fresh:
            # The new graph's gradients replace the parameters'. Every live graph adds into (or
            # writes) the old ones, whose memory is freed below and may be reused by the pool:
            # all are dropped (recorded again at their next occurrence), so one set of gradients
            # exists and nothing replays into freed memory.
            self.graphs.clear()
            self.owner = None
            for p in self.params:
                p.grad = None  # the backward below allocates them in the pool
            # and a new pool: the old one may still hold what no graph owns (cuBLAS's workspace for the
            # capture stream), and recording into a pool whose graphs are all gone trips the allocator's
            # use_count assert (torch 2.11; vllm#28426)
            self._new_pool()

        r0, a0 = torch.cuda.memory_reserved(self.device), torch.cuda.memory_allocated(self.device)
        sx, sy = x.clone(), y.clone()
        sn = torch.ones((), device=self.device)
        graph = torch.cuda.CUDAGraph()
        held = self.meter.hold() if self.meter is not None else nullcontext()
        stream = torch.cuda.current_stream(self.device)
        try:
            with held, torch.cuda.graph(graph, pool=self.pool):  # recording allocates in the pool: not a peak
                loss = body(sx, sy, sn)
        except Exception as e:  # noqa: BLE001 -- any failure: the run goes on eager, and says why
            self.disabled = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
            # torch.cuda.graph enters its capture stream before capture_begin, and an error there skips
            # its exit: without this the rest of the run would go on on that side stream
            torch.cuda.set_stream(stream)
            self.graphs.clear()
            self.owner = None
            if fresh:  # unset whatever the failed recording allocated: the eager micro-batch starts afresh
                for p in self.params:
                    p.grad = None
            self.log(f"[capture] recording the step failed ({self.disabled}): the run goes on eager")
            torch.cuda.synchronize(self.device)
            return None
        torch.cuda.synchronize(self.device)
        free = self._pool_free_bytes()
        if free is None:  # no per-pool figures: the reserved growth not held by live tensors
            r1, a1 = torch.cuda.memory_reserved(self.device), torch.cuda.memory_allocated(self.device)
            free = self.extra_bytes + max(0, (r1 - r0) - (a1 - a0))
        self.extra_bytes = free
        if self.meter is not None:
            self.meter.extra_bytes = self.extra_bytes
        grads = [p.grad for p in self.params] if fresh else None
        self.graphs[key] = g = _Graph(graph, sx, sy, sn, loss, grads)
        if fresh:
            self.owner = g
        self.shapes.add(key[0])
        self.keys.add(key)
        self.captures += 1
        if len(self.graphs) > self.cap:
            self.graphs.popitem(last=False)  # its pool blocks are reused by later recordings
            if not self.evictions:
                self.log(f"[capture] more than capture_cap ({self.cap}) shapes and plans: the least recently "
                         f"used graph is dropped and recorded again when needed")
            self.evictions += 1
        self.capture_s += time.perf_counter() - t0
        return g

    def _pool_free_bytes(self) -> int | None:
        """Bytes of the graphs' pool not held by live tensors (the allocator counts those), from
        the allocator's snapshot; None where the snapshot does not name pools."""
        try:
            segs = torch.cuda.memory_snapshot()
        except Exception:  # noqa: BLE001
            return None
        pool = tuple(self.pool)
        total = used = 0
        named = False
        for seg in segs:
            if "segment_pool_id" not in seg:
                continue
            named = True
            if tuple(seg["segment_pool_id"]) == pool:
                total += seg["total_size"]
                used += seg["allocated_size"]
        return total - used if named else None
