"""One-launch batch assembly: gather from the device-resident uint8 dataset, zero-pad and crop,
flip, scale to [0, 1] and normalise, written in the layout the model wants (NCHW or NHWC).

The torch path (``reference.gather_augment_ref``) takes about a dozen launches per batch:
an index gather, a pad, index arithmetic, an advanced-indexing gather, a flip and a where,
the float conversion and three normalisation ops, and a layout copy. At small batches the
step is bound by the host (B=96 on an H200: the real input path costs 17 % over a repeated
batch, bench/results/profile/), so launches are what count. Same random draws as the
reference (the caller draws them), so both paths give the same batch within float rounding.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _gather_augment_kernel(x_ptr, idx_ptr, oy_ptr, ox_ptr, flip_ptr, mean_ptr, inv_std_ptr, out_ptr,
                           C, H, W, pad, s_n, s_c, s_h, s_w, AUGMENT: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    chw = C * H * W
    m = offs < chw
    c = offs // (H * W)
    h = (offs // W) % H
    w = offs % W
    src = tl.load(idx_ptr + b).to(tl.int64)
    if AUGMENT:
        oy = tl.load(oy_ptr + b)
        ox = tl.load(ox_ptr + b)
        fl = tl.load(flip_ptr + b)
        sw = tl.where(fl != 0, W - 1 - w, w) + ox - pad
        sh = h + oy - pad
    else:
        sw = w
        sh = h
    inside = m & (sh >= 0) & (sh < H) & (sw >= 0) & (sw < W)
    v = tl.load(x_ptr + src * chw + c * (H * W) + sh * W + sw, mask=inside, other=0).to(tl.float32)
    mean = tl.load(mean_ptr + c, mask=m, other=0.0)
    inv_std = tl.load(inv_std_ptr + c, mask=m, other=1.0)
    y = (v * (1.0 / 255.0) - mean) * inv_std
    tl.store(out_ptr + b * s_n + c * s_c + h * s_h + w * s_w, y, mask=m)


def gather_augment_triton(x: torch.Tensor, idx: torch.Tensor, draws, mean: torch.Tensor, inv_std: torch.Tensor,
                          padding: int, channels_last: bool = False) -> torch.Tensor:
    """Triton version of ``gather_augment_ref``. ``draws`` is (oy, ox, flip) or None (no augmentation)."""
    n = idx.numel()
    _, c, h, w = x.shape
    out = torch.empty(n, c, h, w, device=x.device, dtype=torch.float32,
                      memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    if n == 0:
        return out
    if draws is None:
        oy = ox = fl = idx  # unread
    else:
        oy, ox, fl = draws
        fl = fl.to(torch.int32)
    grid = (n, triton.cdiv(c * h * w, BLOCK))
    _gather_augment_kernel[grid](x, idx, oy, ox, fl, mean.reshape(-1), inv_std.reshape(-1), out, c, h, w, padding,
                                 *out.stride(), AUGMENT=draws is not None, BLOCK=BLOCK, num_warps=4)
    return out
