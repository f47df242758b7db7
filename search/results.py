"""The search's result rules, in one place: which runs count, which is feasible, which is best.

Every reader of a search (the parent run's summary, the console table, ``export``,
``searches``, the confirm step) asks this module; none decides on its own. The rules:

- **Complete**: a run that FINISHED and reached the space's epoch count. A trial that ASHA
  stopped early is *stopped*: its score after fewer epochs is not comparable, so it is never
  best and never exported.
- **Measured**: where a trial was re-run alone (``--confirm``), the confirm run's figures
  replace the shared ones (sharing the GPU distorts time); baselines always run alone.
- **Reference**: the complete baseline (static AMP, trained alone with the space's own train
  settings) with the highest efficiency score. Ratios are taken against it.
- **Feasible**: a run whose validation accuracy is at most ``margin`` percentage points below
  the reference's at the same epoch. Accuracy is a constraint, not a term the score trades.
- **Second look**: a trial infeasible by less than ``band`` pp beyond the margin (single-seed
  accuracy after a few epochs moves by ~0.5 pp, so a config as accurate as the reference lands
  there about one time in four) is confirmed alone and re-run alone at the reference's next
  seed, as the reference is; it is then judged by the mean of its two paired gaps (its figures
  stay those of its own seed, the exported config's).
- **Best**: the highest measured efficiency among complete, feasible trials; among confirmed
  ones only, where any were confirmed. It is exported only when it beats the reference;
  otherwise the reference itself is the pick ("nothing feasible beat the baseline").
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from triaccel.errors import ConfigError
from triaccel.search.space import START
from triaccel.search.tags import TAG_DOMINATED, TAG_ROLE, TAG_SEARCH

DEFAULT_MARGIN_PP = 0.5
DEFAULT_SECOND_LOOK_PP = 1.0  # how far beyond the margin a trial still earns a second seed


# --------------------------------------------------------------------------- reading MLflow
def trial_table(c, exp_id: str, search: str, role: str = "trial", curves: bool = False) -> list[dict]:
    """Runs of one role as plain rows; ``curves`` adds the per-epoch validation accuracy."""
    runs = c.search_runs([exp_id], filter_string=f"tags.`{TAG_SEARCH}` = '{search}' and tags.`{TAG_ROLE}` = '{role}'",
                         max_results=10000)
    rows = []
    for r in runs:
        row = {"run_id": r.info.run_id, "status": r.info.status, "metrics": dict(r.data.metrics),
               "values": json.loads(r.data.tags.get("triaccel.values", "{}")),
               "trial_id": r.data.tags.get("triaccel.trial_id"), "tags": dict(r.data.tags),
               "confirms": r.data.tags.get("triaccel.confirms"), "role": role}
        if curves:
            hist = c.get_metric_history(r.info.run_id, "val_acc")
            row["curve"] = [m.value for m in sorted(hist, key=lambda m: m.step)]
        rows.append(row)
    return rows


def deleted_count(c, exp_id: str, search: str) -> int:
    """Runs of the search deleted in MLflow (the UI's Delete): the rules never see them, so a
    reader must say they are missing (deleting the best trial changes what export picks, silently)."""
    from mlflow.entities import ViewType

    return len(c.search_runs([exp_id], filter_string=f"tags.`{TAG_SEARCH}` = '{search}'",
                             run_view_type=ViewType.DELETED_ONLY, max_results=10000))


# --------------------------------------------------------------------------- the rules
def is_complete(row: dict, epochs: int) -> bool:
    m = row["metrics"]
    return row["status"] == "FINISHED" and "efficiency" in m and int(m.get("epoch", epochs)) >= epochs


def is_stopped(row: dict, epochs: int) -> bool:
    """Finished before the last epoch (ASHA's early stop)."""
    return row["status"] == "FINISHED" and "efficiency" in row["metrics"] and not is_complete(row, epochs)


def reference(baselines: list[dict], epochs: int) -> dict | None:
    """The best complete baseline by efficiency (the one every ratio is taken against)."""
    done = [b for b in baselines if is_complete(b, epochs)]
    return max(done, key=lambda b: b["metrics"]["efficiency"]) if done else None


def curve_gap(metrics: dict, curve: list | None) -> float | None:
    """Validation accuracy minus ``curve``'s at the same epoch (1-based; its last value past its
    end), in pp; None without a curve."""
    if not curve or "val_acc" not in metrics:
        return None
    epoch = int(metrics.get("epoch", 1))
    return metrics["val_acc"] - curve[min(max(epoch, 1), len(curve)) - 1]


def acc_gap(metrics: dict, ref: dict | None) -> float | None:
    """Validation accuracy minus the reference baseline's at the same epoch (pp)."""
    return None if ref is None else curve_gap(metrics, ref.get("curve") or [ref["metrics"]["val_acc"]])


def feasible(metrics: dict, ref: dict | None, margin: float = DEFAULT_MARGIN_PP) -> bool:
    gap = acc_gap(metrics, ref)
    return gap is None or gap >= -margin


def ratio(metrics: dict, ref: dict | None) -> float | None:
    if ref is None or "efficiency" not in metrics:
        return None
    return metrics["efficiency"] / ref["metrics"]["efficiency"]


def confirmed_metrics(confirms: list[dict]) -> dict:
    """trial run id -> the metrics its finished confirm run measured alone."""
    return {c["confirms"]: c["metrics"] for c in confirms if c["status"] == "FINISHED" and "efficiency" in c["metrics"]}


def second_looks(rechecks: list[dict], ref: dict | None, epochs: int) -> tuple[dict | None, dict]:
    """The second-seed runs: the reference's (same baseline label, complete) and trial run id ->
    its complete second-seed row."""
    label = ref["tags"].get("triaccel.baseline") if ref else None
    ref2 = next((r for r in rechecks if label and not r.get("confirms")
                 and r["tags"].get("triaccel.baseline") == label and is_complete(r, epochs)), None)
    return ref2, {r["confirms"]: r for r in rechecks if r.get("confirms") and is_complete(r, epochs)}


@dataclass
class Ranked:
    """A complete trial with the figures that judge it (``measured``: alone where confirmed)."""
    row: dict
    measured: dict
    confirmed: bool
    feasible: bool
    ratio: float | None
    gap: float | None
    gaps: tuple = ()  # the paired gaps a second look averaged (first seed, second seed)
    second_runs: tuple = ()  # the second look's runs: (the trial's, the reference's) at the next seed


@dataclass
class Outcome:
    """Everything a reader of the search needs, computed once by the rules above."""
    epochs: int
    margin: float
    band: float = DEFAULT_SECOND_LOOK_PP
    baselines: list = field(default_factory=list)  # complete baselines, best first
    dominated: list = field(default_factory=list)  # baselines stopped as unable to become the reference
    reference: dict | None = None
    ranked: list = field(default_factory=list)  # complete trials, best measured efficiency first
    stopped: list = field(default_factory=list)  # stopped early (ASHA)
    failed: list = field(default_factory=list)
    trials: int = 0
    runs: list = field(default_factory=list)  # every run read (trials, confirms, baselines): the search's cost
    deleted: int = 0  # runs of the search deleted in MLflow: not read, not counted

    @property
    def feasible(self) -> list:
        return [r for r in self.ranked if r.feasible]

    @property
    def best(self) -> Ranked | None:
        """The best feasible trial (among the confirmed ones where any were confirmed)."""
        pool = [r for r in self.feasible if r.confirmed] or self.feasible
        return max(pool, key=lambda r: r.measured["efficiency"]) if pool else None

    @property
    def beats_reference(self) -> bool:
        b = self.best
        return b is not None and (self.reference is None or b.ratio > 1.0)


def outcome(rows: list[dict], confirms: list[dict], baselines: list[dict], epochs: int,
            margin: float = DEFAULT_MARGIN_PP, rechecks: list[dict] | None = None,
            band: float = DEFAULT_SECOND_LOOK_PP) -> Outcome:
    rechecks = rechecks or []
    ref = reference(baselines, epochs)
    conf = confirmed_metrics(confirms)
    ref2, second = second_looks(rechecks, ref, epochs)
    out = Outcome(epochs=epochs, margin=margin, band=band, reference=ref, trials=len(rows),
                  runs=rows + confirms + baselines + rechecks,
                  baselines=sorted([b for b in baselines if is_complete(b, epochs)],
                                   key=lambda b: -b["metrics"]["efficiency"]),
                  dominated=[b for b in baselines if is_stopped(b, epochs) and b["tags"].get(TAG_DOMINATED)])
    for r in rows:
        if is_complete(r, epochs):
            m = conf.get(r["run_id"], r["metrics"])
            gap, two, gaps, runs = acc_gap(m, ref), second.get(r["run_id"]), (), ()
            if two is not None and ref2 is not None and gap is not None:  # judged on two seeds
                gaps = (gap, curve_gap(two["metrics"], ref2.get("curve") or [ref2["metrics"]["val_acc"]]))
                gap, runs = sum(gaps) / 2, (two["run_id"], ref2["run_id"])
            ok = feasible(m, ref, margin) if not gaps else gap >= -margin
            out.ranked.append(Ranked(r, m, r["run_id"] in conf, ok, ratio(m, ref), gap, gaps, runs))
        elif is_stopped(r, epochs):
            out.stopped.append(r)
        elif r["status"] == "FAILED":
            out.failed.append(r)
    out.ranked.sort(key=lambda x: -x.measured["efficiency"])
    return out


def is_start(row: dict) -> bool:
    """A trial Optuna ran from one of the space's ``start`` points (its run's tag)."""
    return row.get("tags", {}).get(START) == "true"


def to_confirm(o: Outcome, k: int) -> list:
    """The trials ``--confirm K`` re-runs alone: the top K feasible by their (shared) score, then
    every other feasible start point. Sharing the GPU ranks configurations unlike running alone
    (on an H200 ASHA can stop the checkpointing start point at epoch 4 on its shared score, though alone
    it scores 1.07x the best static run), and only confirmed trials can be best. None where K is 0."""
    if k <= 0:
        return []
    return o.feasible[:k] + [r for r in o.feasible[k:] if is_start(r.row)]


def to_recheck(o: Outcome, k: int) -> list:
    """The trials a second look re-runs at the next seed: infeasible by less than ``band`` pp
    beyond the margin, not yet looked at twice, and either among the top K of the feasible and
    these by their score, or a start point (the space's nearest point to the reference). None
    where K is 0 or the band is. (ASHA tends to stop sampled near misses early, as infeasible
    trials rank below feasible ones: start points, which it never stops, are the usual ones.)"""
    if k <= 0 or o.band <= 0 or o.reference is None:
        return []
    near = lambda r: not r.feasible and not r.gaps and r.gap is not None and r.gap >= -(o.margin + o.band)
    pool = [r for r in o.ranked if r.feasible or near(r)]  # best score first
    return [r for i, r in enumerate(pool) if near(r) and (i < k or is_start(r.row))]


# --------------------------------------------------------------------------- Pareto
def dominates(a: dict, b: dict) -> bool:
    ka = (a["val_acc"], -a["epoch_time_last5_s"], -a["peak_mem_gib"])
    kb = (b["val_acc"], -b["epoch_time_last5_s"], -b["peak_mem_gib"])
    return all(x >= y for x, y in zip(ka, kb)) and any(x > y for x, y in zip(ka, kb))


def pareto_front(rows: list[dict]) -> list[dict]:
    """Non-dominated rows (max val_acc, min epoch time, min peak memory), best accuracy first."""
    ok = [r for r in rows if all(k in r["metrics"] for k in ("val_acc", "epoch_time_last5_s", "peak_mem_gib"))]
    front = [r for r in ok if not any(dominates(o["metrics"], r["metrics"]) for o in ok if o is not r)]
    return sorted(front, key=lambda r: -r["metrics"]["val_acc"])


# --------------------------------------------------------------------------- the pick to export
@dataclass
class Pick:
    kind: str  # "trial" | "baseline"
    row: dict  # the MLflow row of the trial, or of the baseline
    measured: dict  # the figures the pick is judged by
    reason: str


PICKS = "expected best, baseline or pareto-N"
BASELINE_ASKED = "the reference baseline, the best static run (--pick baseline)"


def pick(o: Outcome, objective: str, how: str) -> Pick:
    """What ``export`` writes: the best feasible trial, entry N of the feasible Pareto front,
    or the reference baseline when no feasible trial beats it or when asked for (``baseline``)."""
    if how == "baseline":
        if o.reference is None:
            raise ConfigError("--pick baseline: no static baseline of this search finished")
        return Pick("baseline", o.reference, o.reference["metrics"], BASELINE_ASKED)
    if how == "best":
        if objective == "pareto":
            front = pareto_front([{**r.row, "metrics": r.measured} for r in o.feasible])
            chosen = max(front, key=lambda r: r["metrics"]["efficiency"]) if front else None
            best = next((r for r in o.feasible if chosen and r.row["run_id"] == chosen["run_id"]), None)
        else:
            best = o.best
        if best is not None and (o.reference is None or best.ratio > 1.0):
            return Pick("trial", best.row, best.measured, "best feasible trial")
        if o.reference is not None:
            why = ("every trial failed (each one's reason is on its line and in its MLflow run)"
                   if o.failed and len(o.failed) == o.trials else
                   "no trial finished all epochs" if not o.ranked else
                   "no trial kept validation accuracy within the margin" if best is None else
                   f"the best feasible trial scored {best.ratio:.2f}x the baseline")
            return Pick("baseline", o.reference, o.reference["metrics"], f"nothing feasible beat the baseline: {why}")
        raise ConfigError("no finished trial to export" if not o.ranked else
                          "no trial is feasible and no baseline finished: nothing to export")
    if how.startswith("pareto-"):
        digits = how.split("-", 1)[1]
        if not (digits.isascii() and digits.isdigit()):  # int() would take pareto-+0 and pareto- 1 as 0 and 1
            raise ConfigError(f"--pick {how}: {PICKS}")
        i = int(digits)
        front = pareto_front([{**r.row, "metrics": r.measured} for r in o.feasible])
        if not 0 <= i < len(front):
            n = len(front)
            has = ("no feasible trial" if n == 0 else "1 feasible trial (pareto-0)" if n == 1
                   else f"{n} feasible trials (pareto-0 .. pareto-{n - 1})")  # no range of one entry or none
            raise ConfigError(f"--pick {how}: the Pareto front has {has}")
        r = next(x for x in o.feasible if x.row["run_id"] == front[i]["run_id"])
        return Pick("trial", r.row, r.measured, f"entry {i} of the feasible Pareto front")
    raise ConfigError(f"--pick {how}: {PICKS}")


# --------------------------------------------------------------------------- cost
def gpu_seconds(rows: list[dict]) -> float:
    """Device time a set of runs held: wall time x the share of the GPU each held (a baseline reused
    from an earlier search held none of this search's)."""
    total = 0.0
    for r in rows:
        if r.get("tags", {}).get("triaccel.reused_from"):  # a reused baseline: measured by an earlier search
            continue
        m = r["metrics"]
        if "wall_s" in m:
            total += m["wall_s"] * m.get("gpu_share", 1.0)
    return total


def payback(search_gpu_s: float, ref_epoch_s: float, tuned_epoch_s: float) -> dict:
    """After how many production epochs the search's device time is repaid by faster epochs."""
    saved = ref_epoch_s - tuned_epoch_s
    return {"search_gpu_s": search_gpu_s, "saved_s_per_epoch": saved,
            "payback_epochs": search_gpu_s / saved if saved > 0 else None}


def trade(measured: dict, ref: dict) -> dict:
    """What the efficiency ratio is made of: the exported run's epoch time and peak memory as
    multiples of the reference's. The score weighs them alike, so a config can win it while
    being slower per epoch (checkpointing on an H200: 1.30x the epoch time at 0.70x the memory): a
    user who pays for time, not memory, must see that before exporting."""
    return {"epoch_time_ratio": measured["epoch_time_last5_s"] / ref["epoch_time_last5_s"],
            "peak_mem_ratio": measured["peak_mem_gib"] / ref["peak_mem_gib"]}


def trade_words(t: dict) -> str:
    """``trade`` in a few words: 'epochs 1.30x as long at 0.70x the peak memory'."""
    time = (f"epochs {t['epoch_time_ratio']:.2f}x as long" if t["epoch_time_ratio"] > 1.005 else
            f"epochs {t['epoch_time_ratio']:.2f}x the time" if t["epoch_time_ratio"] < 0.995 else "epochs as long")
    return f"{time} at {t['peak_mem_ratio']:.2f}x the peak memory"


def fmt(x: float | None, spec: str = ".2f", none: str = "-") -> str:
    return none if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


# --------------------------------------------------------------------------- judging at the production length
# one-sided 95 % quantiles of Student's t by degrees of freedom (1 .. 30); the normal's beyond
_T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753,
        1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697)


def t95(df: int) -> float:
    """The one-sided 95 % quantile of Student's t with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError(f"t95: degrees of freedom must be >= 1, got {df}")
    return _T95[df - 1] if df <= len(_T95) else 1.645


@dataclass
class Paired:
    """A candidate against the reference, seed by seed, at the production length."""
    key: str  # the trial's run id, or "baseline"
    seeds: tuple
    ratios: tuple  # efficiency / the reference's at the same seed
    acc_diffs: tuple  # validation accuracy minus the reference's at the same seed (pp)
    mean: float
    std: float  # sample standard deviation (0 with one seed)
    lower: float | None  # one-sided 95 % lower bound of the mean ratio (None with one seed)
    acc_mean: float
    preferred: bool  # lower bound above 1.0 and accuracy within the margin
    why: str


def paired(key: str, cand: dict, ref: dict, margin: float) -> Paired | None:
    """``cand`` and ``ref``: seed -> metrics (efficiency, val_acc). None where no seed has both."""
    seeds = tuple(sorted(s for s in cand if s in ref))
    if not seeds:
        return None
    ratios = tuple(cand[s]["efficiency"] / ref[s]["efficiency"] for s in seeds)
    diffs = tuple(cand[s]["val_acc"] - ref[s]["val_acc"] for s in seeds)
    n = len(seeds)
    mean = sum(ratios) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in ratios) / (n - 1)) if n > 1 else 0.0
    lower = mean - t95(n - 1) * std / math.sqrt(n) if n > 1 else None
    acc = sum(diffs) / n
    if lower is None:
        ok, why = False, "one seed: no lower bound"
    elif acc < -margin:
        ok, why = False, f"accuracy {acc:+.2f} pp, beyond the {margin:g} pp margin"
    elif lower <= 1.0:
        ok, why = False, f"lower bound {lower:.3f} <= 1.0"
    else:
        ok, why = True, f"lower bound {lower:.3f} > 1.0"
    return Paired(key, seeds, ratios, diffs, mean, std, lower, acc, ok, why)


def verdict(pairs: list) -> Paired | None:
    """The candidate to export: the preferred one (``Paired.preferred``) with the highest mean ratio;
    None: none is preferred, the static reference is exported."""
    ok = [p for p in pairs if p is not None and p.preferred]
    return max(ok, key=lambda p: p.mean) if ok else None


def paired_words(p: Paired) -> str:
    """'1.023 ± 0.010 over 3 seeds, 95 % lower bound 1.001, d.acc +0.12 pp'."""
    low = "-" if p.lower is None else f"{p.lower:.3f}"
    return (f"ratio {p.mean:.3f} ± {p.std:.3f} over {len(p.seeds)} seed{'s' if len(p.seeds) > 1 else ''}, "
            f"95 % lower bound {low}, d.acc {p.acc_mean:+.2f} pp")
