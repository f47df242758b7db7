"""FP32 and static AMP (bf16) ResNet-18 on CIFAR-10: epoch time, peak memory, accuracy, img/s.

    python3 bench/train_baselines.py --data-dir /tmp/cifar --epochs 5 --out bench/results/baselines/h200_baselines.json
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402

from triaccel.config import load_config  # noqa: E402
from triaccel.trainer import Trainer  # noqa: E402


def base(args, **over) -> list[str]:
    d = {"data.name": args.dataset, "data.data_dir": args.data_dir, "model.name": args.model, "epochs": args.epochs,
         "tracking.enabled": False, "evaluate_test": True, "optim.warmup_epochs": 1, "optim.lr": 0.1}
    d.update(over)
    return [f"{k}={v}" for k, v in d.items()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--dataset", default="imagefolder")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batches", default="96,512")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra config for every run, e.g. --set channels_last=true")
    ap.add_argument("--modes", default="fp32,amp_bf16")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    runs = {}
    for b in [int(x) for x in args.batches.split(",")]:
        for mode, extra in (("fp32", {}), ("amp_bf16", {"mode": "amp", "amp_dtype": "bf16"})):
            if mode not in args.modes.split(","):
                continue
            per_seed = []
            for seed in [int(s) for s in args.seeds.split(",")]:
                over = {"batch_size": b, "seed": seed, "optim.lr": 0.1 * b / 256 * 2, **extra}
                if mode == "fp32":
                    over["mode"] = "fp32"
                cfg = load_config(None, base(args, **over) + args.set)
                t = Trainer(cfg, log=lambda s: print(f"[{mode} B{b} s{seed}] {s}", flush=True)).setup()
                s = t.fit()
                s["epochs_detail"] = [{k: e.get(k) for k in ("epoch", "epoch_time_s", "images_per_s", "val_acc",
                                                         "peak_mem_gib", "peak_reserved_gib", "train_loss")}
                                      for e in t.history.epochs]
                per_seed.append(s)
            agg = {}
            for k in ("val_acc", "test_acc", "epoch_time_last5_s", "peak_mem_gib", "efficiency", "images_per_s_last"):
                vals = [r[k] for r in per_seed]
                agg[k] = {"mean": statistics.fmean(vals), "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                          "median": statistics.median(vals)}
            runs[f"{mode}_bs{b}"] = {"summary": agg, "runs": per_seed}
            print(mode, b, {k: round(v["mean"], 3) for k, v in agg.items()}, flush=True)
    write(args.out, {"what": "ResNet-18 CIFAR-10 (JPEG ImageFolder) baselines, device-resident pipeline",
                     "extra_config": args.set,
                     "epochs": args.epochs, "runs": runs})


if __name__ == "__main__":
    main()
