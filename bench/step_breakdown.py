"""Where does our training step lose to a plain PyTorch loop? One process, same model, same batch.

    python3 bench/step_breakdown.py --data-dir /tmp/cifar --out bench/results/profile/h200_step_breakdown.json

Variants (each: warmed up, median of synchronised blocks via triaccel.measure.bench):
  plain            the guide's loop: fixed device batch, torch.optim.SGD, autocast, NCHW
  plain_cl         the same in channels_last
  plain_data       plain + our device-resident crop/flip/normalise batch every step
  trainer          Trainer.train_step (static AMP, defaults: NHWC on CUDA) with its real input pipeline
  trainer_fixed    Trainer.train_step with the batch fixed (isolates the input pipeline)
  trainer_nchw     Trainer with channels_last=false (the default before the first run of this script)
  trainer_nobench  Trainer with cudnn_benchmark=false
  trainer_triton_data  Trainer with data.kernel=triton (batch assembled in one launch)
Every variant runs the same ResNet-18 at the same batch and dtype.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402

from triaccel.config import load_config  # noqa: E402
from triaccel.measure import bench  # noqa: E402
from triaccel.trainer import Trainer  # noqa: E402

DT = {"bf16": torch.bfloat16, "fp32": None}
WARM, REPEATS, INNER = 30, 10, 20


def trainer(args, b, dtype, **over):
    d = {"data.name": args.dataset, "data.data_dir": args.data_dir, "model.name": "resnet18", "epochs": 1,
         "tracking.enabled": False, "batch_size": b, "mode": "fp32" if dtype == "fp32" else "amp",
         "amp_dtype": "bf16" if dtype == "fp32" else dtype, "optim.warmup_epochs": 0}
    d.update(over)
    t = Trainer(load_config(None, [f"{k}={v}" for k, v in d.items()]), log=lambda *a: None).setup()
    t.model.train()
    t.sampler.start_epoch(0)
    return t


def time_trainer(t, b, fixed=False):
    if fixed:
        idx = t.sampler.take(b)
        xb = t.train_data.batch(idx, train=True)
        t.train_data.batch = lambda *_a, **_k: xb

    def step():
        if t.sampler.remaining < b:
            t.sampler.start_epoch(t.sampler.epoch + 1)
        t.train_step(t.sampler.take(b))

    return bench(step, t.device, warmup=WARM, repeats=REPEATS, inner=INNER)


def time_plain(t, b, dtype, channels_last=False, data=False):
    """The guide's loop on the trainer's model architecture (fresh weights) and data."""
    from triaccel.models import build_model

    dev = t.device
    m = build_model(t.cfg.model, t.splits.num_classes, t.splits.in_channels, t.splits.image_size).to(dev)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    m = m.to(memory_format=fmt)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    x0, y0 = t.train_data.batch(t.sampler.take(b), train=True)
    x0 = x0.contiguous(memory_format=fmt)

    def step():
        if data:
            if t.sampler.remaining < b:
                t.sampler.start_epoch(t.sampler.epoch + 1)
            x, y = t.train_data.batch(t.sampler.take(b), train=True)
            x = x.contiguous(memory_format=fmt)
        else:
            x, y = x0, y0
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=DT[dtype], enabled=DT[dtype] is not None):
            loss = F.cross_entropy(m(x).float(), y)
        loss.backward()
        opt.step()

    return bench(step, dev, warmup=WARM, repeats=REPEATS, inner=INNER)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--dataset", default="imagefolder")
    ap.add_argument("--batches", default="96,512")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    res, errors = {}, {}
    for dtype in args.dtypes.split(","):
        for b in [int(x) for x in args.batches.split(",")]:
            t = trainer(args, b, dtype)
            r = {"plain": time_plain(t, b, dtype), "plain_cl": time_plain(t, b, dtype, channels_last=True),
                 "plain_data": time_plain(t, b, dtype, data=True), "trainer": time_trainer(t, b)}
            r["trainer_fixed"] = time_trainer(trainer(args, b, dtype), b, fixed=True)
            r["trainer_nchw"] = time_trainer(trainer(args, b, dtype, channels_last="false"), b)
            r["trainer_nobench"] = time_trainer(trainer(args, b, dtype, cudnn_benchmark="false"), b)
            try:  # the opt-in kernel must not cost the other variants' figures if it fails on this machine
                r["trainer_triton_data"] = time_trainer(trainer(args, b, dtype, **{"data.kernel": "triton"}), b)
            except Exception as e:  # noqa: BLE001
                errors[f"{dtype}_bs{b}_trainer_triton_data"] = f"{type(e).__name__}: {e}"[:500]
                print("trainer_triton_data failed:", errors, flush=True)
            torch.backends.cudnn.benchmark = True
            out = {k: {"median_ms": 1e3 * v["median_s"], "mean_ms": 1e3 * v["mean_s"], "std_ms": 1e3 * v["std_s"],
                       "img_s": b / v["median_s"]} for k, v in r.items()}
            res[f"{dtype}_bs{b}"] = out
            print(dtype, b, {k: round(v["median_ms"], 2) for k, v in out.items()}, flush=True)
            del t
            torch.cuda.empty_cache()
            # written after every configuration: a run cut by a time limit keeps what it measured
            write(args.out, {"what": "plain PyTorch step vs our trainer's step, same model/batch; median ms of "
                                     "10 synchronised blocks of 20 steps after 30 warm-up steps",
                             "results": res, "errors": errors})


if __name__ == "__main__":
    main()
