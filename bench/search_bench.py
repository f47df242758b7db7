"""A CIFAR-10 ResNet-18 search with trials sharing the GPU against the same search one at a time.

    python3 bench/search_bench.py --data-dir /tmp/cifar --trials 16 --epochs 3 --out bench/results/packing/h200_search.json

Both searches draw the same 16 configurations (same sampler seed, no early stopping, so both
do the same work). Reported per search: wall time, trials per hour, the GPU memory each trial
measured (allocator peak) and the whole device's peak (NVML, sampled every 0.2 s), and the
best efficiency score found, with how many trials shared the GPU when it was measured.

``--which`` also takes ``packed-eager``, ``packed-captured``, ``alone-eager`` and
``alone-captured`` (issue 13: a packed search with the eager step against the same search with
the captured one; plain ``packed`` / ``alone`` keep the space's ``capture``):

    python3 bench/search_bench.py --data-dir /tmp/cifar --trials 8 --epochs 3 \
        --which packed-eager,packed-captured --out bench/results/packing/h200_search_capture.json

Each search trains one static baseline first (the space's 12 would dominate the wall time);
``trials_per_hour`` counts the trial phase only (first trial start to last trial end, from
MLflow), ``wall_s`` the whole search.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402


class NvmlPeak(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self.stop = 0, False

    def run(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # no NVIDIA device (a CPU smoke run)
            return
        while not self.stop:
            self.peak = max(self.peak, pynvml.nvmlDeviceGetMemoryInfo(h).used)
            time.sleep(0.2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--packed", type=int, default=4)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--which", default="packed,alone", help="which searches to run (packed, alone)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.environ["TRIACCEL_TUNE_DIR"] = str(Path("mlruns/tune").resolve())
    from triaccel.search.results import trial_table
    from triaccel.search.runner import run_search
    from triaccel.search.state import open_store

    space = yaml.safe_load((Path(__file__).resolve().parents[1] / "spaces" / "cifar10_jpeg_resnet18.yaml").read_text())
    space["train"]["data"]["data_dir"] = args.data_dir
    space["train"]["epochs"] = args.epochs
    optim = space["train"].setdefault("optim", {})
    if optim.get("warmup_epochs") is not None:  # a short bench keeps a valid warm-up
        optim["warmup_epochs"] = min(optim["warmup_epochs"], args.epochs)
    space["train"]["batch_size"] = args.batch
    space["train"]["model"]["name"] = args.model
    space.update(trials=args.trials, scheduler="none", sampler="random", seed=0, grace_period=1)
    space["baseline"] = dict(space.get("baseline", {}), batch_sizes=[args.batch], amp_dtypes=["fp16"],
                             capture=[True])
    # decode the JPEGs into the on-disk cache once, here, so neither search pays for it (nor do 4 trials at once)
    from triaccel.config import DataConfig
    from triaccel.data import load_splits

    t0 = time.perf_counter()
    load_splits(DataConfig(**space["train"]["data"]))
    print(f"data cache ready in {time.perf_counter() - t0:.1f} s", flush=True)
    res = {}
    which = args.which.split(",")
    setups = {"packed": (args.packed, 1.0 / args.packed), "alone": (1, 1.0)}
    captures = {"": space["train"].get("capture", False), "-eager": False, "-captured": True}
    for label in which:  # in the order asked: a run cut by a time limit keeps the first
        how, _, cap = label.partition("-")
        if how not in setups or (cap and f"-{cap}" not in captures):
            ap.error(f"--which: {label!r} is not one of packed, alone, packed-eager, packed-captured, "
                     "alone-eager, alone-captured")
        conc, gpt = setups[how]
        space.update(concurrency=conc, gpus_per_trial=gpt)
        space["train"]["capture"] = captures[f"-{cap}" if cap else ""]
        p = Path(f"/tmp/space_{label}.yaml")
        p.write_text(yaml.safe_dump(space))
        mon = NvmlPeak()
        mon.start()
        t0 = time.perf_counter()
        run_search(str(p), name=f"bench_{label}", confirm=0)  # the searches alone, no re-runs
        wall = time.perf_counter() - t0
        mon.stop = True
        c, exp = open_store(os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlruns/mlflow.db")
        rows = trial_table(c, exp, f"bench_{label}")
        done = [r for r in rows if r["status"] == "FINISHED"]
        best = max(done, key=lambda r: r["metrics"]["efficiency"])
        runs = [c.get_run(r["run_id"]).info for r in rows]
        phase = (max(i.end_time for i in runs if i.end_time) - min(i.start_time for i in runs)) / 1000
        res[label] = {
            "concurrency": conc, "gpus_per_trial": gpt, "capture": space["train"]["capture"], "wall_s": wall,
            "trial_phase_s": phase, "trials_finished": len(done),
            "trials_per_hour": 3600 * len(done) / phase,
            "trial_peak_mem_gib_median": statistics.median(r["metrics"]["peak_mem_gib"] for r in done),
            "trial_peak_mem_gib_max": max(r["metrics"]["peak_mem_gib"] for r in done),
            "device_peak_used_gib_nvml": mon.peak / 2**30,
            "epoch_time_last5_s_median": statistics.median(r["metrics"]["epoch_time_last5_s"] for r in done),
            "best_efficiency": best["metrics"]["efficiency"], "best_val_acc": best["metrics"]["val_acc"],
            "best_values": best["values"], "shared_trials": best["metrics"].get("shared_trials")}
        print(label, res[label], flush=True)
        if "packed" in res and "alone" in res:
            res["packed_vs_alone_throughput_x"] = res["packed"]["trials_per_hour"] / res["alone"]["trials_per_hour"]
        for how in setups:
            if f"{how}-eager" in res and f"{how}-captured" in res:
                res[f"{how}_captured_vs_eager_throughput_x"] = (res[f"{how}-captured"]["trials_per_hour"]
                                                                / res[f"{how}-eager"]["trials_per_hour"])
        # written after each search, so a run cut by a time limit keeps what finished
        write(args.out, {"what": "the same random-sampled search packed on one GPU vs one trial at a time",
                         "trials": args.trials, "epochs": args.epochs, "batch": args.batch, "results": res})


if __name__ == "__main__":
    main()
