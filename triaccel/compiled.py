"""The training forward through ``torch.compile`` (``compile`` in the config).

Only the training step's forward is compiled (its backward follows through AOTAutograd);
evaluation and the curvature probes call the eager module, so neither the eval-mode switch nor
the probes' double backward (which compiled graphs do not support) reaches the compiler, and the
module itself is untouched (parameter names, state_dict keys and checkpoints stay the same).

``dynamic=False``: one compiled graph per micro-batch shape and precision plan, the compiled
counterpart of the captured step's one graph per (shape, plan); torch's recompile limit
(``torch._dynamo.config.recompile_limit``) caps them, past it a new shape runs eager (torch says
so once). A run starts from empty in-process caches (``torch.compiler.reset``); Inductor's
on-disk caches (``TORCHINDUCTOR_CACHE_DIR``) still serve a graph some earlier process compiled,
so a run's compile time is what it paid: about a minute for ResNet-18's first compile on a CPU,
a second or two when the disk cache serves it. It lands in the epochs that compile (the first,
which the score leaves out, and any epoch where a new batch size or precision plan appears) and
is reported apart (``compile_s``, from torch's own compile-time metrics: the forward's compile
and the backward's, which AOTAutograd compiles at the first backward) with ``compiled_graphs``
and ``graph_breaks`` (parts of the forward Dynamo could not trace run eager; the run says so in
one line). A compile that fails (an operator Inductor cannot lower, no C++ compiler on a CPU
machine) is one log line and the run goes on eager from the same examples: a window whose
compile may still fail (a shape or plan not yet compiled) snapshots the model's buffers first,
so BatchNorm's running statistics, which the compiled forward already updated before a
backward's compile failed, are put back before the eager retry updates them.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn


def __getattr__(name: str):
    """``CompileError``: torch's base of its compile errors (BackendCompilerFailed, InductorError,
    Unsupported), imported on first use: importing ``torch._dynamo`` costs about two seconds, paid
    by every trainer process (each search trial's worker) though only a compiled run needs it."""
    if name == "CompileError":
        from torch._dynamo.exc import TorchDynamoException

        return TorchDynamoException
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_compile_error(e: BaseException) -> bool:
    """Whether ``e`` is one of torch's compile errors, without importing torch's compiler: a run
    that compiled anything has imported it already (torch.compile does), so one that has not
    cannot be raising one."""
    import sys

    exc = sys.modules.get("torch._dynamo.exc")
    return exc is not None and isinstance(e, exc.TorchDynamoException)

# torch's compile-time metrics (seconds per phase): the whole forward compile (tracing, AOTAutograd,
# Inductor) and the backward's, which AOTAutograd compiles at the first backward
_COMPILE_PHASES = ("_compile.compile_inner", "compile_fx.<locals>.bw_compiler")


def _compile_seconds() -> float:
    try:
        from torch._dynamo.utils import compilation_time_metrics as m
    except ImportError:  # pragma: no cover
        return 0.0
    return float(sum(sum(m.get(k, ())) for k in _COMPILE_PHASES))


def _graph_breaks() -> tuple[int, str]:
    """Graph breaks so far in this process, and the first reason torch recorded."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # pragma: no cover
        return 0, ""
    breaks = counters["graph_break"]
    return int(sum(breaks.values())), next(iter(breaks), "")


def _graphs_compiled() -> int:
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # pragma: no cover
        return 0
    return int(counters["stats"]["unique_graphs"])


def _cache_hint(message: str) -> str:
    """When the error names a file in Inductor's on-disk cache: a compile killed mid-write (a timeout,
    Ctrl-C) can leave a truncated file there that every later compile trips on (e.g. 'main.so: file
    too short'), so say which folder to remove."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
        folder = cache_dir()
    except Exception:  # noqa: BLE001 -- a hint only
        return ""
    # a file that is there but cannot be loaded: not a compiler error (whose command line names the cache too)
    broken = ("file too short", "invalid ELF header", "cannot open shared object", "EOFError", "Ran out of input",
              "unpickling", "truncated")
    if folder and folder in message and any(b in message for b in broken):
        return f"; the error names Inductor's cache {folder}: a compile killed mid-write can leave a broken " \
               f"file there, remove that folder (or set TORCHINDUCTOR_CACHE_DIR) and run again"
    return ""


class CompiledForward:
    """``model``'s forward compiled with ``mode``; calls it, or the eager module once disabled."""

    def __init__(self, model: nn.Module, mode: str, log: Callable = print):
        self.model = model
        self.mode = mode
        self.log = log
        torch.compiler.reset()  # this run compiles its own graphs (an earlier run's are not its cost)
        self.fn = torch.compile(model, mode=mode, dynamic=False)
        self.disabled: str | None = None
        self._graphs0 = _graphs_compiled()
        self._seconds0 = _compile_seconds()
        self._breaks0 = _graph_breaks()[0]
        self._breaks_said = False
        self._windows: set = set()  # windows (shapes, plan) whose compile has succeeded

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.disabled is not None:
            return self.model(x)
        return self.fn(x)

    def before_window(self, key) -> list[torch.Tensor] | None:
        """A copy of the model's buffers when this window (its micro-batch shapes and plan) may still
        compile, hence fail; None once it has run compiled, or when compile is off."""
        if self.disabled is not None or key in self._windows:
            return None
        return [b.detach().clone() for b in self.model.buffers()]

    def after_window(self, key) -> None:
        if self.disabled is None:
            self._windows.add(key)

    def fail(self, e: BaseException, buffers: list[torch.Tensor] | None = None) -> None:
        """A compile failed: the model's buffers go back to ``buffers`` (taken before the window), and
        the rest of the run is eager, saying why in one line."""
        if buffers is not None:
            with torch.no_grad():
                for b, saved in zip(self.model.buffers(), buffers):
                    b.copy_(saved)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        self.disabled = f"{type(e).__name__}: {first}"[:200]
        self.log(f"[compile] torch.compile({self.mode}) failed ({self.disabled}): the run goes on eager"
                 + _cache_hint(str(e)))

    def seconds(self) -> float:
        """This run's compile seconds so far."""
        return _compile_seconds() - self._seconds0

    def stats(self) -> dict:
        breaks, why = _graph_breaks()
        breaks -= self._breaks0
        if breaks and not self._breaks_said:
            self._breaks_said = True
            self.log(f"[compile] {breaks} graph break{'s' if breaks > 1 else ''} (the first: {why[:160]}): those "
                     f"parts of the forward run eager")
        return {"compiled_graphs": _graphs_compiled() - self._graphs0,
                "compile_s": self.seconds(),
                "graph_breaks": breaks,
                "compile_disabled": int(self.disabled is not None)}
