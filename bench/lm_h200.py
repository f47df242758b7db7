"""Does the Tri-Accel export beat static mixed precision on a language model? (issue 30, item 4)

    python3 bench/lm_h200.py --out $OUT/h200_lm.json          # bash bench/lm_h200.sh on the device

1. A fresh search of ``spaces/shakespeare_gpt.yaml`` (nanoGPT's shakespeare-char GPT, 10.7 M parameters, on
   the shipped Tiny Shakespeare) with ``--trials`` trials of ``--search-epochs`` epochs, its own static baselines
   (bf16 and fp16; eager, captured, compiled, captured + compiled) and ``--confirm`` confirm runs; stopped
   (SIGTERM: trials closed, state saved) if it is still running at ``--search-s``; then ``triaccel export``.
2. The export trained alone against the best static baseline of each dtype (by the search's own
   efficiency), ``--epochs`` epochs, over ``--seeds``, interleaved seed by seed in this process after a
   one-epoch discarded warm-up run. A run is started only while the whole bench can still end inside
   ``--budget-s`` (its estimate: the longest earlier run of the same config); the rest are listed as skipped.
Written (and rewritten after every run) to ``--out``: command, date, GPU, git revision, the search's tail and
baselines, per run val acc (next-token top-1, %), epoch time (steady mean), peak memory, efficiency, and for the
export whether its precision controller ran any layer above its starting level, read from the trajectory
the control loop logs every window.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402
from search_vs_static import fit_alone, warm_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RANK = {"fp16": 0, "bf16": 1, "fp32": 2}
T0 = time.monotonic()


def elapsed() -> float:
    return time.monotonic() - T0


def git_rev() -> str:
    r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return r.stdout.strip() or os.environ.get("GIT_REV", "unknown (no .git here: pass GIT_REV)")


def stream(cmd: list, env: dict, cwd: Path, deadline_s: float) -> tuple[int, str, bool]:
    """Run ``cmd``, echoing its output; SIGTERM it (the CLI stops as on Ctrl-C: runs closed, state saved) once
    ``deadline_s`` of the bench has passed. (exit code, output tail, stopped for time)."""
    import threading

    p = subprocess.Popen(cmd, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    lines: list[str] = []

    def pump():
        for line in p.stdout:
            print(line, end="", flush=True)
            lines.append(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    stopped = False
    while p.poll() is None:
        if not stopped and elapsed() > deadline_s:
            print(f"--- search still running at {elapsed():.0f} s: SIGTERM", flush=True)
            os.killpg(p.pid, signal.SIGTERM)
            stopped = True
        time.sleep(0.5)
    reader.join(timeout=10)
    return p.returncode, "".join(lines)[-8000:], stopped


def search_and_export(args, work: Path, res: dict) -> Path | None:
    space = yaml.safe_load((ROOT / args.space).read_text())
    space["trials"] = args.trials
    space["train"]["epochs"] = args.search_epochs
    (work / "space.yaml").write_text(yaml.safe_dump(space, sort_keys=False))
    env = dict(os.environ, TRIACCEL_TUNE_DIR=str(work / "mlruns" / "tune"),
               MLFLOW_TRACKING_URI=f"sqlite:///{work}/mlruns/mlflow.db")
    cmd = [sys.executable, "-u", "-m", "triaccel.cli", "search", "--space", str(work / "space.yaml"), "--name", "lm",
           "--confirm", str(args.confirm)]
    t = elapsed()
    rc, tail, stopped = stream(cmd, env, work, args.search_s)
    res["search"] = {"command": " ".join(cmd[2:]), "trials": args.trials, "epochs": args.search_epochs,
                     "wall_s": elapsed() - t, "rc": rc, "stopped_for_time": stopped, "stdout_tail": tail}
    r = subprocess.run([sys.executable, "-m", "triaccel.cli", "export", "lm", "--out", str(work / "tuned.yaml"),
                        "--force"], cwd=work, env=env, capture_output=True, text=True)
    print(r.stdout, r.stderr, flush=True)
    res["export"] = {"rc": r.returncode, "stdout": r.stdout[-3000:], "stderr": r.stderr[-2000:]}
    res["search"]["baselines"] = read_baselines(f"sqlite:///{work}/mlruns/mlflow.db")
    return work / "tuned.yaml" if r.returncode == 0 else None


def read_baselines(uri: str) -> list[dict]:
    """The search's static baselines as the search measured them: label, efficiency, val acc, ..."""
    from triaccel.search.results import trial_table
    from triaccel.search.state import EXPERIMENT
    from triaccel.tracking import client

    c = client(uri)
    exp = c.get_experiment_by_name(EXPERIMENT)
    if exp is None:
        return []
    out = []
    for b in trial_table(c, exp.experiment_id, "lm", role="baseline"):
        m = b["metrics"]
        if b["status"] == "FINISHED" and "efficiency" in m:
            out.append({"label": b["tags"].get("triaccel.baseline"), "efficiency": m["efficiency"],
                        "val_acc": m.get("val_acc"), "epoch_time_last5_s": m.get("epoch_time_last5_s"),
                        "peak_mem_gib": m.get("peak_mem_gib")})
    return sorted(out, key=lambda b: -b["efficiency"])


