"""Judging at the length the user trains (``production_epochs`` in the space).

A search scores trials over a few epochs; a verdict there need not survive a longer run (an H200
export can score 1.04x its reference over 4 epochs and 0.945x over 8). Where the space declares
``production_epochs``, the confirm step ends here: the leading feasible trials (the top K that
``--confirm K`` re-ran alone) and the reference baseline are each trained alone for that many epochs
at ``judge_seeds`` seeds, the reference's seed and the next ones, the same seeds for all, so each
candidate's efficiency is paired with the reference's at its seed. The export then follows
``results.verdict``: a candidate only where the one-sided 95 % lower bound of its mean paired ratio
beats 1.0 with its mean accuracy within the space's margin; otherwise the static reference, itself a
candidate, is exported (mode amp, its dtype, batch, capture and compile). The runs are MLflow runs
of role ``judge``; a resumed search runs only the pairs not yet finished.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from triaccel.search.space import SearchSpace

ROLE = "judge"
TAG_JUDGES = "triaccel.judges"  # the trial run id a judge run re-trains, or BASELINE
BASELINE = "baseline"
METRICS = ("efficiency", "val_acc", "epoch_time_last5_s", "peak_mem_gib")


def seeds(space: SearchSpace, ref_seed: int) -> list[int]:
    """The judge's seeds: the reference's own and the next ones (wrapping at 2**32, as second_look does)."""
    return [(ref_seed + i) % 2**32 for i in range(space.judge_seeds)]


def candidates(o, k: int) -> list:
    """The trials judged: the top K feasible by measured efficiency (confirmed ones, where any were)."""
    pool = [r for r in o.feasible if r.confirmed] or o.feasible
    return sorted(pool, key=lambda r: -r.measured["efficiency"])[:max(k, 0)]


def judged_runs(rows: list[dict], epochs: int) -> dict:
    """Judge rows -> {trial run id or BASELINE: {seed: metrics}}, complete runs of exactly ``epochs`` only
    (a search judged again at another length, ``resume --production-epochs``, holds runs of both)."""
    from triaccel.search.results import is_complete

    out: dict = {}
    for r in rows:
        key, seed = r["tags"].get(TAG_JUDGES), r["tags"].get("triaccel.seed")
        if key and seed is not None and is_complete(r, epochs) \
                and int(r["metrics"].get("epoch", epochs)) == epochs:
            out.setdefault(key, {})[int(seed)] = r["metrics"]
    return out


@dataclass
class Judged:
    """The judge's figures for a search: each candidate paired with the reference, and the verdict."""
    epochs: int
    seeds: list
    label: str  # the reference baseline's label
    pairs: list  # results.Paired, one per judged candidate, in the order judged
    winner: object  # results.Paired | None (None: the static reference is exported)
    runs: dict  # judged_runs(...)
    search_epochs: int = 0  # the length the search scored its trials at
    search_ratios: dict = dataclasses.field(default_factory=dict)  # run id -> its ratio at that length
    rows: list = dataclasses.field(default_factory=list)  # every judge run, any length: part of the search's cost

    def agreement(self) -> dict:
        """How the search's verdicts held at the production length, measured, not assumed: Kendall's tau
        between each judged trial's ratio to the reference at the search's length and its paired mean ratio
        at the production length (the reference, 1.0 at both, ranked among them), and the trials whose
        side of 1.0 changed. tau is None below three runs."""
        pts = [(self.search_ratios[p.key], p.mean) for p in self.pairs if self.search_ratios.get(p.key) is not None]
        flipped = [p.key for p in self.pairs if self.search_ratios.get(p.key) is not None
                   and (self.search_ratios[p.key] > 1.0) != (p.mean > 1.0)]
        tau = None
        if len(pts) + 1 >= 3:
            from scipy.stats import kendalltau

            a, b = zip(*pts, (1.0, 1.0))
            t = kendalltau(a, b).statistic
            tau = None if t != t else float(t)  # NaN where one side has a single value throughout
        return {"search_epochs": self.search_epochs, "production_epochs": self.epochs, "runs": len(pts) + 1,
                "kendall_tau": tau, "flipped": flipped}

    def mean_metrics(self, key: str) -> dict:
        """A candidate's (or BASELINE's) figures at the production length, averaged over the paired seeds."""
        by_seed = self.runs.get(key, {})
        use = [by_seed[s] for s in self.seeds if s in by_seed]
        return {m: sum(x[m] for x in use) / len(use) for m in METRICS if use and all(m in x for x in use)}

    def provenance(self) -> dict:
        return {"production_epochs": self.epochs, "seeds": list(self.seeds), "reference": self.label,
                "exported": self.winner.key if self.winner is not None else BASELINE,
                "rule": "a trial only where the one-sided 95 % lower bound of its mean paired efficiency ratio "
                        "exceeds 1.0 with mean accuracy within the margin; else the static reference",
                "candidates": [{"mlflow_run_id": p.key, "ratios": list(p.ratios), "mean": p.mean, "std": p.std,
                                "lower_bound_95": p.lower, "val_acc_diffs_pp": list(p.acc_diffs),
                                "val_acc_diff_mean_pp": p.acc_mean, "preferred": p.preferred, "why": p.why,
                                "search_ratio": self.search_ratios.get(p.key)}
                               for p in self.pairs],
                "rank_agreement": self.agreement()}


