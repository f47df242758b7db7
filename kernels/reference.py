"""Plain-torch references for every Triton kernel, with the same signatures.

The tests compare each kernel against these over odd shapes and dtypes; the trainer uses
them where Triton cannot run (CPU without the interpreter).
"""
from __future__ import annotations

import math

import torch


def segment_rows(n: int, segments: list[int] | None, n_segments: int | None) -> tuple[list[int], int]:
    """(output row of each of n tensors, number of output rows): one row each unless ``segments``."""
    if segments is None:
        return list(range(n)), n
    rows = list(segments)
    return rows, n_segments if n_segments is not None else max(rows, default=-1) + 1


def grad_stats_ref(tensors: list[torch.Tensor], segments: list[int] | None = None,
                   n_segments: int | None = None) -> torch.Tensor:
    """Per tensor: [sum, sum of squares, count of non-finite values], float32 [n, 3].

    With ``segments``, tensor i's row is added into output row ``segments[i]``."""
    dev = tensors[0].device if tensors else torch.device("cpu")
    rows, n_out = segment_rows(len(tensors), segments, n_segments)
    out = torch.zeros(n_out, 3, dtype=torch.float32, device=dev)
    for i, t in zip(rows, tensors):
        if t.numel() == 0:
            continue
        x = t.detach().float()
        finite = torch.isfinite(x)
        xf = torch.where(finite, x, torch.zeros((), device=x.device))
        out[i, 0] += xf.sum()
        out[i, 1] += (xf * xf).sum()
        out[i, 2] += (~finite).sum()
    return out


def variance_ema_ref(stats: torch.Tensor, numel: torch.Tensor, ema: torch.Tensor, nonfinite: torch.Tensor,
                     fisher_acc: torch.Tensor, beta: float, n_examples: int) -> None:
    """§3.1's update from per-layer (sum, sumsq, nonfinite), in place:
    v <- beta v + (1 - beta) Var[g] (beta = 0 starts the average), non-finite counts added, and the
    Fisher proxy n * ||g_l||^2 accumulated. (For a mini-batch mean gradient of n examples,
    E||g_l||^2 = ||grad L_l||^2 + tr(Sigma_l)/n, so n * ||g_l||^2 estimates the trace of the
    layer's empirical Fisher block when noise dominates: an upper bound on its top eigenvalue.)"""
    mean = stats[:, 0] / numel
    var = (stats[:, 1] / numel - mean * mean).clamp_min(0)
    ema.mul_(beta).add_(var, alpha=1 - beta)
    nonfinite.add_(stats[:, 2])
    fisher_acc.add_(stats[:, 1] * float(n_examples))


_M32 = 0xFFFFFFFF


def mix32_ref(x: torch.Tensor) -> torch.Tensor:
    """The kernels' 32-bit hash (``fused_optim._mix32``) on int64 tensors holding uint32 values."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def bf16_stochastic_ref(x: torch.Tensor, seed: int, seg: int) -> torch.Tensor:
    """``fused_optim._bf16_sr``: fp32 ``x`` (tensor ``seg`` of its launch, step ``seed``) rounded to
    bf16 stochastically, with the kernel's random bits; NaN stays NaN."""
    key = mix32_ref(torch.tensor(seed & _M32) ^ mix32_ref(torch.tensor((seg + 1) & _M32)))
    xf = x.detach().float()  # a dense tensor keeps its strides (channels_last included)
    flat = xf.as_strided((xf.numel(),), (1,))  # in memory order: the kernel's element index is the offset
    r = mix32_ref(torch.arange(flat.numel(), dtype=torch.int64, device=flat.device) ^ key.to(flat.device))
    bits = flat.contiguous().view(torch.int32).to(torch.int64) & _M32
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    bits = torch.where(nan, bits | 0x00400000, (bits + (r & 0xFFFF)) & _M32)
    hi = bits >> 16
    hi = torch.where(hi >= 0x8000, hi - 0x10000, hi)
    out = torch.empty_like(xf, dtype=torch.bfloat16)
    out.as_strided((out.numel(),), (1,)).copy_(hi.to(torch.int16).view(torch.bfloat16))
    return out


def store_param_ref(p: torch.Tensor, new: torch.Tensor, comp: torch.Tensor | None, rounding: str, seed: int,
                    seg: int) -> None:
    """``fused_optim._store_param``: the updated fp32 weight ``new`` stored into ``p`` as its dtype keeps it."""
    if p.dtype != torch.bfloat16:
        p.copy_(new)
    elif rounding == "stochastic":
        p.copy_(bf16_stochastic_ref(new, seed, seg))
    else:
        pb = new.to(torch.bfloat16)
        p.copy_(pb)
        if rounding == "kahan":
            comp.copy_(new - pb.float())


