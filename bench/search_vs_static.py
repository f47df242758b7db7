"""The question the service exists to answer: does the exported config beat what the user
would have run anyway? (issue 12)

    python3 bench/search_vs_static.py --data-dir /tmp/cifar --out bench/results/search/h200_search_vs_static.json

1. The default search of ``spaces/cifar10_jpeg_resnet18.yaml`` as shipped (16 trials, four
   sharing the GPU, its own static baselines, the top 3 confirmed alone) -> ``triaccel export``.
2. The exported config trained alone for ``--epochs`` epochs, and static AMP (the space's own
   ``train`` settings in ``amp`` mode, its optimizer and warm-up as the search's baselines have
   them, without checkpointing) at each ``--static`` dtype:batch, alone, same epochs, over
   ``--seeds`` (``--static-once`` runs take the first seed only).
   Runs are interleaved seed by seed in one process; the JSON is rewritten after each run.
Reported: per run and seed val acc, epoch time (mean of the last 5), peak memory, efficiency;
mean +- std over seeds; the ratio exported / best static (by mean efficiency) and the
accuracy difference. ``--tuned FILE`` skips the search and trains FILE; ``--search-only`` stops
after the export (the exported config is written beside ``--out``, for a later ``--tuned``).
``--process-per-run`` trains each run in a process of its own, as a user's ``triaccel train`` does: no
run meets the cuDNN plan cache, compiled code or allocator another run left (in one process, a
convolution's kernel is chosen by the first run that meets its shape and dtype, for every later run).
``--resume FILE`` continues a comparison that one device command could not finish (its 600 s limit):
the runs in FILE stay, the rest are trained, each run records which command (``part``) trained it.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def fit_alone(d: dict, seed: int):
    """One training run of config ``d`` at ``seed``, alone, tracking off and no test set:
    (trainer, summary, wall seconds). bench/lm_h200.py reads the same run."""
    from triaccel.config import TrainConfig, from_dict
    from triaccel.control import build_trainer

    d = copy.deepcopy(d)
    d.update(seed=seed, evaluate_test=False)
    d["tracking"] = {"enabled": False}
    d.pop("provenance", None)
    t0 = time.perf_counter()
    t = build_trainer(from_dict(TrainConfig, d), log=lambda *a: None, loop_log=print)
    s = t.fit()
    return t, s, time.perf_counter() - t0


def train(d: dict, seed: int) -> dict:
    t, s, wall = fit_alone(d, seed)
    out = {k: s[k] for k in ("val_acc", "epoch_time_last5_s", "peak_mem_gib", "efficiency", "peak_mem_first_epoch_gib")}
    out.update(wall_s=wall, final_batch=t.batch_size,
               epoch_times=[e["epoch_time_s"] for e in t.history.epochs],
               batch_per_epoch=[e["batch_size"] for e in t.history.epochs],
               peak_per_epoch=[e["peak_mem_gib"] for e in t.history.epochs],
               pool_per_epoch=[e.get("graph_pool_gib") for e in t.history.epochs],
               compile_s=t.history.epochs[-1].get("compile_s"),
               compiled_graphs=t.history.epochs[-1].get("compiled_graphs"))
    if t.loop is not None:
        out["ctrl_timing_s"] = dict(t.loop.timing)
        changes, last = [], None  # the precision plan over the run, where it changed: (step, fp16, bf16, fp32)
        for row in t.loop.trajectory:
            c = tuple(row["levels"].count(x) for x in ("fp16", "bf16", "fp32"))
            if c != last:
                changes.append((row["step"], *c))
                last = c
        out["plan_changes"] = changes
        out["batch_actions"] = [(row["step"], row["batch_action"], row["batch_size"]) for row in t.loop.trajectory
                                if row.get("batch_action") not in (None, "hold", "cooldown")]
        # every window: (step, seconds since the first step, B, the batch action, the batch window's seconds)
        out["first_step_s"] = t.loop.first_step_s
        out["windows"] = [(row["step"], row.get("t_s"), row["batch_size"], row.get("batch_action"),
                           row.get("window_s")) for row in t.loop.trajectory]
    out["skipped_steps"] = t.skipped_steps
    if t.loop is not None and t.loop.trajectory:
        lv = t.loop.trajectory[-1]["levels"]
        out["levels"] = {x: lv.count(x) for x in ("fp16", "bf16", "fp32")}
    if t.graphs is not None:
        out.update(t.graphs.stats(), capture_disabled=t.graphs.disabled)
    out["peak_reserved_gib"] = t.history.epochs[-1].get("peak_reserved_gib")
    # what the meter leaves out of every peak (the process's earlier tensors, the resident data) and the
    # allocator's own figure: a run in a process of its own and one after others must differ only in the first
    out.update(held_before_gib=t.held_before_bytes / 2**30, data_gib=t.data_bytes / 2**30,
               peak_alloc_raw_per_epoch=[e.get("peak_alloc_raw_gib") for e in t.history.epochs])
    return out


WARM_HELP = ("epochs of an untimed run before the measured ones (0: none). On the H200 the first run in a "
             "process ran 5%% faster than every later one, whatever it trained (bench/results/step_gap/h200_order.json): "
             "without it, the first run of a comparison is favoured")


def warm_run(d: dict, epochs: int) -> None:
    """Train ``d`` for ``epochs`` and discard it, so that every measured run starts on a GPU (and
    a process: cuDNN's autotuner cache, the allocator) in the state the later ones find."""
    if epochs <= 0:
        return
    print(f"--- warm-up run, {epochs} epochs, discarded", flush=True)
    w = copy.deepcopy(d)
    w["epochs"] = epochs
    w.setdefault("optim", {})["warmup_epochs"] = 0
    from triaccel.trainer import Diverged

    try:  # without its lr warm-up a config may diverge; the run only warms the GPU and the process
        train(w, 0)
    except Diverged as e:
        print(f"--- warm-up run diverged ({e}): discarded as planned", flush=True)


class RunFailed(Exception):
    """A run in its own process ended without a result (killed for memory, a crash): the comparison goes on
    without it, and --resume trains it again."""


def train_isolated(d: dict, seed: int) -> dict:
    """``train(d, seed)`` in a new Python process (``--one-run``): its result, or Diverged raised here."""
    import tempfile

    from triaccel.trainer import Diverged

    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "run.json"
        job.write_text(json.dumps({"config": d, "seed": seed}))
        r = subprocess.run([sys.executable, "-u", __file__, "--one-run", str(job)], text=True)
        out = job.with_suffix(".out.json")
        if r.returncode or not out.is_file():
            raise RunFailed(f"its process exited {r.returncode} (its output is above)")
        res = json.loads(out.read_text())
    if "diverged" in res:
        raise Diverged(res["diverged"])
    return res


def one_run(job: str) -> None:
    """The child of train_isolated: train the job's config at its seed, write the result beside it."""
    from triaccel.trainer import Diverged

    j = json.loads(Path(job).read_text())
    try:
        r = train(j["config"], j["seed"])
    except Diverged as e:
        r = {"diverged": str(e)}
    Path(job).with_suffix(".out.json").write_text(json.dumps(r))


def stats(xs):
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0, "n": len(xs)}


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--static", default="bf16:512,fp16:512,bf16:256,bf16:768",
                    help="dtype:batch[:captured][:compiled][:torchws] runs over every seed (compiled: "
                         "torch.compile, mode default; torchws: torch's cuBLAS workspace instead of the "
                         "config's cublas_workspace_mib)")
    ap.add_argument("--static-once", default="bf16:96,bf16:1024,fp16:256,fp16:768",
                    help="specs as --static, trained at the first seed only (default: %(default)s, eager: an "
                         "EfficientNet-B0 epoch takes 26-33 s eager on an H100; '' trains none)")
    ap.add_argument("--space", help="the space to search, and whose train settings the static runs take "
                                     "(default: the --tuned file's space where it still exists, else "
                                     "spaces/cifar10_jpeg_resnet18.yaml)")
    ap.add_argument("--tuned", help="an exported config: skip the search")
    ap.add_argument("--start", type=int, metavar="K",
                    help="skip the search and train the space's K-th start point (from 0) as the export: "
                         "its train settings with that point's keys set")
    ap.add_argument("--trials", type=int, help="override the space's trial count")
    ap.add_argument("--imagefolder", action="store_true",
                    help="read --data-dir as an ImageFolder (the CIFAR-10 JPEG pack) whatever data the space "
                         "names: the GPU machine has no torchvision CIFAR files")
    ap.add_argument("--search-only", action="store_true",
                    help="search and export, then stop: the exported config lands beside --out")
    ap.add_argument("--work", default="/tmp/svs")
    ap.add_argument("--warm-epochs", type=int, default=2, help=WARM_HELP)
    ap.add_argument("--resume", metavar="FILE",
                    help="an earlier --out of this comparison (a device command that reached its time limit): "
                         "keep its runs and train only the (run, seed) pairs it lacks. Refused unless its epochs, "
                         "space, start point or export, GPU and git revision are this command's")
    ap.add_argument("--process-per-run", action="store_true",
                    help="train each run in a new process, as a user runs it (no warm-up run then): nothing of "
                         "one run's cuDNN plan cache, compiled code or allocator reaches another")
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL:KEY=VALUE[,KEY=VALUE]",
                    help="also train the exported config with these dotted settings changed, as run "
                         "'exported LABEL', interleaved seed by seed (repeatable)")
    return ap.parse_args()