def judged(name: str, space: SearchSpace, uri: str, o) -> Judged | None:
    """The judge's verdict from the store; None where the space declares no production length, there is
    no reference, or no candidate has a paired run yet (the search's own pick then stands)."""
    from triaccel.config import TrainConfig, from_dict
    from triaccel.search.results import paired, trial_table, verdict
    from triaccel.search.state import open_store

    if not space.production_epochs or o.reference is None:
        return None
    c, exp = open_store(uri, write=False)
    rows = trial_table(c, exp, name, role=ROLE)
    runs = judged_runs(rows, space.production_epochs)
    label = o.reference["tags"].get("triaccel.baseline")
    ss = seeds(space, from_dict(TrainConfig, space.baseline_train(label)).seed)
    ref = {s: m for s, m in runs.get(BASELINE, {}).items() if s in ss}
    pairs = [paired(x.row["run_id"], {s: m for s, m in runs.get(x.row["run_id"], {}).items() if s in ss}, ref,
                    space.margin) for x in o.ranked if x.row["run_id"] in runs]
    pairs = [p for p in pairs if p is not None]
    if not pairs:
        return None
    return Judged(space.production_epochs, ss, label, pairs, verdict(pairs), runs, space.epochs,
                  {x.row["run_id"]: x.ratio for x in o.ranked if x.row["run_id"] in runs}, rows)


def run_judge(name: str, space: SearchSpace, uri: str, k: int) -> None:
    """Train the top K feasible trials and the reference alone at the production length, seed by seed
    (each seed's pairs run back to back, so drift falls on both alike); finished pairs are kept."""
    from triaccel.config import TrainConfig, from_dict
    from triaccel.search.tags import TAG_ROLE, TAG_SEARCH
    from triaccel.search.results import trial_table
    from triaccel.search.alone import run_alone
    from triaccel.search.state import open_store, parent_run, read_outcome

    if not space.production_epochs or k <= 0:
        return
    o = read_outcome(name, space, uri)
    cands = candidates(o, k)
    if o.reference is None or not cands:
        print(f"judge: {'no reference baseline' if o.reference is None else 'no feasible trial'}: nothing to "
              f"judge at {space.production_epochs} epochs", flush=True)
        return
    E, label = space.production_epochs, o.reference["tags"]["triaccel.baseline"]
    ref_cfg = from_dict(TrainConfig, space.baseline_train(label))
    ss = seeds(space, ref_cfg.seed)
    c, exp = open_store(uri)
    have = judged_runs(trial_table(c, exp, name, role=ROLE), E)
    parent = parent_run(name, space, uri)
    print(f"judge: the top {len(cands)} and the reference {label}, alone, {E} epochs (the production length), "
          f"paired at seeds {', '.join(map(str, ss))}", flush=True)
    for seed in ss:
        jobs = [(BASELINE, label, ref_cfg, {"triaccel.baseline": label})] + [
            (x.row["run_id"], x.row["trial_id"], space.train_config(x.row["values"]),
             {"triaccel.values": json_values(x.row["values"])}) for x in cands]
        for key, who, cfg, extra in jobs:
            if seed in have.get(key, {}):
                continue
            tags = {"parent": parent, TAG_SEARCH: name, TAG_ROLE: ROLE, TAG_JUDGES: key, "triaccel.seed": str(seed),
                    "triaccel.trial_id": f"judge-{who}-s{seed}", **extra}
            s = run_alone(name, uri, dataclasses.replace(cfg, epochs=E, seed=seed), tags, f"judge-{who}-s{seed}")
            if s is not None:
                print(f"judge {who} seed {seed}: eff {s['efficiency']:.2f}  val {s['val_acc']:.2f}%  "
                      f"{s['epoch_time_last5_s']:.3f}s/epoch", flush=True)


