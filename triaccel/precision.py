"""Per-layer precision at run time: each Conv2d/Linear runs in its own autocast region.

The precision controller decides a dtype per layer; this module applies it. Each layer's
``forward`` is wrapped (in place: parameter names and state_dict keys do not change):

- FP16/BF16: ``torch.autocast(device, dtype, cache_enabled=False)`` around the layer. The
  weight-cast cache is keyed by the source tensor only, so with it on, a weight cast to fp16
  could be served inside a bf16 region (shared weights, curvature probes); off, every region
  casts afresh, which per-layer regions do anyway since each region is outermost.
- FP32: autocast off for the layer, input cast up to fp32.

Parameters stay fp32 (master weights); only the layer's compute dtype changes. Everything
outside the layers (BatchNorm, activations, the loss) runs in the dtype of its input, outside
any autocast region. ``force(torch.float32)`` runs every layer in fp32 for a while (the
curvature probes need double backward in full precision).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn as nn

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
NAMES = {v: k for k, v in DTYPES.items()}
LEVELS = ["fp16", "bf16", "fp32"]  # promotion order


def layer_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The layers the controllers act on: every Conv2d and Linear, in registration order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]


def supported_levels(device: torch.device, cpu_fp16: bool = False) -> dict[str, str]:
    """Map each requested level to what the device can run; a fallback is stated, never silent.
    On a CPU fp16 runs as bf16 unless ``cpu_fp16`` (there fp16 is ~17x slower than bf16: the
    controller's fastest level would be its slowest)."""
    out = {"fp16": "fp16", "bf16": "bf16", "fp32": "fp32"}
    if device.type == "cuda":
        if not torch.cuda.is_bf16_supported(including_emulation=False):
            out["bf16"] = "fp16"
    else:
        for lvl in ("fp16", "bf16"):
            try:
                with torch.autocast(device.type, dtype=DTYPES[lvl]):
                    torch.nn.functional.linear(torch.ones(1, 2), torch.ones(2, 2))
            except Exception:
                out[lvl] = "fp32"
        if device.type == "cpu" and not cpu_fp16 and out["bf16"] == "bf16":
            out["fp16"] = "bf16"
    return out


class PrecisionRuntime:
    """Applies per-layer levels. ``region()`` is the trainer's forward context: while every layer
    has the same level (the common case) it is one autocast region around the whole forward,
    exactly static AMP's cost, and the per-layer wrappers step aside; once levels differ, each
    layer runs in its own region. (On the H200 the per-layer regions cost +7-8 % over one region.)
    """

    def __init__(self, model: nn.Module, device: torch.device, initial: str = "bf16", log=print,
                 uniform_fast_path: bool = True, cpu_fp16: bool = False):
        self.device_type = device.type
        self.layers = layer_modules(model)
        self.names = [n for n, _ in self.layers]
        self.fallback = supported_levels(device, cpu_fp16=cpu_fp16)
        for req, got in self.fallback.items():
            if req != got:
                why = ("is slow on a CPU (triaccel.precision.cpu_fp16: true keeps it)"
                       if device.type == "cpu" and (req, got) == ("fp16", "bf16") else f"is not supported on {device}")
                log(f"[precision] {req} {why}: layers assigned {req} run in {got}")
        self._override: torch.dtype | None = None
        self._global: torch.dtype | None = None  # set while one region covers the whole forward
        self.uniform_fast_path = uniform_fast_path
        self._dtype: dict[str, torch.dtype] = {}
        for name, mod in self.layers:
            self._wrap(name, mod)
            self.set(name, initial)

    def _wrap(self, name: str, mod: nn.Module) -> None:
        inner = mod.forward
        rt = self

        def forward(x, *args, **kwargs):
            if rt._global is not None and rt._override is None:
                return inner(x, *args, **kwargs)  # inside the one region of a uniform forward
            dt = rt._override or rt._dtype[name]
            if dt is torch.float32:
                with torch.autocast(rt.device_type, enabled=False):
                    return inner(x.float(), *args, **kwargs)
            with torch.autocast(rt.device_type, dtype=dt, cache_enabled=False):
                return inner(x, *args, **kwargs)

        mod.forward = forward

    def set(self, name: str, level: str) -> None:
        self._dtype[name] = DTYPES[self.fallback[level]]

    def level(self, name: str) -> str:
        return NAMES[self._dtype[name]]

    def levels(self) -> list[str]:
        return [self.level(n) for n in self.names]

    def any_fp16(self) -> bool:
        return any(d is torch.float16 for d in self._dtype.values())

    def uniform(self) -> torch.dtype | None:
        """The one dtype every layer has, or None when levels differ."""
        dts = set(self._dtype.values())
        return next(iter(dts)) if len(dts) == 1 else None

    @contextmanager
    def region(self):
        u = self.uniform() if self.uniform_fast_path and self._override is None else None
        if u is None:
            yield
            return
        self._global = u
        try:
            if u is torch.float32:
                yield
            else:
                with torch.autocast(self.device_type, dtype=u):
                    yield
        finally:
            self._global = None

    @contextmanager
    def force(self, dtype: torch.dtype):
        prev, self._override = self._override, dtype
        try:
            yield
        finally:
            self._override = prev
