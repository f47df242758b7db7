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
MACHINE = ("gpu", "torch", "git_revision")  # run tags: what trained the judge runs (triaccel.tracking.machine_tags)
BASELINE = "baseline"


def stat(xs: list[float]) -> dict:
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0, "n": len(xs)}


def judge_runs(store: str, search: str, epochs: int | None = None) -> tuple[dict, dict, dict]:
    """({trial id or BASELINE: {seed: metrics}}, {trial id or BASELINE: label}, {tag: values}) of the search's
    judge runs (of ``epochs`` epochs only, where given: a search judged again at another length holds runs
    of both); the last holds the sets of their machine tags (gpu, torch, git_revision)."""
    from mlflow.tracking import MlflowClient

    c = MlflowClient(store)
    exps = [e.experiment_id for e in c.search_experiments()]
    runs = c.search_runs(exps, f"tags.`triaccel.role` = 'judge' and tags.`triaccel.search` = '{search}'",
                         max_results=1000)
    trial_of = {r.info.run_id: r.data.tags.get("triaccel.trial_id")
                for r in c.search_runs(exps, f"tags.`triaccel.search` = '{search}'", max_results=5000)}
    lengths = {r.data.params.get("epochs") for r in runs if r.info.status == "FINISHED"}
    if epochs is None and len(lengths) > 1:
        raise SystemExit(f"judge_table: search '{search}' was judged at {', '.join(sorted(lengths, key=int))} "
                         f"epochs: give --epochs")
    out: dict = {}
    labels: dict = {}
    machine: dict = {k: set() for k in MACHINE}
    for r in runs:
        if r.info.status != "FINISHED" or (epochs is not None and r.data.params.get("epochs") != str(epochs)):
            continue
        for k in MACHINE:
            machine[k].add(r.data.tags.get(k))
        key = r.data.tags.get("triaccel.judges")
        name = BASELINE if key == BASELINE else (trial_of.get(key) or key)
        if key == BASELINE:
            labels[name] = r.data.tags.get("triaccel.baseline", "reference baseline")
        seed = int(r.data.tags["triaccel.seed"])
        out.setdefault(name, {})[seed] = {k: r.data.metrics[k] for k in METRICS if k in r.data.metrics}
    return out, labels, machine


def trained_env(machine: dict) -> dict:
    """This file's env: the reader's, with the GPU, torch and git revision the judge runs recorded where
    they all agree: the file is read from their store anywhere, and says what trained them (a CPU's runs claim no
    GPU, even read on a GPU machine)."""
    e = env()
    one = {k: next(iter(v)) for k, v in machine.items() if len(v) == 1 and None not in v}
    if len(machine.get("gpu") or ()) > 1:  # no one machine trained them: claim none
        e.update(gpu=None, note="the judge runs were trained on more than one machine: "
                                + ", ".join(sorted(str(g) for g in machine["gpu"])))
    elif one.get("gpu") == "cpu":  # trained on a CPU: not the reader's GPU's figure, wherever it is read
        e.update(gpu=None, note="CPU run: not a GPU figure")
    elif one.get("gpu"):
        e.update(gpu=one["gpu"], read_on="the judge runs were trained on this GPU; this file was read from the "
                                          "search's MLflow store afterwards")
        e.pop("note", None)
    if one.get("torch"):
        e["torch"] = one["torch"]
    if one.get("git_revision"):
        rev = one["git_revision"]
        e.update(git_rev=rev.removesuffix("-dirty"), git_dirty=rev.endswith("-dirty"),
                 git_rev_source="the judge runs' git_revision tag")
    return e


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True, help="the search's MLflow tracking URI")
    ap.add_argument("--search", required=True, help="the search's name")
    ap.add_argument("--exported", help="the exported trial's id (the verdict): named 'exported' in the file")
    ap.add_argument("--label", action="append", default=[], metavar="TRIAL=TEXT",
                    help="what a judged trial was (a start point, a sampled trial)")
    ap.add_argument("--epochs", type=int, help="the judge runs of this length only (a search judged again with "
                                                 "`resume --production-epochs` holds runs of two lengths)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    runs, labels, machine = judge_runs(a.store, a.search, a.epochs)
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
    write(a.out, {"env": trained_env(machine), "what": f"the judge runs of search '{a.search}': each judged trial and the "
                                        f"reference baseline alone at the production length, paired by seed",
                  "search": a.search, "reference": labels[BASELINE],
                  "runs": {name[k]: {str(s): v for s, v in sorted(r.items())} for k, r in runs.items()},
                  "summary": summary, "paired_ratio_to_reference": paired})
    for k, p in paired.items():
        print(f"{k}: ratio {p['mean']:.3f} ± {p['std']:.3f} over seeds {p['seeds']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
