"""What idle controllers cost (issue 31): the Tri-Accel loop at the exported settings against the
static captured + compiled step at equal batch and dtype, over whole epochs, with the host's launches
and syncs counted.

    python3 bench/idle_cost.py --data-dir /tmp/cifar --out bench/results/idle_cost/h200_idle_cost.json

Variants (the space's train section: ResNet-18, CIFAR-10 JPEG pack, B=96, fp16, captured; compiled):
  static          mode amp: the space's baseline amp-fp16-B96-captured-compiled
  export          the space's third start point (bf16 momentum, compiled forward), controllers as a trial runs them
  export_nobatch  the same with the memory-elastic batch off
  export_off      the same with every controller off (what is left: the loop's plumbing)

Each variant trains ``--epochs`` epochs per seed (seeds in turn, variants interleaved within a seed, so
drift falls on all alike). Epoch times: epochs 2 .. E-1 (the first holds the compile and the recordings;
the last is profiled). In the last epoch, ``--profile-steps`` steps under torch.profiler: CUDA ops per
step and the host's CUDA runtime calls per step (launches, graph launches, synchronisations, copies);
then as many steps under cProfile: the host functions that take the time. Profiled steps are not timed.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402

from triaccel.config import from_dict, TrainConfig  # noqa: E402
from triaccel.control import build_trainer  # noqa: E402
from triaccel.trainer import Callback  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("static", "export", "export_nobatch", "export_off", "export_fp32state", "export_off_fp32state", "static2")
OFF = {"precision": {"enabled": False}, "curvature": {"enabled": False}, "batch": {"enabled": False}}


def train_dict(space, variant: str, data_dir: str, epochs: int, seed: int) -> dict:
    from triaccel.search.space import set_dotted

    if variant in ("static", "static2"):  # static2: the same again, later in the process (drift)
        d = dict(space.baseline_runs())["amp-fp16-B96-captured-compiled"]
    else:
        d = space.train_dict(space.resolve(space.start[2]))
        if variant == "export_nobatch":
            set_dotted(d, "triaccel.batch.enabled", False)
        if variant.startswith("export_off"):
            for k, v in OFF.items():
                set_dotted(d, f"triaccel.{k}.enabled", v["enabled"])
        if variant.endswith("fp32state"):
            set_dotted(d, "triaccel.precision.optimizer_state", "fp32")
    d.update(epochs=epochs, seed=seed, evaluate_test=False)
    d["data"] = {**d["data"], "data_dir": data_dir}
    if data_dir == "smoke":  # checks the script on a CPU in seconds: not a figure
        d.update(device="cpu", compile=None, capture=False, data={"name": "digits", "val_fraction": 0.15},
                 model={"name": "small_cnn", "width": 8}, batch_size=64)
    d.setdefault("tracking", {})["enabled"] = False
    return d


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Probe(Callback):
    """Profiles steps [start, start+n) of the last epoch under torch.profiler, then the next n under cProfile."""

    def __init__(self, epochs: int, n: int, start: int = 20, host: bool = False):
        self.last, self.n, self.start, self.host = epochs - 1, n, start, host
        self.k, self.prof, self.cprof, self.out = 0, None, None, {}

    def on_step_end(self, tr, info):
        if tr.epoch != self.last:
            return None
        self.k += 1
        a, b, c = self.start, self.start + self.n, self.start + 2 * self.n
        if self.k == a:
            from torch.profiler import ProfilerActivity, profile

            _sync()
            self.prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            self.prof.__enter__()
        elif self.k == b:
            _sync()
            self.prof.__exit__(None, None, None)
            self.out.update(count_events(self.prof, self.n))
            if self.host:  # one cProfile at a time in a process: interleaved trainers take turns via --cprofile
                self.cprof = cProfile.Profile()
                self.cprof.enable()
        elif self.k == c and self.cprof is not None:
            _sync()
            self.cprof.disable()
            s = io.StringIO()
            pstats.Stats(self.cprof, stream=s).sort_stats("tottime").print_stats(30)
            self.out["cprofile_top_tottime"] = s.getvalue().splitlines()[:45]
        return None


def count_events(prof, steps: int) -> dict:
    from torch.autograd import DeviceType

    runtime, ops, dev_us, by_name = {}, 0, 0.0, {}
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            ops += 1
            dev_us += e.time_range.elapsed_us()
            c = by_name.setdefault(e.name[:100], [0, 0.0])
            c[0] += 1
            c[1] += e.time_range.elapsed_us()
        elif e.name.startswith(("cuda", "cu")) and not e.name.startswith("cudnn"):
            runtime[e.name] = runtime.get(e.name, 0) + 1
    syncs = sum(v for k, v in runtime.items() if "Synchronize" in k)
    return {"device_ops_per_step": ops / steps, "device_us_per_step": dev_us / steps,
            "host_syncs_per_step": syncs / steps,
            "device_by_kernel": {k: {"per_step": c / steps, "us_per_step": u / steps}
                                 for k, (c, u) in sorted(by_name.items(), key=lambda kv: -kv[1][1])},
            "runtime_calls_per_step": {k: v / steps for k, v in sorted(runtime.items(), key=lambda kv: -kv[1])}}


def interleaved(space, variants: list[str], args, seed: int) -> dict:
    """Every variant's trainer built first, then their epochs in turn (variant A's epoch e, B's epoch e, ...,
    then e + 1): drift in clocks and host load falls on all alike, as in one Trainer.fit each."""
    from contextlib import ExitStack

    trainers, probes = {}, {}
    for v in variants:  # built before any compiles: CompiledForward resets torch's caches when it is made
        cfg = from_dict(TrainConfig, train_dict(space, v, args.data_dir, args.epochs, seed))
        probes[v] = Probe(args.epochs, args.profile_steps, host=v == args.cprofile)
        trainers[v] = build_trainer(cfg, callbacks=[probes[v]], log=lambda *a, v=v: print(f"  [{v}]", *a))
    with ExitStack() as stack:  # one cuBLAS workspace setting for all (the same config key in each)
        for t in trainers.values():
            stack.enter_context(t.cublas_scope())
        for _ in range(args.epochs):
            for t in trainers.values():  # Trainer.fit's loop body
                m = t.train_epoch()
                t.history.epochs.append(m)
                t.epoch += 1
                for cb in t.callbacks:
                    t.apply(cb.on_epoch_end(t, m))
    out = {}
    for v, t in trainers.items():
        times = [e["epoch_time_s"] for e in t.history.epochs]
        last = t.history.epochs[-1]
        out[v] = {"epoch_times_s": times, "steady_median_s": statistics.median(times[1:-1]), "steps": last["steps"],
                  "batch_size": last["batch_size"], "val_acc": last["val_acc"], "peak_mem_gib": last["peak_mem_gib"],
                  "compiled_graphs": last.get("compiled_graphs"), "graph_breaks": last.get("graph_breaks"),
                  "compile_disabled": last.get("compile_disabled"), "graph_keys": last.get("graph_keys"),
                  "replays": last.get("replays"), "captures": last.get("captures"), **probes[v].out}
        if t.loop is not None:
            out[v]["ctrl"] = {k: last.get(k) for k in last if k.startswith("ctrl_")}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--space", default=str(ROOT / "spaces/cifar10_jpeg_resnet18.yaml"))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--profile-steps", type=int, default=200)
    ap.add_argument("--cprofile", default=None, help="the one variant whose host functions cProfile records")
    ap.add_argument("--label", default="", help="what this code is (before/after), recorded with the revision")
    ap.add_argument("--rev", default=None, help="the git revision (the GPU machine's copy has no .git)")
    args = ap.parse_args()
    from triaccel.search.space import load_space

    space = load_space(args.space)
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    res = {"what": __doc__.split("\n\n")[0], "label": args.label, "git_revision": args.rev or rev or None,
           "epochs": args.epochs, "runs": {}}
    import torch._dynamo

    # every trainer here compiles the same forward code: the limit is per code object, not per run
    for k in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, k):
            setattr(torch._dynamo.config, k, 64)
    for seed in (int(s) for s in args.seeds.split(",")):
        for v, r in interleaved(space, args.variants.split(","), args, seed).items():
            res["runs"].setdefault(v, {})[str(seed)] = r
            print(v, seed, r["epoch_times_s"], "syncs/step", r.get("host_syncs_per_step"),
                  "ops/step", r.get("device_ops_per_step"), "device us/step", r.get("device_us_per_step"), flush=True)
        write(args.out, res)
    base = res["runs"].get("static")
    if base:
        for v, by_seed in res["runs"].items():
            ratios = [by_seed[s]["steady_median_s"] / base[s]["steady_median_s"] for s in by_seed if s in base]
            res.setdefault("vs_static", {})[v] = {"ratio_median": statistics.median(ratios), "ratios": ratios}
        write(args.out, res)


if __name__ == "__main__":
    main()