def read_space(args) -> dict:
    """The space whose train settings every run takes, reading --data-dir (as an ImageFolder with
    --imagefolder)."""
    if args.space is None:
        src = (yaml.safe_load(Path(args.tuned).read_text()).get("provenance") or {}).get("space_file") \
            if args.tuned else None
        args.space = src if src and Path(src).is_file() else str(ROOT / "spaces" / "cifar10_jpeg_resnet18.yaml")
        print(f"static runs take the train settings of {args.space}", flush=True)
    space = yaml.safe_load(Path(args.space).read_text())
    space["train"]["data"]["data_dir"] = args.data_dir
    if args.imagefolder:
        space["train"]["data"].update(name="imagefolder", data_dir=args.data_dir, image_size=32)
        space["train"]["data"].pop("download", None)  # the space's other data keys (split, cache) stay
    return space


def search_and_export(args, space: dict, work: Path, res: dict) -> Path:
    """Run the search through the CLI and export its pick; the exported config's path."""
    if args.trials:
        space["trials"] = args.trials
    (work / "space.yaml").write_text(yaml.safe_dump(space, sort_keys=False))
    env = dict(os.environ, TRIACCEL_TUNE_DIR=str(work / "mlruns" / "tune"),
               MLFLOW_TRACKING_URI=f"sqlite:///{work}/mlruns/mlflow.db")
    t0 = time.perf_counter()
    # streamed as it runs (a search killed by a time limit leaves nothing when its output is captured)
    p = subprocess.Popen([sys.executable, "-u", "-m", "triaccel.cli", "search", "--space",
                          str(work / "space.yaml"), "--name", "bench"], cwd=work, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = []
    for line in p.stdout:
        print(line, end="", flush=True)
        lines.append(line)
    search_rc = p.wait()
    out = "".join(lines)
    res["search"] = {"wall_s": time.perf_counter() - t0, "rc": search_rc, "stdout_tail": out[-6000:]}
    r = subprocess.run([sys.executable, "-m", "triaccel.cli", "export", "bench", "--out", str(work / "tuned.yaml"),
                        "--force"], cwd=work, env=env, capture_output=True, text=True)
    res["export"] = {"rc": r.returncode, "stdout": r.stdout[-3000:], "stderr": r.stderr[-2000:]}
    print(r.stdout, r.stderr, flush=True)
    write(args.out, res)
    if search_rc or r.returncode:  # an export of an older search under the same --work is no result
        sys.exit(f"search (exit {search_rc}) or export (exit {r.returncode}) failed: see {args.out}")
    return work / "tuned.yaml"


def start_point(space: dict, k: int, work: Path, space_file: str) -> Path:
    """The space's k-th start point as a train config (the space's train settings, the point's keys set),
    written to ``work``: what ``--tuned`` reads."""
    from triaccel.config_io import set_dotted

    starts = space.get("start") or []
    if not 0 <= k < len(starts):
        sys.exit(f"--start {k}: the space has {len(starts)} start points (0..{len(starts) - 1})")
    d = copy.deepcopy(space["train"])
    point = dict(starts[k])
    if point.pop("reference", False):  # no search, so no reference baseline: the point as written
        print(f"--start {k} follows the reference baseline in a search; here it trains as written", flush=True)
    for key, val in point.items():
        set_dotted(d, key, val)
    d["provenance"] = {"space_file": space_file, "start_point": k}
    p = work / f"start{k}.yaml"
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    return p


def resolved_optim(d: dict) -> dict:
    """The optimizer settings train dict ``d`` runs with, every default filled in (JSON types)."""
    import dataclasses

    from triaccel.config import OptimConfig, from_dict

    return json.loads(json.dumps(dataclasses.asdict(from_dict(OptimConfig, copy.deepcopy(d.get("optim") or {})))))


def static_runs(space: dict, epochs: int):
    """A function from ``dtype:batch[:captured][:compiled][:torchws]`` to (label, train dict): static AMP with
    the space's own train settings (its data, model, optimizer with its warm-up, and cuBLAS workspace), as the
    search's own baselines train (search.space.Space.baseline_runs); no controllers, no checkpointing (a user's
    plain run, and the same arithmetic). The optimizer is the export's too, so an accuracy gap is the loop's,
    not the schedule's."""
    static = copy.deepcopy(space["train"])
    static.pop("triaccel", None)
    static.update(mode="amp", epochs=epochs, checkpointing=False)

    def static_cfg(spec):
        dt, b, *flags = spec.split(":")
        d = copy.deepcopy(static)
        d.update(mode="amp", amp_dtype=dt, batch_size=int(b), capture="captured" in flags)
        # torch.compile(mode="default"), what a user who compiles runs; else eager whatever the space sets
        d["compile"] = "default" if "compiled" in flags else None
        if "torchws" in flags:  # torch's cuBLAS workspace, as plain PyTorch runs, not the config's
            d["cublas_workspace_mib"] = None
        return (f"static amp {dt} B={b}" + (" captured" if "captured" in flags else "")
                + (" compiled" if "compiled" in flags else "")
                + (" torch-workspace" if "torchws" in flags else "")), d
    return static_cfg


def variants_of(tuned: dict, specs: list[str]) -> list[tuple[str, dict]]:
    """``LABEL:key=value,key=value``: the exported config with those dotted settings changed."""
    variants = []
    for v in specs:
        label, _, sets = v.partition(":")
        d = copy.deepcopy(tuned)
        for item in filter(None, sets.split(",")):
            key, _, val = item.partition("=")
            *path, last = key.strip().split(".")
            node = d
            for k in path:
                node = node.setdefault(k, {})
            node[last] = yaml.safe_load(val)
        variants.append((f"exported {label}", d))
    return variants


def plan_runs(args, tuned: dict, variants: list, static_cfg) -> list[tuple[str, dict, int]]:
    """(label, train dict, seed) of every run, seed by seed: the export, its variants, the static runs
    (and, at the first seed, the --static-once ones)."""
    plan = []
    for i, seed in enumerate(int(s) for s in args.seeds.split(",")):
        plan.append(("exported", tuned, seed))
        for label, d in variants:
            plan.append((label, d, seed))
        for spec in [s for s in args.static.split(",") if s]:
            plan.append((*static_cfg(spec), seed))
        if i == 0:
            for spec in [s for s in args.static_once.split(",") if s]:
                plan.append((*static_cfg(spec), seed))
    return plan


def resumed(path: str, res: dict, plan: list) -> list:
    """The runs of ``plan`` that the earlier result at ``path`` lacks; its runs move into ``res``, and its
    ``env`` (command, date, GPU, revision) into ``res["earlier"]``. A file of another comparison, GPU or
    revision is refused in one line: its runs would not pair with these."""
    from _common import env

    try:
        old = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        sys.exit(f"--resume {path}: cannot read it ({type(e).__name__}: {e})")
    here = env()
    old.setdefault("isolation", "one process, after a warm-up run")  # files from before --process-per-run
    if "static_optim" not in old:  # files from before static took the space's optimizer: a 2-epoch warm-up
        before = copy.deepcopy(res["static_optim"])
        before["warmup_epochs"] = 2.0
        old["static_optim"] = before
    for key, mine in (("epochs", res["epochs"]), ("space", res["space"]), ("provenance", res.get("provenance")),
                      ("isolation", res["isolation"]), ("static_optim", res["static_optim"])):
        if old.get(key) != mine:
            sys.exit(f"--resume {path}: its {key} is {old.get(key)!r}, this command's {mine!r}")
    for key in ("gpu", "git_rev"):
        if (old.get("env") or {}).get(key) != here.get(key):
            sys.exit(f"--resume {path}: it ran with {key} {(old.get('env') or {}).get(key)!r}, this command has "
                     f"{here.get(key)!r}: its runs do not pair with this command's")
    planned = {label for label, _, _ in plan}
    extra = sorted(set(old.get("runs") or {}) - planned)
    if extra:
        sys.exit(f"--resume {path}: it holds runs this command does not plan ({', '.join(extra)})")
    res["runs"] = old.get("runs") or {}
    res["earlier"] = [*old.get("earlier", []), old.get("env")]
    res["failed"] = old.get("failed", [])  # runs an earlier command lost: trained again below, their loss kept
    done = {(label, x["seed"]) for label, xs in res["runs"].items() for x in xs}
    return [(label, d, seed) for label, d, seed in plan if (label, seed) not in done]


def summarise(res: dict, variants: list) -> None:
    """Mean and std per run label, and the export (and each variant) against the best static runs."""
    summary = {}
    for lab, rs in res["runs"].items():
        done = [x for x in rs if "diverged" not in x]
        if not done:  # every seed diverged: no figures, and never the best static run
            continue
        summary[lab] = {k: stats([x[k] for x in done]) for k in ("efficiency", "val_acc", "epoch_time_last5_s",
                                                                  "peak_mem_gib")}
        if len(done) < len(rs):
            summary[lab]["diverged"] = len(rs) - len(done)
    statics = {k: v for k, v in summary.items() if k.startswith("static")}
    # against the best static run of all, the best eager one (what a user runs without us), the
    # best captured one (static training with our captured step) and the best compiled one
    for suffix, pool in (("", statics),
                         ("_eager", {k: v for k, v in statics.items() if "captured" not in k and "compiled" not in k}),
                         ("_captured", {k: v for k, v in statics.items() if "captured" in k and "compiled" not in k}),
                         ("_compiled", {k: v for k, v in statics.items() if "compiled" in k})):
        if "exported" in summary and pool:
            best = max(pool, key=lambda k: pool[k]["efficiency"]["mean"])
            res[f"best_static{suffix}"] = best
            res[f"ratio_exported_to_best_static{suffix}"] = (summary["exported"]["efficiency"]["mean"]
                                                             / pool[best]["efficiency"]["mean"])
            res[f"val_acc_diff_pp{suffix}"] = summary["exported"]["val_acc"]["mean"] - pool[best]["val_acc"]["mean"]
    # the judge's figures (search.results.paired): the export against each static run, paired by seed
    from triaccel.search.results import paired

    by_seed = {lab: {x["seed"]: x for x in rs if "diverged" not in x} for lab, rs in res["runs"].items()}
    res["paired"] = {}
    for lab in statics:
        p = paired("exported", by_seed.get("exported", {}), by_seed[lab], res.get("accuracy_margin_pp", 0.5))
        if p is not None:
            res["paired"][lab] = {"seeds": list(p.seeds), "ratios": list(p.ratios), "mean": p.mean, "std": p.std,
                                  "lower_bound_95": p.lower, "val_acc_diff_mean_pp": p.acc_mean,
                                  "preferred": p.preferred, "why": p.why}
    for label, _ in variants:  # each variant against the same best static run
        if label in summary and res.get("best_static"):
            best = summary[res["best_static"]]
            res[f"ratio_{label.replace(' ', '_')}_to_best_static"] = (summary[label]["efficiency"]["mean"]
                                                                      / best["efficiency"]["mean"])
            res[f"val_acc_diff_pp_{label.replace(' ', '_')}"] = (summary[label]["val_acc"]["mean"]
                                                                 - best["val_acc"]["mean"])
    res["summary"] = summary


def gpu_name_without_cuda() -> str | None:
    """The GPU's name from NVML (as torch names it), without a CUDA context in this process."""
    try:
        import pynvml

        pynvml.nvmlInit()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        return name.decode() if isinstance(name, bytes) else name
    except Exception:
        return None


def main():
    args = parse_args()
    if args.process_per_run:  # the parent stays off the GPU: no CUDA context beside the runs
        name = gpu_name_without_cuda()
        if name:
            os.environ["BENCH_GPU"] = name
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.resume and args.tuned is None and args.start is None:
        sys.exit("--resume needs --tuned or --start: a new search could export another config than the one resumed")
    space = read_space(args)
    res = {"what": __doc__.split("\n\n")[0], "epochs": args.epochs, "space": args.space, "runs": {},
           "isolation": "a process per run" if args.process_per_run else "one process, after a warm-up run"}
    if args.start is not None:
        args.tuned = str(start_point(space, args.start, work, args.space))
    if args.tuned is None:
        args.tuned = str(search_and_export(args, space, work, res))
        if args.search_only:
            Path(args.out).with_suffix(".tuned.yaml").write_text((work / "tuned.yaml").read_text())
            return
    tuned = yaml.safe_load(Path(args.tuned).read_text())
    res["provenance"] = tuned.get("provenance")
    res["accuracy_margin_pp"] = float((space.get("baseline") or {}).get("accuracy_margin", 0.5))
    tuned["epochs"] = args.epochs
    tuned.setdefault("data", {})["data_dir"] = args.data_dir  # the data every static run reads
    variants = variants_of(tuned, args.variant)
    res["variants"] = args.variant
    static_cfg = static_runs(space, args.epochs)
    # the static runs' optimizer, schedule included: a --resume of a file whose static runs trained another
    # one is refused, and an export whose optimizer differs is named, since the accuracy gap then includes it
    res["static_optim"] = resolved_optim(space["train"])
    exported_optim = resolved_optim(tuned)
    differ = sorted(k for k in res["static_optim"] if res["static_optim"][k] != exported_optim[k])
    if differ:
        print(f"note: the export's optimizer differs from the static runs' in {', '.join('optim.' + k for k in differ)}:"
              " their accuracy gap includes it", flush=True)
    plan = plan_runs(args, tuned, variants, static_cfg)
    if args.resume:
        plan = resumed(args.resume, res, plan)
        if not plan:
            print(f"{args.resume} holds every planned run: nothing to train", flush=True)
            summarise(res, variants)
            write(args.out, res)
            return
    from triaccel.trainer import Diverged
    if not args.process_per_run:
        warm_run(plan[0][1], args.warm_epochs)
    part = len(res.get("earlier", []))  # which command trained a run: 0 the first, 1 its first resume, ...
    for label, d, seed in plan:
        print(f"--- {label} seed {seed}", flush=True)
        try:
            r = train_isolated(d, seed) if args.process_per_run else train(d, seed)
        except Diverged as e:  # a run that diverges is a result (a static fp16 run can): kept, out of the means
            print(label, seed, f"diverged: {e}", flush=True)
            r = {"diverged": str(e)}
        except RunFailed as e:  # no result: the later runs still train, and --resume trains this one again
            print(label, seed, f"failed: {e}", flush=True)
            res.setdefault("failed", []).append({"run": label, "seed": seed, "part": part, "why": str(e)})
            write(args.out, res)
            continue
        else:
            print(label, seed, {k: r[k] for k in ("val_acc", "epoch_time_last5_s", "peak_mem_gib", "efficiency")},
                  flush=True)
        res["runs"].setdefault(label, []).append({"seed": seed, "part": part, **r})
        summarise(res, variants)
        write(args.out, res)
    lost = [f"{f['run']} seed {f['seed']}" for f in res.get("failed", []) if f["part"] == part]
    if lost:
        sys.exit(f"{len(lost)} run(s) failed ({', '.join(lost)}): `--resume {args.out}` trains them again")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one-run"]:
        one_run(sys.argv[2])
    else:
        main()
