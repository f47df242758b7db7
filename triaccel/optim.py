"""The optimizer a run trains with: its parameter groups (one per layer in triaccel mode, for the
per-layer lr), the optimizer over them (fused one-launch kernels in triaccel mode on CUDA) and
the GradScaler that unscales their gradients."""
from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import torch
import torch.nn as nn

from triaccel.config import TrainConfig
from triaccel.precision import layer_plan


def param_groups(model: nn.Module, per_layer: bool) -> list[dict]:
    """One group per layer (``triaccel.precision.layer_plan``: per-layer lr) plus one for the rest
    (norms, parameters of no layer), or one group. Every trainable parameter is in exactly one
    group (a tied weight once); frozen ones in none."""
    if not per_layer:
        return [{"params": [p for p in model.parameters() if p.requires_grad], "name": "all"}]
    plan = layer_plan(model)
    groups = [{"params": list(ps), "name": name} for name, ps in zip(plan.names, plan.params)]
    seen = {id(p) for ps in plan.params for p in ps}
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in seen]
    if rest:
        groups.append({"params": rest, "name": "_other"})
    return groups


def make_optimizer(cfg: TrainConfig, groups: list[dict], device: torch.device) -> torch.optim.Optimizer:
    """torch.optim for fp32/amp; in triaccel mode the fused one-launch kernels on CUDA
    (per-layer lr from a device array), torch.optim with per-layer groups elsewhere."""
    oc, kern = cfg.optim, cfg.triaccel.kernels
    triaccel = cfg.mode == "triaccel"
    fused = triaccel and (kern == "triton" or (kern == "auto" and device.type == "cuda"))
    pc = cfg.triaccel.precision
    bf16_state = triaccel and pc.optimizer_state == "bf16"
    bf16_master = triaccel and any(p.dtype == torch.bfloat16 for g in groups for p in g["params"])
    if fused or bf16_state or bf16_master:  # bf16 state or weights need these optimizers: their reference loop off CUDA
        from triaccel.kernels.fused_optim import FusedAdamW, FusedSGD

        kw = dict(backend="triton" if fused else "torch",
                  state_dtype=torch.bfloat16 if bf16_state else torch.float32, rounding=pc.rounding)
        if oc.name == "sgd":
            return FusedSGD(groups, lr=oc.lr, momentum=oc.momentum, nesterov=oc.nesterov,
                            weight_decay=oc.weight_decay, **kw)
        return FusedAdamW(groups, lr=oc.lr, betas=oc.betas, weight_decay=oc.weight_decay, **kw)
    # deferred_skip on CUDA: the fused step takes the GradScaler's found-inf flag on the device
    # (the default step reads it back: one sync per step)
    fused = True if cfg.deferred_skip and device.type == "cuda" else None
    if oc.name == "sgd":
        return torch_sgd(groups, oc, fused)
    return torch.optim.AdamW(groups, lr=oc.lr, betas=oc.betas, weight_decay=oc.weight_decay, fused=fused)


def torch_sgd(groups: list[dict], oc, fused: bool | None) -> torch.optim.SGD:
    """``torch.optim.SGD``; fused, with its momentum buffers made as zeros now.

    torch's fused SGD makes them with ``empty_like`` at its first step, and a first step the
    GradScaler skips (found_inf: the usual fp16 start, the scale still too high) returns before
    writing them. The next step then reads uninitialised memory as momentum: NaN weights, every
    later loss non-finite (EfficientNet-B0, static fp16 on an H100). Zeros give that step
    ``buf = grad``, torch's own first step (dampening 0); unfused SGD makes no buffer on a skip."""
    opt = torch.optim.SGD(groups, lr=oc.lr, momentum=oc.momentum, nesterov=oc.nesterov,
                          weight_decay=oc.weight_decay, fused=fused)
    if fused and oc.momentum:
        for g in opt.param_groups:
            for p in g["params"]:
                opt.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    return opt


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler`` that also unscales bf16 gradients on CUDA.

    Under ``master_weights: bf16`` a layer stored in bf16 has a bf16 gradient while fp16 layers
    still need the scaler, and torch's fused check-and-unscale has no bf16 CUDA kernel (torch 2.11:
    NotImplementedError). bf16 gradients (a sparse one's values) are therefore checked here by their
    1-norms, whose sums carry any inf or NaN, and unscaled with one foreach multiply, in fp32
    arithmetic rounded to bf16 as torch's CPU kernel does, on every device so that CI runs this
    path. Every other gradient goes through torch's own loop; the skip, the scale update and the
    fused optimizers' found_inf are torch's unchanged."""

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        ours, rest = [], []  # bf16 tensors to unscale here; parameters for torch's loop
        for group in optimizer.param_groups:
            for p in group["params"]:
                g = p.grad
                t = None if g is None else (g._values() if g.is_sparse else g)
                if t is None or t.dtype != torch.bfloat16:
                    rest.append(p)
                elif t.numel():  # an empty one has nothing to check or scale
                    ours.append(t)
        if len(rest) == sum(len(g["params"]) for g in optimizer.param_groups):
            return super()._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)
        # torch's loop reads only optimizer.param_groups: hand it the other parameters
        per_device = super()._unscale_grads_(SimpleNamespace(param_groups=[{"params": rest}]),
                                             inv_scale, found_inf, allow_fp16)
        by_device = defaultdict(list)
        for t in ours:
            by_device[t.device].append(t)
        with torch.no_grad():
            for device, grads in by_device.items():
                found = per_device.get(device)
                if found is None:
                    found = per_device[device] = found_inf.to(device, non_blocking=True, copy=True)
                # a sum of |g| (fp32) is inf or NaN exactly when an element is, short of 3.4e38 of finite ones
                nonfinite = torch.stack(torch._foreach_norm(grads, 1)).isfinite().logical_not().any()
                found.copy_(torch.maximum(found, nonfinite.to(found.dtype)))  # 1.0 once any is inf/NaN
                torch._foreach_mul_(grads, inv_scale.to(device, non_blocking=True))
        return per_device
