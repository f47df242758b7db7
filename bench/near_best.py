"""Where a search's sampled trials land: a space searched with and without ``near_best``, over seeds.

    python bench/near_best.py --space spaces/quickstart.yaml --fractions 0,0.5 --seeds 0,1,2 --out F.json

Each (fraction, seed) is one ``triaccel search`` (``--confirm 0``) in one working folder, so the
baselines are trained once and reused by the later searches (the same reference for all). For each
search it reads the trials from MLflow and counts the sampled ones (not the space's start points)
that finished feasible within 5 % of the reference baseline's score, or above it. The question is
issue 31's: do a default search's sampled trials, not only its start points, come near the best
static run?
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402


def one_search(work: Path, space: dict, name: str) -> dict:
    f = work / f"{name}.yaml"
    f.write_text(yaml.safe_dump({**space, "name": name}))
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "triaccel.cli", "search", "--space", str(f), "--confirm", "0"],
                       cwd=work, capture_output=True, text=True)
    wall = time.time() - t0
    if r.returncode != 0:
        raise SystemExit(f"{name}: search failed (exit {r.returncode}): {r.stderr.strip()[-400:]}")
    from triaccel.search.results import is_start, outcome, trial_table
    from triaccel.search.space import NEAR
    from triaccel.search.state import open_store

    c, exp = open_store(f"sqlite:///{work}/mlruns/mlflow.db")
    epochs = int(space["train"]["epochs"])
    rows = trial_table(c, exp, name, curves=True)
    base = trial_table(c, exp, name, role="baseline", curves=True)
    o = outcome(rows, [], base, epochs, margin=float(space.get("baseline", {}).get("accuracy_margin", 0.5)))
    ranked = [{"trial": x.row["trial_id"], "start": is_start(x.row), "near": x.row["tags"].get(NEAR),
               "feasible": bool(x.feasible), "ratio": x.ratio} for x in o.ranked]
    sampled = [x for x in ranked if not x["start"]]
    within = [x for x in sampled if x["feasible"] and x["ratio"] is not None and x["ratio"] >= 0.95]
    return {"name": name, "wall_s": round(wall, 1), "trials": len(rows), "finished": ranked,
            "stopped_early": len(o.stopped), "failed": len(o.failed),
            "sampled": len([r for r in rows if not is_start(r)]),
            "sampled_within_5pct": len(within),
            "best_sampled_ratio": max((x["ratio"] for x in sampled if x["feasible"] and x["ratio"]), default=None),
            "best_start_ratio": max((x["ratio"] for x in ranked if x["start"] and x["feasible"] and x["ratio"]),
                                    default=None)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", required=True)
    ap.add_argument("--fractions", default="0,0.5")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--work", default=None, help="working folder (default: a new temporary one)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    space = yaml.safe_load(Path(a.space).read_text())
    work = Path(a.work or tempfile.mkdtemp(prefix="near-best-"))
    work.mkdir(parents=True, exist_ok=True)
    fractions = [float(x) for x in a.fractions.split(",")]
    seeds = [int(x) for x in a.seeds.split(",")]
    runs = []
    for seed in seeds:  # interleaved: each seed's searches one after the other
        for frac in fractions:
            r = one_search(work, {**space, "seed": seed, "near_best": frac}, f"nb{int(frac * 100)}-s{seed}")
            r.update(seed=seed, near_best=frac)
            print(f"near_best {frac} seed {seed}: {r['sampled_within_5pct']} of {r['sampled']} sampled trials "
                  f"within 5 % of the reference, best sampled {r['best_sampled_ratio']}, {r['wall_s']} s", flush=True)
            runs.append(r)
    summary = {}
    for frac in fractions:
        mine = [r for r in runs if r["near_best"] == frac]
        counts = [r["sampled_within_5pct"] for r in mine]
        best = [r["best_sampled_ratio"] or 0.0 for r in mine]
        summary[str(frac)] = {"sampled_within_5pct_mean": statistics.mean(counts),
                              "sampled_within_5pct_std": statistics.stdev(counts) if len(counts) > 1 else 0.0,
                              "sampled_per_search": statistics.mean(r["sampled"] for r in mine),
                              "best_sampled_ratio_mean": statistics.mean(best),
                              "best_sampled_ratio_std": statistics.stdev(best) if len(best) > 1 else 0.0,
                              "searches_with_one_within_5pct": sum(c > 0 for c in counts)}
    write(a.out, {"space": a.space, "fractions": fractions, "seeds": seeds, "summary": summary, "runs": runs})


if __name__ == "__main__":
    main()
