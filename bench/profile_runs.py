"""`triaccel profile` of ResNet-18 / CIFAR-10 at batch 96 and 512, fp32 and bf16 (issue: where the time goes).

    python3 bench/profile_runs.py --data-dir /tmp/cifar --out bench/results/profile

Writes one folder per (batch, mode) with report.json, report.txt, trace.json, top_ops.txt.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import env  # noqa: E402

from triaccel.config import load_config  # noqa: E402
from triaccel.profile import format_report, run_profile  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--dataset", default="imagefolder")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batches", default="96,512")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    summary = {"env": env(), "runs": {}}
    for b in [int(x) for x in args.batches.split(",")]:
        cfg = load_config(None, [f"data.name={args.dataset}", f"data.data_dir={args.data_dir}",
                                 f"model.name={args.model}", f"batch_size={b}", "mode=amp", "amp_dtype=bf16",
                                 "tracking.enabled=false"])
        rep = run_profile(cfg, steps=args.steps, warmup=10, out_dir=Path(args.out) / f"bs{b}")
        print(format_report(rep), flush=True)
        summary["runs"][f"bs{b}"] = {k: {kk: vv for kk, vv in v.items() if kk not in ("top_ops",)}
                                     for k, v in rep["variants"].items()}
    (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    main()
