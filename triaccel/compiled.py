"""The training forward through ``torch.compile`` (``compile`` in the config).

Only the training step's forward is compiled (its backward follows through AOTAutograd);
evaluation and the curvature probes call the eager module, so neither the eval-mode switch nor
the probes' double backward (which compiled graphs do not support) reaches the compiler, and the
module itself is untouched (parameter names, state_dict keys and checkpoints stay the same).

``dynamic=False``: one compiled graph per micro-batch shape and precision plan, the compiled
counterpart of the captured step's one graph per (shape, plan); torch's recompile limit
(``torch._dynamo.config.recompile_limit``) caps them, past it a new shape runs eager (torch says
so once). A run starts from an empty compile cache (``torch.compiler.reset``): each run pays
its own compile in its first epochs, which the score's epoch time leaves out, and reports it
apart (``compile_s``, from torch's own compile-time metrics: the forward's and the backward's
compile) so that nothing is hidden. A compile that fails (an operator Inductor cannot lower, no
C++ compiler on a CPU machine) is one log line; the run goes on eager from the same examples.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

try:  # torch's compile errors (BackendCompilerFailed, InductorError, Unsupported) all derive from it
    from torch._dynamo.exc import TorchDynamoException as CompileError
except ImportError:  # pragma: no cover - every torch this project supports has it
    class CompileError(RuntimeError):
        pass

# torch's compile-time metrics (seconds per phase): the whole forward compile (tracing, AOTAutograd,
# Inductor) and the backward's, which AOTAutograd compiles at the first backward
_COMPILE_PHASES = ("_compile.compile_inner", "compile_fx.<locals>.bw_compiler")


def _compile_seconds() -> float:
    try:
        from torch._dynamo.utils import compilation_time_metrics as m
    except ImportError:  # pragma: no cover
        return 0.0
    return float(sum(sum(m.get(k, ())) for k in _COMPILE_PHASES))


def _graphs_compiled() -> int:
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # pragma: no cover
        return 0
    return int(counters["stats"]["unique_graphs"])


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

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.disabled is not None:
            return self.model(x)
        return self.fn(x)

    def fail(self, e: BaseException) -> None:
        """A compile failed: the rest of the run is eager, and says why in one line."""
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        self.disabled = f"{type(e).__name__}: {first}"[:200]
        self.log(f"[compile] torch.compile({self.mode}) failed ({self.disabled}): the run goes on eager")

    def stats(self) -> dict:
        return {"compiled_graphs": _graphs_compiled() - self._graphs0,
                "compile_s": _compile_seconds() - self._seconds0,
                "compile_disabled": int(self.disabled is not None)}
