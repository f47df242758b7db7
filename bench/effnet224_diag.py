"""Where an EfficientNet-B0 epoch at 224 px goes (issue 14 case 15): static AMP against Tri-Accel with
its defaults, with cuDNN autotuning on and off and the controllers switched off one at a time.

    python3 bench/effnet224_diag.py --data-dir /tmp/cifar --subset 5 --out bench/results/effnet224/h200_effnet224_diag.json

Each variant trains ``--epochs`` epochs of configs/cifar10_jpeg_resnet18.yaml with
model.name=efficientnet_b0 model.resize=224, in a fresh process (cuDNN's autotuning cache lives
in the process: a variant after another would find its shapes tuned). ``--subset N`` trains on
every N-th training image (a copy of the ImageFolder tree with links), so one variant takes a
minute, not ten. The triaccel-* variants are the paper's rules (the defaults when they were first
measured), score* the defaults since 2026-12-01. Reported per variant: epoch times, batch sizes, peak memory, the final precision
plan and the control loop's own timing (seconds in each controller).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
P = ["mode=triaccel", "triaccel.policy=paper"]  # the defaults until 2026-12-01, when these were recorded
VARIANTS = {  # name -> --set overrides on top of the EfficientNet-B0 224 px config
    "amp": ["mode=amp"],
    "amp-nobench": ["mode=amp", "cudnn_benchmark=false"],
    "triaccel": P,
    "triaccel-bench": [*P, "cudnn_benchmark=true"],
    "triaccel-nobatch": [*P, "triaccel.batch.enabled=false"],
    "triaccel-noprec": [*P, "triaccel.precision.enabled=false", "triaccel.batch.enabled=false"],
    "triaccel-nocurv": [*P, "triaccel.curvature.enabled=false", "triaccel.batch.enabled=false"],
    "triaccel-fisher": [*P, "triaccel.curvature.method=fisher", "triaccel.batch.enabled=false"],
    "triaccel-nocurv-nobench": [*P, "triaccel.curvature.enabled=false", "triaccel.batch.enabled=false",
                                "cudnn_benchmark=false"],
    "triaccel-off-nobench": [*P, "triaccel.precision.enabled=false", "triaccel.curvature.enabled=false",
                             "triaccel.batch.enabled=false", "cudnn_benchmark=false"],
    "triaccel-off": [*P, "triaccel.precision.enabled=false", "triaccel.curvature.enabled=false",
                     "triaccel.batch.enabled=false"],
    # the defaults from 2026-12-01 (score-aimed rules: relative tau, Fisher curvature, score batch)
    "score": ["mode=triaccel"],
    "score-nobatch": ["mode=triaccel", "triaccel.batch.enabled=false"],
    "score-bench": ["mode=triaccel", "cudnn_benchmark=true"],  # autotuning on while the batch explores
    # a training split that is a whole number of batches of 96 and of 64 (45,120: 488 of each 5,000 held out): no short last batch
    "amp-even": ["mode=amp", "data.val_fraction=0.0976"],
    "score-even": ["mode=triaccel", "data.val_fraction=0.0976"],
    "score-nobatch-even": ["mode=triaccel", "triaccel.batch.enabled=false", "data.val_fraction=0.0976"],
    "score-nocurv": ["mode=triaccel", "triaccel.batch.enabled=false", "triaccel.curvature.enabled=false"],
    "score-noprec": ["mode=triaccel", "triaccel.batch.enabled=false", "triaccel.precision.enabled=false"],
}


def subset_tree(src: Path, dst: Path, every: int) -> None:
    """Every ``every``-th training image of each class (the test split whole), linked, not copied."""
    if dst.exists():
        return
    for split in ("train", "test"):
        for cls in sorted(p for p in (src / split).iterdir() if p.is_dir()):
            files = sorted(cls.iterdir())
            if split == "train":
                files = files[::every]
            (dst / split / cls.name).mkdir(parents=True, exist_ok=True)
            for f in files:
                os.symlink(f.resolve(), dst / split / cls.name / f.name)


def one(args) -> None:
    from search_vs_static import train  # the comparison's own measuring (epoch times, plan, timing)

    from triaccel.config import load_config, to_dict

    sets = [f"data.data_dir={args.data_dir}", f"model.name={args.model}", f"model.resize={args.resize}",
            f"epochs={args.epochs}", f"optim.warmup_epochs={args.warmup_epochs}",
            *VARIANTS[args.one]]
    cfg = to_dict(load_config(ROOT / "configs" / "cifar10_jpeg_resnet18.yaml", sets))
    t0 = time.perf_counter()
    r = train(cfg, args.seed)
    r["wall_s"] = time.perf_counter() - t0
    r["sets"] = sets
    print("RESULT " + json.dumps(r, default=str), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--subset", type=int, default=5)
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated; NAME@TAG runs NAME again under another key (a warm-up, a repeat)")
    ap.add_argument("--timeout", type=int, default=150, help="seconds per variant")
    ap.add_argument("--warmup-epochs", type=int, default=1, help="optim.warmup_epochs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default="efficientnet_b0")
    ap.add_argument("--resize", default="224", help="model.resize (null: none)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        return one(args)
    data = Path(args.data_dir)
    if args.subset > 1:
        data = Path(f"/tmp/effnet224_subset{args.subset}")
        subset_tree(Path(args.data_dir), data, args.subset)
    res = {"what": __doc__.split("\n\n")[0], "subset_every": args.subset, "epochs": args.epochs, "runs": {}}
    for v in args.variants.split(","):
        t0 = time.perf_counter()
        try:
            p = subprocess.run([sys.executable, __file__, "--data-dir", str(data), "--out", args.out, "--epochs",
                                str(args.epochs), "--model", args.model, "--resize", args.resize, "--one", v.split("@")[0],
                                "--warmup-epochs", str(args.warmup_epochs), "--seed", str(args.seed)], capture_output=True, text=True, timeout=args.timeout)
            line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
            r = json.loads(line[-1][7:]) if line else {"rc": p.returncode, "stderr": p.stderr[-2000:]}
            r["log"] = [x for x in p.stdout.splitlines() if not x.startswith(("RESULT", "step"))][-30:]
        except subprocess.TimeoutExpired as e:
            r = {"timeout_s": args.timeout, "log": (e.stdout or b"").decode(errors="replace").splitlines()[-30:]}
        r["process_s"] = time.perf_counter() - t0
        res["runs"][v] = r
        print(v, {k: r.get(k) for k in ("epoch_times", "batch_per_epoch", "peak_mem_gib", "levels", "ctrl_timing_s",
                                        "val_acc", "process_s", "timeout_s")}, flush=True)
        write(args.out, res)


if __name__ == "__main__":
    main()
