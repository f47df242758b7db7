"""Eager against captured (``capture: true``, CUDA graphs of the micro-batch) training, side by
side in one process, interleaved run by run (issue 13).

    python3 bench/capture_bench.py --data-dir /tmp/cifar --out bench/results/capture/h200_capture.json

Each pair trains the shipped static config (``configs/cifar10_jpeg_resnet18.yaml``, ResNet-18,
CIFAR-10 JPEG pack) with one override set, once eager and once captured, same seed; pairs named
in ``--seeded`` repeat over ``--seeds``. Reported per run: val acc, epoch times, the score's
steady epoch time, peak memory (the graph pool included), efficiency, captures, replays and the
recording time (inside the first epochs' times, reported apart too); per pair the mean +- std
over seeds and the captured / eager ratios.
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402
from search_vs_static import WARM_HELP, stats, train, warm_run  # noqa: E402  (one way to train and summarise a run)

ROOT = Path(__file__).resolve().parents[1]

TRIACCEL = {"mode": "triaccel", "amp_dtype": "fp16",
            "triaccel": {"control_every": 50, "precision": {"scale": "relative"},
                         "curvature": {"method": "fisher", "every": 200, "lr_rule": "normalized"},
                         "batch": {"enabled": False}}}
def merge(a: dict, b: dict) -> dict:
    out = copy.deepcopy(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


START = {"mode": "triaccel", "amp_dtype": "fp16", "batch_size": 96,
         "triaccel": {"control_every": 50, "precision": {"scale": "relative", "tau_low": 1000.0, "tau_high": 10000.0},
                      "curvature": {"method": "fisher", "every": 200, "lr_rule": "normalized", "tau_curv": 1000.0,
                                    "alpha": 0.001},
                      "batch": {"policy": "score", "mode": "paper", "max_batch": 2048, "grow_factor": 1.66,
                                "rho_high": 0.865, "delta_down": 80, "lr_rule": "none"}}}
OFF_FP16 = {"mode": "triaccel", "amp_dtype": "fp16", "batch_size": 96,
            "triaccel": {"precision": {"enabled": False}, "curvature": {"enabled": False},
                         "batch": {"enabled": False}}}
PAIRS = {
    "static_fp16_b512": {"mode": "amp", "amp_dtype": "fp16", "batch_size": 512},
    "static_bf16_b512": {"mode": "amp", "amp_dtype": "bf16", "batch_size": 512},
    "static_bf16_b96": {"mode": "amp", "amp_dtype": "bf16", "batch_size": 96},
    # fp16: the GradScaler's per-step read-back against deferred_skip (not in the default --pairs yet)
    "static_fp16_b96": {"mode": "amp", "amp_dtype": "fp16", "batch_size": 96},
    "static_fp16_b96_deferred": {"mode": "amp", "amp_dtype": "fp16", "batch_size": 96, "deferred_skip": True},
    "triaccel_fisher_b512": {**TRIACCEL, "batch_size": 512},
    # issue 12: where a Tri-Accel trial's score goes at the reference's own setting (bf16, B=96), one controller at a time
    "triaccel_off_b96": {"mode": "triaccel", "amp_dtype": "bf16", "batch_size": 96,
                         "triaccel": {"precision": {"enabled": False}, "curvature": {"enabled": False},
                                      "batch": {"enabled": False}}},
    "triaccel_prec_b96": {"mode": "triaccel", "amp_dtype": "bf16", "batch_size": 96,
                          "triaccel": {"precision": {"scale": "relative"}, "curvature": {"enabled": False},
                                       "batch": {"enabled": False}}},
    "triaccel_fisher_b96": {**TRIACCEL, "amp_dtype": "bf16", "batch_size": 96},
    "triaccel_score_b96": {**TRIACCEL, "amp_dtype": "bf16", "batch_size": 96,
                           "triaccel": {**TRIACCEL["triaccel"],
                                        "batch": {"policy": "score", "mode": "paper", "max_batch": 2048}}},
    # the space's start point (spaces/cifar10_jpeg_resnet18.yaml), as trial 446a928a ran it: 0.95x the reference
    "ta_start_b96": START,
    "ta_start_b96_nobatch": merge(START, {"triaccel": {"batch": {"enabled": False}}}),
    "ta_start_b96_nopromote": merge(START, {"triaccel": {"precision": {"overflow_promote": False}}}),
    "ta_off_b96_fp16": OFF_FP16,
    # where the loop's remaining 9% goes (h200_triaccel_start_diag2.json: controllers off 1.24 s/epoch, static
    # fp16 1.13): the Triton fused SGD against torch's fused SGD over the same per-layer groups, and the
    # control window's host reads (one per 50 steps) against one per 1000
    "ta_off_b96_fp16_torchopt": merge(OFF_FP16, {"triaccel": {"kernels": "torch"}}),
    "ta_off_b96_fp16_window1000": merge(OFF_FP16, {"triaccel": {"control_every": 1000}}),
    # the best Tri-Accel trial of h200_search_vs_static.json (f21cef1a): 1.34 s/epoch alone but 1.90 GiB
    "triaccel_trial_f21cef1a": {**TRIACCEL, "amp_dtype": "bf16", "batch_size": 192,
                                "triaccel": {**TRIACCEL["triaccel"],
                                             "precision": {"scale": "relative", "tau_low": 625.0, "tau_high": 4120.0},
                                             "curvature": {"method": "fisher", "every": 200, "lr_rule": "normalized",
                                                           "tau_curv": 512.0, "alpha": 0.0886},
                                             "batch": {"policy": "score", "mode": "paper", "max_batch": 2048,
                                                       "grow_factor": 1.72, "rho_high": 0.74, "delta_down": 64,
                                                       "lr_rule": "sqrt"}}},
    "triaccel_elastic_b96": {**TRIACCEL, "batch_size": 96,
                             "triaccel": {**TRIACCEL["triaccel"],
                                          "batch": {"policy": "score", "mode": "paper", "max_batch": 2048}}},
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--pairs", default="static_fp16_b512,static_bf16_b512,static_bf16_b96,triaccel_fisher_b512,"
                                       "triaccel_elastic_b96", help=f"comma-separated, of: {', '.join(PAIRS)}")
    ap.add_argument("--seeded", default="static_fp16_b512", help="pairs repeated over --seeds")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--modes", default="eager,captured", help="eager, captured or both")
    ap.add_argument("--warm-epochs", type=int, default=2, help=WARM_HELP)
    args = ap.parse_args()
    base = yaml.safe_load((ROOT / "configs" / "cifar10_jpeg_resnet18.yaml").read_text())
    base = merge(base, {"epochs": args.epochs, "data": {"data_dir": args.data_dir},
                        "optim": {"warmup_epochs": 2}})
    res = {"what": __doc__.split("\n\n")[0], "epochs": args.epochs, "base": "configs/cifar10_jpeg_resnet18.yaml",
           "runs": {}, "pairs": {}}
    seeds = [int(s) for s in args.seeds.split(",")]
    todo = [(p, s) for s in seeds for p in args.pairs.split(",") if s == seeds[0] or p in args.seeded.split(",")]
    warm_run(merge(base, {**PAIRS[todo[0][0]], "capture": "captured" in args.modes}), args.warm_epochs)
    for pair, seed in todo:
        for capture in [m == "captured" for m in args.modes.split(",")]:
            name = f"{pair}_{'captured' if capture else 'eager'}"
            r = train(merge(base, {**PAIRS[pair], "capture": capture}), seed)
            res["runs"].setdefault(name, {})[str(seed)] = r
            print(f"{name} seed {seed}: val {r['val_acc']:.2f} epoch {r['epoch_time_last5_s']:.3f}s "
                  f"peak {r['peak_mem_gib']:.3f} GiB eff {r['efficiency']:.1f} "
                  f"{'captures %d replays %d capture_s %.2f' % (r['captures'], r['replays'], r['capture_s']) if capture else ''} "
                  f"B/epoch {r['batch_per_epoch']} peak/epoch {[round(x, 3) for x in r['peak_per_epoch']]} "
                  f"pool/epoch {[x if x is None else round(x, 3) for x in r['pool_per_epoch']]} "
                  f"levels {r.get('levels')} ctrl {r.get('ctrl_timing_s')} plan {r.get('plan_changes')} "
                  f"batch {r.get('batch_actions')} skipped {r.get('skipped_steps')}",
                  flush=True)
        if f"{pair}_eager" not in res["runs"] or f"{pair}_captured" not in res["runs"]:
            write(args.out, res)
            continue
        ev, cp = res["runs"][f"{pair}_eager"], res["runs"][f"{pair}_captured"]
        summ = {}
        for k in ("efficiency", "epoch_time_last5_s", "peak_mem_gib", "val_acc"):
            summ[k] = {"eager": stats([r[k] for r in ev.values()]), "captured": stats([r[k] for r in cp.values()])}
        summ["captured_over_eager"] = {k: summ[k]["captured"]["mean"] / summ[k]["eager"]["mean"]
                                       for k in ("efficiency", "epoch_time_last5_s", "peak_mem_gib")}
        summ["val_acc_diff_pp"] = summ["val_acc"]["captured"]["mean"] - summ["val_acc"]["eager"]["mean"]
        res["pairs"][pair] = summ
        write(args.out, res)


if __name__ == "__main__":
    main()