def json_values(values: dict) -> str:
    import json

    return json.dumps(values)


def summary_lines(j: Judged, o) -> list[str]:
    """The judge's figures as the search summary prints them."""
    from triaccel.search.results import paired_words

    ids = {x.row["run_id"]: x.row["trial_id"] for x in o.ranked}
    out = [f"judged at {j.epochs} epochs (the production length), alone, paired by seed with the reference "
           f"{j.label} (seeds {', '.join(map(str, j.seeds))}):"]
    for p in j.pairs:
        was = j.search_ratios.get(p.key)
        n = j.search_epochs
        at = f"{was:.3f} at {n} epoch{'' if n == 1 else 's'}, then " if was is not None else ""
        out.append(f"  {ids.get(p.key, p.key)}: {at}{paired_words(p)}: {'preferred' if p.preferred else 'not preferred'} "
                   f"({p.why})")
    a = j.agreement()
    if a["kendall_tau"] is not None or a["flipped"]:
        tau = "" if a["kendall_tau"] is None else f"Kendall tau {a['kendall_tau']:+.2f} over {a['runs']} runs"
        flips = (f"{len(a['flipped'])} verdict(s) changed side of 1.0 "
                 f"({', '.join(ids.get(k, k) for k in a['flipped'])})" if a["flipped"] else "no verdict changed side of 1.0")
        out.append(f"  rank agreement, {j.search_epochs} against {j.epochs} epochs (the reference included): "
                   f"{tau + '; ' if tau else ''}{flips}")
    if j.winner is None:
        out.append(f"  verdict: the static reference {j.label} (no trial's lower bound beat 1.0 at equal accuracy)")
    else:
        out.append(f"  verdict: {ids.get(j.winner.key, j.winner.key)}")
    return out


def final_pick(o, space: SearchSpace, j: Judged | None, how: str = "best"):
    """What export writes: the judge's verdict where the trials were judged (``--pick best``), else
    ``results.pick``. A judged pick (the verdict, or the reference baseline with ``--pick baseline``)
    carries its mean figures at the production length."""
    from triaccel.search.results import BASELINE_ASKED, Pick, paired_words, pick

    if j is not None and how == "baseline" and o.reference is not None:
        return Pick("baseline", o.reference, {**o.reference["metrics"], **j.mean_metrics(BASELINE)},
                    f"{BASELINE_ASKED}, judged at {j.epochs} epochs")
    if j is None or how != "best":
        return pick(o, space.objective, how)
    if j.winner is not None:
        row = next(x.row for x in o.ranked if x.row["run_id"] == j.winner.key)
        return Pick("trial", row, {**row["metrics"], **j.mean_metrics(j.winner.key)},
                    f"judged at {j.epochs} epochs: {paired_words(j.winner)}")
    best = max(j.pairs, key=lambda p: p.mean)
    return Pick("baseline", o.reference, {**o.reference["metrics"], **j.mean_metrics(BASELINE)},
                f"judged at {j.epochs} epochs, no trial's 95 % lower bound beat the static reference at equal "
                f"accuracy (the best: {paired_words(best)})")
