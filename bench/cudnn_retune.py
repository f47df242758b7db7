"""Does turning cuDNN autotuning on tune the shapes a run has already met untuned?

    python3 bench/cudnn_retune.py --out A.json            # untuned, then autotuning switched on
    python3 bench/cudnn_retune.py --tuned --out B.json    # a second process: tuned from its first step

Tri-Accel runs its first steps with autotuning off (the batch and the precision plan still move)
and turns it on once both settle. This measures what that switch buys, on EfficientNet-B0 at
224 px (fp16 autocast, channels_last, forward and backward of synthetic images, no data): in one
process the shapes untuned (first step: kernels chosen by heuristics; steady step), then the same
shapes with autotuning switched on (first step: tuning, if any happens; steady step); in another,
the same shapes tuned from the first step, as static AMP runs. If the switched-on first step is as
short as a steady step and the tuned process's steady step is faster, a run that met its shapes
untuned keeps the untuned kernels after autotuning goes on.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402


DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16}
AUTOCAST = [torch.float16]


def step_times(model, x, y, n):
    """Seconds of each of ``n`` forward+backward steps, synchronised."""
    out = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=AUTOCAST[0]):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def phase(name, model, x, y, steps, res):
    t = step_times(model, x, y, steps)
    res["phases"][name] = {"first_step_s": t[0], "steady_step_s_median": statistics.median(t[2:]),
                           "steady_img_per_s": x.shape[0] / statistics.median(t[2:]), "steps": steps}
    print(name, {k: round(v, 4) for k, v in res["phases"][name].items()}, flush=True)
    write(res["out"], {k: v for k, v in res.items() if k != "out"})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--tuned", action="store_true", help="autotuning on from the first step")
    ap.add_argument("--dtype", choices=["fp16", "bf16"], default="fp16", help="autocast dtype")
    args = ap.parse_args()
    import torchvision

    AUTOCAST[0] = DTYPE[args.dtype]

    torch.manual_seed(0)
    model = torchvision.models.efficientnet_b0(num_classes=10).cuda().to(memory_format=torch.channels_last)
    x = torch.randn(args.batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (args.batch,), device="cuda")
    res = {"what": __doc__.split("\n\n")[0], "batch": args.batch, "dtype": args.dtype, "out": args.out, "phases": {}}
    if args.tuned:
        torch.backends.cudnn.benchmark = True
        phase("tuned_from_the_start", model, x, y, args.steps, res)
        return
    torch.backends.cudnn.benchmark = False
    phase("untuned", model, x, y, args.steps, res)
    torch.backends.cudnn.benchmark = True
    phase("autotuning_switched_on", model, x, y, args.steps, res)


if __name__ == "__main__":
    main()
