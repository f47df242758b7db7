"""Where the captured Tri-Accel step loses to the captured static step at the same batch (issue 12/13).

    python3 bench/step_gap.py --data-dir /tmp/cifar --out bench/results/step_gap/h200_step_gap.json

Every variant is the shipped config (ResNet-18, CIFAR-10 JPEG pack) at B=96, fp16, captured
micro-batches, warmed up past its recordings (``--batch`` sets another B). For each, three views of the same steps:

- ``interleaved``: wall time per step, median of synchronised blocks, the variants' blocks
  alternating so drift falls on all alike (``paired_vs_first_pct``: against the first variant).
- ``host_ms``: how long the host takes to *issue* a block's steps (no sync inside the block),
  per step. Host ~ wall: the step is host-bound, and fewer launches or less Python would help.
  Host << wall: the GPU is the bottleneck, and only device time helps.
- ``device``: torch.profiler's CUDA activity per step: ops, summed device time, the top ops.
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
from triaccel_bench import cfg_for, device_profile, interleaved, make, stepper  # noqa: E402

from triaccel.measure import sync  # noqa: E402

OFF = {"triaccel.precision.enabled": False, "triaccel.curvature.enabled": False, "triaccel.batch.enabled": False}
START = {"triaccel.precision.scale": "relative", "triaccel.precision.tau_low": 1000.0,
         "triaccel.precision.tau_high": 10000.0, "triaccel.curvature.method": "fisher",
         "triaccel.curvature.every": 200, "triaccel.curvature.lr_rule": "normalized",
         "triaccel.curvature.tau_curv": 1000.0, "triaccel.curvature.alpha": 0.001, "triaccel.batch.enabled": False,
         "triaccel.control_every": 50}
VARIANTS = {
    "static_fp16": {"mode": "amp"},
    "ta_off": {"mode": "triaccel", **OFF},
    "ta_off_torchopt": {"mode": "triaccel", **OFF, "triaccel.kernels": "torch"},
    "ta_start_nobatch": {"mode": "triaccel", **START},
    # "_fresh": False: every micro-batch graph adds into zeroed gradient buffers, as before
    # fresh gradients (triaccel.capture): the A/B of that change, side by side
    "static_fp16_addgrads": {"mode": "amp", "_fresh": False},
    "ta_start_nobatch_addgrads": {"mode": "triaccel", **START, "_fresh": False},
}


def build(args, name):
    over = {k: v for k, v in VARIANTS[name].items() if not k.startswith("_")}
    t = make(cfg_for(args, batch_size=args.batch, amp_dtype="fp16", capture=True, **over))[0]
    if VARIANTS[name].get("_fresh") is False and t.graphs is not None:
        t.graphs.fresh_grads = False
    return t


def host_time(t, blocks: int = 11, per_block: int = 20) -> dict:
    step = stepper(t, start=False)
    host, wall = [], []
    for _ in range(blocks):
        sync(t.device)
        t0 = time.perf_counter()
        for _ in range(per_block):
            step()
        t1 = time.perf_counter()
        sync(t.device)
        host.append((t1 - t0) / per_block)
        wall.append((time.perf_counter() - t0) / per_block)
    return {"host_ms": 1e3 * statistics.median(host), "wall_ms": 1e3 * statistics.median(wall)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dataset", default="imagefolder")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--epochs", type=int, default=8)  # the schedule's length only: no epoch is run to its end
    ap.add_argument("--variants", default="static_fp16,ta_off,ta_off_torchopt,ta_start_nobatch")
    ap.add_argument("--batch", type=int, default=96)
    args = ap.parse_args()
    names = args.variants.split(",")
    trainers = {n: build(args, n) for n in names}
    res = {"what": __doc__.split("\n\n")[0], "batch": args.batch, "variants": {n: VARIANTS[n] for n in names}}
    res["interleaved"] = interleaved(trainers, blocks=21, per_block=20, warm=40)
    for n, t in trainers.items():
        res.setdefault("host", {})[n] = host_time(t)
        res.setdefault("device", {})[n] = device_profile(t, steps=20)
        if t.graphs is not None:
            res.setdefault("graphs", {})[n] = t.graphs.stats()
        print(n, res["interleaved"][n]["median_ms"], res["host"][n], res["device"][n]["device_us_per_step"]
              if res["device"][n] else None, flush=True)
        write(args.out, res)


if __name__ == "__main__":
    main()