def best_statics(work: Path, baselines: list[dict], labels: list[str]) -> list[tuple[str, dict]]:
    """(label, train dict) of the best finished baseline of each dtype, as the space builds it, or of the
    baselines ``labels`` names."""
    from triaccel.search.space import load_space

    space = load_space(str(work / "space.yaml"))
    if labels:  # named on the command line
        return [(f"static {label}", space.baseline_train(label)) for label in labels]
    picked = []
    for dt in ("bf16", "fp16"):
        mine = [b for b in baselines if b["label"] and b["label"].startswith(f"amp-{dt}-")]
        if mine:
            label = mine[0]["label"]  # sorted best first
            picked.append((f"static {label}", space.baseline_train(label)))
    return picked


def promotions(rows: list[list[str]], names: list[str], initial: str) -> dict:
    """From the control loop's trajectory (the layers' levels at each window): the layers that ever ran above
    the run's starting level (``amp_dtype``), and those that ran above the lowest level of their window's plan
    (kept more precise than the rest: with a bf16 start, the layers left at bf16 when the others drop to fp16),
    each at the highest such level; and the windows whose plan mixed levels."""
    above_start, above_floor = {}, {}
    for levels in rows:
        floor = min(RANK[lv] for lv in levels) if levels else 0
        for n, lv in zip(names, levels):
            if RANK[lv] > RANK[initial] and RANK[lv] > RANK[above_start.get(n, initial)]:
                above_start[n] = lv
            if RANK[lv] > floor and RANK[lv] > RANK.get(above_floor.get(n), -1):
                above_floor[n] = lv
    return {"promoted_any": bool(above_start or above_floor), "above_start": above_start,
            "above_plan_floor": above_floor, "mixed_windows": sum(len(set(lv)) > 1 for lv in rows),
            "windows": len(rows)}


def run(d: dict, seed: int) -> dict:
    """One training run alone, as search_vs_static trains (tracking off, no test set), plus the precision
    trajectory's promotions when it is a Tri-Accel run."""
    t, s, wall = fit_alone(d, seed)
    eps = t.history.epochs
    out = {k: s[k] for k in ("val_acc", "epoch_time_last5_s", "peak_mem_gib", "efficiency")}
    out.update(wall_s=wall, val_loss=eps[-1]["val_loss"], val_ppl=eps[-1].get("val_ppl"),
               epoch_times=[e["epoch_time_s"] for e in eps], batch_per_epoch=[e["batch_size"] for e in eps],
               skipped_steps=t.skipped_steps, compile_s=eps[-1].get("compile_s"))
    if t.loop is not None:
        rows = [r["levels"] for r in t.loop.trajectory if "levels" in r]
        out["precision"] = promotions(rows, t.loop.names, t.cfg.amp_dtype)
        out["precision"]["final_levels"] = dict(zip(t.loop.names, rows[-1])) if rows else {}
        out["lr_scale_min"] = min((min(r["lr_scale"]) for r in t.loop.trajectory if r.get("lr_scale")), default=1.0)
    del t
    return out


def stats(xs):
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0, "n": len(xs)}


