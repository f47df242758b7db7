"""The fused SGD step with its momentum in bf16 (the exported config's optimizer_state) on the GPU.

    python3 bench/sgd_state_bench.py --out bench/results/idle_cost/h200_sgd_state.json

bench/results/idle_cost/h200_diagnosis.json found the export's whole extra device time per step
in this one kernel: 129 us with bf16 momentum against 57 us with fp32 (ResNet-18, B=96, H200).
Variants, on ResNet-18's parameters in one group per layer (as Tri-Accel runs them):
  fp32_state          momentum in fp32
  bf16_int_rne        bf16 momentum rounded by integer arithmetic (the kernel before)
  bf16_hw             bf16 momentum by the GPU's own round-to-nearest-even conversion
  bf16_hw_aligned     the same with 16-byte alignment hints on the tensors' pointers
  torch_fused_sgd     torch.optim.SGD(fused=True), one group, fp32 momentum (the static run's)
Each: median of 15 synchronised blocks of 20 steps after 20 warm-up steps (CUDA events). The two
bf16 roundings are also compared bit for bit on the same step, ties and NaN included.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402

from triaccel.config import ModelConfig  # noqa: E402
from triaccel.kernels import fused_optim as fo  # noqa: E402
from triaccel.models import build_model  # noqa: E402
from triaccel.trainer import param_groups  # noqa: E402


def make(state, seed=0):
    torch.manual_seed(seed)
    model = build_model(ModelConfig(name="resnet18"), 10, 3, 32).cuda().to(memory_format=torch.channels_last)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-2
    groups = param_groups(model, per_layer=True)
    if state == "torch":
        return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4, fused=True)
    return model, fo.FusedSGD(groups, lr=0.05, momentum=0.9, weight_decay=5e-4, backend="triton",
                              state_dtype=torch.bfloat16 if state == "bf16" else torch.float32)


def time_steps(opt, blocks=15, per_block=20, warm=20) -> dict:
    for _ in range(warm):
        opt.step()
    torch.cuda.synchronize()
    ts = []
    for _ in range(blocks):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(per_block):
            opt.step()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / per_block)
    return {"median_us": statistics.median(ts), "mean_us": statistics.fmean(ts), "std_us": statistics.stdev(ts)}


VARIANTS = {"fp32_state": ("fp32", None, False), "bf16_int_rne": ("bf16", False, False), "bf16_hw": ("bf16", True, False),
            "bf16_hw_aligned": ("bf16", True, True), "torch_fused_sgd": ("torch", None, False)}


def roundings_agree() -> dict:
    """One step from the same state with each rounding: momentum bits and parameters equal?"""
    out = {}
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8),
                            3.0e-39, 65504.0, 1e38], device="cuda")
    for hw in (False, True):
        fo.HW_BF16 = hw
        model, opt = make("bf16", seed=1)
        p0 = next(p for p in model.parameters() if p.dim() == 1)
        p0.grad[:len(special)] = special  # ties to even, NaN, infinities, a subnormal
        opt.step()
        torch.cuda.synchronize()
        out[hw] = ([opt.state[p]["momentum_buffer"].view(torch.int16).clone() for p in model.parameters()],
                   [p.detach().view(torch.int32).clone() for p in model.parameters()])  # bits: NaN == NaN
    bits = all(torch.equal(a, b) for a, b in zip(out[False][0], out[True][0]))
    params = all(torch.equal(a, b) for a, b in zip(out[False][1], out[True][1]))
    return {"momentum_bits_equal": bits, "params_equal": params}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    res = {"what": __doc__.split("\n\n")[0], "gpu": torch.cuda.get_device_name(), "steps": {}}
    res["roundings"] = roundings_agree()
    print("roundings", res["roundings"], flush=True)
    for rep in range(2):  # the variants twice, in turn: drift falls on all alike
        for name, (state, hw, aligned) in VARIANTS.items():
            fo.HW_BF16, fo.ALIGNED = hw, aligned
            try:
                _, opt = make(state)
                r = time_steps(opt)
            except Exception as e:  # noqa: BLE001 -- a variant that does not compile is recorded, the rest run
                r = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
            res["steps"].setdefault(name, []).append(r)
            print(rep, name, r, flush=True)
    fo.HW_BF16, fo.ALIGNED = None, False
    write(args.out, res)


if __name__ == "__main__":
    main()
