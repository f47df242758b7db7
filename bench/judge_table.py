"""A search's production-length judgement as a results file: the judge runs in its MLflow store.

The judge (search/judge.py) trains the leading trials and the reference baseline alone at the
space's ``production_epochs``, paired by seed. This reads those runs back and writes them in
search_vs_static's format (``summary`` of mean/std/n per run, ``runs`` per seed), with each
candidate's paired efficiency ratio to the reference, so the ledger and README's headline read
them like any other comparison. The exported trial is named ``exported``.

    python bench/judge_table.py --store sqlite:///mlruns/mlflow.db --search NAME --out F.json
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import env, write  # noqa: E402

METRICS = ("efficiency", "val_acc", "epoch_time_last5_s", "peak_mem_gib")
BASELINE = "baseline"


def stat(xs: list[float]) -> dict:
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0, "n": len(xs)}


def judge_runs(store: str, search: str) -> tuple[dict, dict]:
    """({trial id or BASELINE: {seed: metrics}}, {trial id or BASELINE: label}) of the search's judge runs."""
    from mlflow.tracking import MlflowClient

    c = MlflowClient(store)
    exps = [e.experiment_id for e in c.search_experiments()]
    runs = c.search_runs(exps, f"tags.`triaccel.role` = 'judge' and tags.`triaccel.search` = '{search}'",
                         max_results=1000)
    trial_of = {r.info.run_id: r.data.tags.get("triaccel.trial_id")
                for r in c.search_runs(exps, f"tags.`triaccel.search` = '{search}'", max_results=5000)}
    out: dict = {}
    labels: dict = {}
    for r in runs:
        if r.info.status != "FINISHED":
            continue
        key = r.data.tags.get("triaccel.judges")
        name = BASELINE if key == BASELINE else (trial_of.get(key) or key)
        if key == BASELINE:
            labels[name] = r.data.tags.get("triaccel.baseline", "reference baseline")
        seed = int(r.data.tags["triaccel.seed"])
        out.setdefault(name, {})[seed] = {k: r.data.metrics[k] for k in METRICS if k in r.data.metrics}
    return out, labels


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True, help="the search's MLflow tracking URI")
    ap.add_argument("--search", required=True, help="the search's name")
    ap.add_argument("--exported", help="the exported trial's id (the verdict): named 'exported' in the file")
    ap.add_argument("--label", action="append", default=[], metavar="TRIAL=TEXT",
                    help="what a judged trial was (a start point, a sampled trial)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    runs, labels = judge_runs(a.store, a.search)
    if BASELINE not in runs:
        print(f"judge_table: no finished judge runs of the reference in search '{a.search}'", file=sys.stderr)
        return 2
    extra = dict(x.split("=", 1) for x in a.label)
    ref = runs[BASELINE]
    # amp-bf16-B96-captured-compiled -> static amp bf16 B=96 captured compiled, as search_vs_static names it
    name = {BASELINE: "static amp " + re.sub(r"\bB(\d+)", r"B=\1", labels[BASELINE].replace("amp-", "").replace("-", " "))}
    for k in runs:
        if k != BASELINE:
            name[k] = "exported" if k == a.exported else f"trial {k}" + (f" ({extra[k]})" if k in extra else "")
    summary, paired = {}, {}
    for k, per_seed in runs.items():
        summary[name[k]] = {m: stat([v[m] for v in per_seed.values()]) for m in METRICS}
        if k != BASELINE:
            seeds = sorted(set(per_seed) & set(ref))
            ratios = [per_seed[s]["efficiency"] / ref[s]["efficiency"] for s in seeds]
            paired[name[k]] = {"seeds": seeds, "ratios": ratios, **stat(ratios)}
    write(a.out, {"env": env(), "what": f"the judge runs of search '{a.search}': each judged trial and the "
                                        f"reference baseline alone at the production length, paired by seed",
                  "search": a.search, "reference": labels[BASELINE],
                  "runs": {name[k]: {str(s): v for s, v in sorted(r.items())} for k, r in runs.items()},
                  "summary": summary, "paired_ratio_to_reference": paired})
    for k, p in paired.items():
        print(f"{k}: ratio {p['mean']:.3f} ± {p['std']:.3f} over seeds {p['seeds']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