def finals(args, tuned_path: Path, work: Path, res: dict) -> None:
    tuned = yaml.safe_load(tuned_path.read_text())
    res["provenance"] = tuned.get("provenance")
    tuned["epochs"] = args.epochs
    configs = [("exported", tuned)]
    for label, d in best_statics(work, res["search"]["baselines"], args.static):
        d["epochs"] = args.epochs
        configs.append((label, d))
    res["configs"] = {label: {k: d.get(k) for k in ("mode", "amp_dtype", "batch_size", "capture", "compile")}
                      for label, d in configs}
    plan = [(label, d, seed) for seed in args.seeds for label, d in configs]
    warm_run(tuned, 1)
    longest: dict = {}
    for label, d, seed in plan:
        guess = longest.get(label, args.first_run_s)
        if elapsed() + guess > args.budget_s:
            res.setdefault("skipped_for_time", []).append(f"{label} seed {seed}")
            continue
        print(f"--- {label} seed {seed} at {elapsed():.0f} s", flush=True)
        r = run(d, seed)
        longest[label] = max(longest.get(label, 0.0), r["wall_s"])
        print(label, seed, {k: r[k] for k in ("val_acc", "epoch_time_last5_s", "peak_mem_gib", "efficiency")},
              r.get("precision", {}).get("above_plan_floor"), flush=True)
        res["runs"].setdefault(label, []).append({"seed": seed, **r})
        summarise(res)
        write(args.out, res)


def summarise(res: dict) -> None:
    summary = {lab: {k: stats([x[k] for x in rs]) for k in ("efficiency", "val_acc", "epoch_time_last5_s",
                                                             "peak_mem_gib")} for lab, rs in res["runs"].items()}
    res["summary"] = summary
    statics = {k: v for k, v in summary.items() if k.startswith("static")}
    if "exported" in summary and statics:
        best = max(statics, key=lambda k: statics[k]["efficiency"]["mean"])
        res["best_static"] = best
        res["ratio_exported_to_best_static"] = summary["exported"]["efficiency"]["mean"] / \
            statics[best]["efficiency"]["mean"]
        res["val_acc_diff_pp"] = summary["exported"]["val_acc"]["mean"] - statics[best]["val_acc"]["mean"]
    prec = [r["precision"] for r in res["runs"].get("exported", []) if "precision" in r]
    res["export_promoted_any_layer"] = any(p["promoted_any"] for p in prec) if prec else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/lm_bench")
    ap.add_argument("--space", default="spaces/shakespeare_gpt.yaml",
                    help="the space (from the repo root); spaces/shakespeare_gpt_tiny.yaml tries the script on a CPU")
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--confirm", type=int, default=0, help="the search's confirm runs (0: the finals measure alone)")
    ap.add_argument("--search-epochs", type=int, default=3, help="the score averages epochs 2 on")
    ap.add_argument("--epochs", type=int, default=4, help="epochs of each final run")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--search-s", type=float, default=340.0, help="stop the search at this many s of the bench")
    ap.add_argument("--budget-s", type=float, default=530.0, help="start no final run that would end after this")
    ap.add_argument("--first-run-s", type=float, default=40.0, help="a config's run-time guess before it has run")
    ap.add_argument("--tuned", help="an exported config: skip the search (give --static: no baselines are read)")
    ap.add_argument("--static", default="", help="baseline labels of the space to train against (comma-separated, "
                                                 "e.g. amp-fp16-B64-captured-compiled); default: the search's best "
                                                 "bf16 and best fp16 baseline")
    args = ap.parse_args()
    args.seeds = [int(x) for x in args.seeds.split(",")]
    args.static = [x for x in args.static.split(",") if x]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    res = {"what": __doc__.split("\n\n")[0], "git_revision": git_rev(), "space": args.space,
           "epochs": args.epochs, "seeds": args.seeds, "budget_s": args.budget_s, "runs": {}}
    if args.tuned:
        res["search"] = {"baselines": []}
        tuned = Path(args.tuned)
        (work / "space.yaml").write_text((ROOT / args.space).read_text())
    else:
        tuned = search_and_export(args, work, res)
        write(args.out, res)
        if tuned is None:
            sys.exit(f"export failed after the search: see {args.out}")
    finals(args, tuned, work, res)
    res["wall_s"] = elapsed()
    write(args.out, res)


if __name__ == "__main__":
    main()
