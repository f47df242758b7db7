"""The optimizer a run trains with: its parameter groups (one per layer in triaccel mode, for the
per-layer lr) and the optimizer over them (fused one-launch kernels in triaccel mode on CUDA)."""
from __future__ import annotations

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
        return torch.optim.SGD(groups, lr=oc.lr, momentum=oc.momentum, nesterov=oc.nesterov,
                               weight_decay=oc.weight_decay, fused=fused)
    return torch.optim.AdamW(groups, lr=oc.lr, betas=oc.betas, weight_decay=oc.weight_decay, fused=fused)
