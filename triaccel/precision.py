"""Per-layer precision at run time: each layer (``layer_plan``) runs in its own autocast region.

The precision controller decides a dtype per layer; this module applies it. Each layer's
``forward`` is wrapped (in place: parameter names and state_dict keys do not change):

- FP16/BF16: ``torch.autocast(device, dtype, cache_enabled=False)`` around the layer. The
  weight-cast cache is keyed by the source tensor only, so with it on, a weight cast to fp16
  could be served inside a bf16 region (shared weights, curvature probes); off, every region
  casts afresh, which per-layer regions do anyway since each region is outermost.
- FP32: autocast off for the layer, input cast up to fp32.

Parameters stay fp32 (master weights), and only the layer's compute dtype changes, unless
``keep_bf16_masters`` (``triaccel.precision.master_weights: bf16``): then each layer's weights are
stored as its level computes (bf16 at FP16/BF16, fp32 at FP32), and under ``force(torch.float32)`` a
layer with bf16 weights computes with fp32 copies of them. Everything
outside the layers (norms, activations, the loss) runs in the dtype of its input, outside
any autocast region: torch's batch, layer, group and RMS norms take a 16-bit input with fp32
weights (and under the one region of a uniform forward autocast runs them in fp32 anyway).
``force(torch.float32)`` runs every layer in fp32 for a while (the
curvature probes need double backward in full precision).
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.nn as nn

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
NAMES = {v: k for k, v in DTYPES.items()}
LEVELS = ["fp16", "bf16", "fp32"]  # promotion order


# Norms own parameters but get no region and no per-layer group: they take a 16-bit input as it comes
# (module docstring), and as layers of their own they would double ResNet-18's 21 layers (its curvature
# probe then switches from exact to batched) for parameters whose gradients the "_other" group serves.
NORMS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm,
         *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()))


@dataclass
class LayerPlan:
    """The layers the controllers act on, found on any nn.Module.

    A layer is a module, not a norm, that owns a trainable parameter directly (Linear, Conv1d/2d/3d,
    Embedding, a custom module with its own ``nn.Parameter``), in registration order. Each trainable
    parameter belongs to the first layer that holds it: a weight tied between two modules (an
    embedding and its output projection) is in one layer, once. Frozen parameters
    (requires_grad=False) belong to none, buffers are never touched. ``aliases``: modules (not
    norms) holding only parameters another layer owns (the tied projection); they run in their
    owner's precision, since a 16-bit input meeting an fp32 weight outside autocast would fail."""
    layers: list  # (name, module)
    params: list  # each layer's own trainable parameters, in the order of ``layers``
    aliases: list  # (module, owner layer name)

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.layers]


ROOT = "_root"  # the layer name of parameters the model holds itself (named_modules calls it "")


def layer_plan(model: nn.Module) -> LayerPlan:
    layers, params, aliases, owner = [], [], [], {}
    for name, mod in model.named_modules():
        if isinstance(mod, NORMS):
            continue
        direct = [p for p in mod.parameters(recurse=False) if p.requires_grad]
        own = [p for p in direct if id(p) not in owner]
        if own:
            name = name or ROOT  # the model itself holds a parameter (a position embedding, say)
            for p in own:
                owner[id(p)] = name
            layers.append((name, mod))
            params.append(own)
        elif direct:
            aliases.append((mod, owner[id(direct[0])]))
    return LayerPlan(layers, params, aliases)