def _master(p, comp, rounding):
    """The weight an update starts from, in fp32: a bf16 weight plus its Kahan compensation."""
    w = p.float()
    return w + comp.float() if p.dtype == torch.bfloat16 and rounding == "kahan" else w


def sgd_step_ref(params, grads, bufs, lrs, *, momentum: float, weight_decay: float, nesterov: bool,
                 inv_scale: torch.Tensor | None = None, found_inf: torch.Tensor | None = None,
                 rounding: str = "nearest", comps=None, seed: torch.Tensor | int = 0) -> None:
    """torch.optim.SGD's update (dampening 0) with per-tensor lr, unscale and inf skip.

    A bf16 momentum buffer is computed in fp32, stored rounded once, and the update uses the
    unrounded value (as the kernel does). bf16 weights: the update computes in fp32 and is stored
    as ``rounding`` says (``store_param_ref``); ``params`` are one launch's tensors, in its order."""
    if found_inf is not None and float(found_inf) > 0:
        return
    seed = int(seed)
    for i, (p, g, b, lr) in enumerate(zip(params, grads, bufs, lrs)):
        comp = comps[i] if comps is not None else None
        w = _master(p, comp, rounding)
        g = g.float() * (float(inv_scale) if inv_scale is not None else 1.0)
        if weight_decay:
            g = g + weight_decay * w
        if momentum:
            m = b.float() * momentum + g
            b.copy_(m)
            g = g + momentum * m if nesterov else m
        store_param_ref(p, w - float(lr) * g, comp, rounding, seed, i)


def adamw_step_ref(params, grads, exp_avgs, exp_avg_sqs, lrs, step: int, *, beta1: float, beta2: float,
                   eps: float, weight_decay: float, inv_scale: torch.Tensor | None = None,
                   found_inf: torch.Tensor | None = None, rounding: str = "nearest", comps=None,
                   seed: torch.Tensor | int = 0) -> None:
    """torch.optim.AdamW's update (no amsgrad) with per-tensor lr; ``step`` counts this update (1-based).
    bf16 weights as in ``sgd_step_ref``."""
    if found_inf is not None and float(found_inf) > 0:
        return
    seed = int(seed)
    bc1 = 1 - beta1 ** step
    bc2s = math.sqrt(1 - beta2 ** step)
    for i, (p, g, m, v, lr) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs, lrs)):
        comp = comps[i] if comps is not None else None
        w = _master(p, comp, rounding) * (1 - float(lr) * weight_decay)
        g = g.float() * (float(inv_scale) if inv_scale is not None else 1.0)
        m32 = m.float().lerp(g, 1 - beta1)  # bf16 state: computed in fp32, stored rounded once
        v32 = (v.float() * beta2).addcmul_(g, g, value=1 - beta2)
        m.copy_(m32)
        v.copy_(v32)
        store_param_ref(p, w.addcdiv(m32, (v32.sqrt() / bc2s).add_(eps), value=-float(lr) / bc1), comp, rounding,
                        seed, i)


def gather_augment_ref(x: torch.Tensor, idx: torch.Tensor, draws, mean: torch.Tensor, inv_std: torch.Tensor,
                       padding: int, channels_last: bool = False) -> torch.Tensor:
    """Gather ``x[idx]`` (uint8 [N, C, H, W]), then, with ``draws = (oy, ox, flip)``, zero-pad by
    ``padding`` and crop H x W at (oy, ox), flip where ``flip``; scale to [0, 1] and normalise
    per channel (mean, inv_std: [C] or [1, C, 1, 1]); float32 in the asked layout."""
    xb = x[idx]
    n, c, h, w = xb.shape
    if draws is not None and n:
        oy, ox, flip = draws
        if padding > 0:
            xp = torch.nn.functional.pad(xb, (padding, padding, padding, padding))
            rows = oy[:, None] + torch.arange(h, device=x.device)[None, :]
            cols = ox[:, None] + torch.arange(w, device=x.device)[None, :]
            b = torch.arange(n, device=x.device)[:, None, None]
            xb = xp.permute(0, 2, 3, 1)[b, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)
        xb = torch.where(flip[:, None, None, None], xb.flip(3), xb)
    out = xb.float().mul_(1.0 / 255).sub_(mean.view(1, c, 1, 1)).mul_(inv_std.view(1, c, 1, 1))
    return out.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