def layer_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The layers the controllers act on (``layer_plan``), as (name, module)."""
    return layer_plan(model).layers


def first_half(cfg, device: torch.device) -> torch.dtype | None:
    """The 16-bit type a run of ``cfg`` first autocasts its forward to on ``device``: amp's dtype, triaccel's
    initial level as the device runs it; None in fp32 mode or where that level runs in fp32."""
    if cfg.mode == "fp32":
        return None
    if cfg.mode == "amp":
        return DTYPES[cfg.amp_dtype]
    pc = cfg.triaccel.precision
    level = supported_levels(device, cpu_fp16=pc.cpu_fp16, half=pc.half)[cfg.amp_dtype]
    return None if level == "fp32" else DTYPES[level]


def supported_levels(device: torch.device, cpu_fp16: bool = False, half: str = "fp16") -> dict[str, str]:
    """Map each requested level to what the device can run; a fallback is stated, never silent.
    On a CPU fp16 runs as bf16 unless ``cpu_fp16`` (there fp16 is ~17x slower than bf16: the
    controller's fastest level would be its slowest). ``half="bf16"`` runs the fp16 level as bf16
    wherever the device runs bf16 (``triaccel.precision.half``)."""
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
    if half == "bf16" and out["bf16"] == "bf16":
        out["fp16"] = "bf16"
    return out


def store_weight(p: torch.Tensor, dtype: torch.dtype, optimizer=None) -> None:
    """``p`` stored in ``dtype`` from now on, between steps: through a fused optimizer's
    ``set_master_dtype`` when there is one (its state and launch plan follow the weight), else alone
    (at set-up, before the optimizer exists)."""
    from triaccel.kernels.fused_optim import set_master_dtype

    if hasattr(optimizer, "set_master_dtype"):
        optimizer.set_master_dtype(p, dtype)
    else:
        set_master_dtype(p, dtype)


class PrecisionRuntime:
    """Applies per-layer levels. ``region()`` is the trainer's forward context: while every layer
    has the same level (the common case) it is one autocast region around the whole forward,
    exactly static AMP's cost, and the per-layer wrappers step aside; once levels differ, each
    layer runs in its own region. (On an H200 the per-layer regions cost +7-8 % over one region.)
    """

    def __init__(self, model: nn.Module, device: torch.device, initial: str = "bf16", log=print,
                 uniform_fast_path: bool = True, cpu_fp16: bool = False, half: str = "fp16"):
        self.device_type = device.type
        plan = layer_plan(model)
        self.layers = plan.layers
        self.layer_params = plan.params  # each layer's own trainable parameters (tied ones once)
        self.names = plan.names
        self.fallback = supported_levels(device, cpu_fp16=cpu_fp16, half=half)
        for req, got in self.fallback.items():
            if req != got:
                if (req, got) == ("fp16", "bf16") and half == "bf16":
                    why = "is set to bf16 (triaccel.precision.half)"
                elif (req, got) == ("fp16", "bf16") and device.type == "cpu":
                    why = "is slow on a CPU (triaccel.precision.cpu_fp16: true keeps it)"
                else:
                    why = f"is not supported on {device}"
                log(f"[precision] {req} {why}: layers assigned {req} run in {got}")
        self.bf16_masters = False  # keep_bf16_masters: the layers' weights are stored in bf16
        self._override: torch.dtype | None = None
        self._global: torch.dtype | None = None  # set while one region covers the whole forward
        self.uniform_fast_path = uniform_fast_path
        self._dtype: dict[str, torch.dtype] = {}
        for name, mod in self.layers:
            self._wrap(name, mod)
            self.set(name, initial)
        for mod, owner in plan.aliases:
            self._wrap(owner, mod)

    def _wrap(self, name: str, mod: nn.Module) -> None:
        inner = mod.forward
        rt = self

        def forward(x, *args, **kwargs):
            if rt._global is not None and rt._override is None:
                return inner(x, *args, **kwargs)  # inside the one region of a uniform forward
            dt = rt._override or rt._dtype[name]
            if dt is torch.float32:
                # floating inputs up to fp32 (an embedding's token ids stay integers; an attention's
                # key and value come up with its query)
                up = lambda t: t.float() if torch.is_tensor(t) and t.is_floating_point() else t
                with torch.autocast(rt.device_type, enabled=False), rt._fp32_weights(mod):
                    return inner(up(x), *map(up, args), **{k: up(v) for k, v in kwargs.items()})
            with torch.autocast(rt.device_type, dtype=dt, cache_enabled=False):
                return inner(x, *args, **kwargs)

        mod.forward = forward

    def keep_bf16_masters(self) -> None:
        """From now on each layer's own weights are stored as its level computes: bf16 at FP16 or BF16,
        fp32 at FP32 (``store_as_levels``, which the trainer calls between steps)."""
        self.bf16_masters = True

    def master_changes(self) -> list[tuple[nn.Parameter, torch.dtype]]:
        """(weight, dtype) for each layer weight whose storage differs from its layer's level: the
        storage follows the precision controller's decision, so a layer it keeps at FP32 (high
        gradient variance, or promoted on curvature) keeps fp32 master weights and the rest bf16."""
        if not self.bf16_masters:
            return []
        out = []
        for name, ps in zip(self.names, self.layer_params):
            want = torch.float32 if self._dtype[name] is torch.float32 else torch.bfloat16
            out += [(p, want) for p in ps if p.dtype != want]
        return out

    def store_as_levels(self, optimizer=None) -> tuple[int, int]:
        """Each layer weight converted to the storage its level takes (``master_changes``,
        ``store_weight``). Returns (weights converted, bytes freed; negative: taken)."""
        changes = self.master_changes()
        freed = 0
        for p, dt in changes:
            freed += p.numel() * (p.element_size() - dt.itemsize)
            store_weight(p, dt, optimizer)
        return len(changes), freed

    def _fp32_weights(self, mod: nn.Module):
        """While a layer with bf16 weights computes in FP32: its weights as fp32 copies, through which
        the gradients reach the bf16 weights (torch.func's reparametrisation)."""
        if not self.bf16_masters:
            return nullcontext()
        from torch.nn.utils.stateless import _reparametrize_module

        up = {n: p.float() for n, p in mod.named_parameters(recurse=False) if p.dtype == torch.bfloat16}
        return _reparametrize_module(mod, up) if up else nullcontext()

    def set(self, name: str, level: str) -> None:
        self._dtype[name] = DTYPES[self.fallback[level]]

    def level(self, name: str) -> str:
        return NAMES[self._dtype[name]]

    def levels(self) -> list[str]:
        return [self.level(n) for n in self.names]

    def may_use_fp16(self) -> bool:
        """Whether any level can run in fp16 here (then a GradScaler is needed)."""
        return "fp16" in self.fallback.values()

    def any_fp16(self) -> bool:
        return any(d is torch.float16 for d in self._dtype.values())

    def uniform(self) -> torch.dtype | None:
        """The one dtype every layer has, or None when levels differ."""
        dts = set(self._dtype.values())
        return next(iter(dts)) if len(dts) == 1 else None

    @contextmanager
    def region(self):
        u = self.uniform() if self.uniform_fast_path and self._override is None else None
        if u is None or (u is torch.float32 and self.bf16_masters and any(
                p.dtype == torch.bfloat16 for ps in self.layer_params for p in ps)):  # FP32 over bf16 weights: per layer
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
