"""Search spaces: one schema, defined once, validated before Ray starts.

A space file (``spaces/*.yaml``)::

    name: quickstart              # default search name
    objective: efficiency         # efficiency (the paper's score, maximised) | pareto
    trials: 12                    # Optuna trials
    concurrency: 2                # trials at once
    gpus_per_trial: 0.25          # fraction of a GPU per trial (ignored without CUDA)
    scheduler: asha               # asha (early stopping) | none
    sampler: tpe                  # tpe | random
    seed: 0
    train: {...}                  # the fixed training settings: any TrainConfig keys
    baseline:                     # the static reference a user would run without the search
      batch_sizes: [96, 256, 512] # static AMP runs, alone, same epochs and seed (default: B, 2B, 4B)
      amp_dtypes: [bf16]          # default: train.amp_dtype ([] batch_sizes: no baseline)
      capture: [false, true]      # eager and/or captured step (CUDA graphs); default [false]: eager
      compile: [none, default]    # torch.compile'd forward or not (none); default: train's compile
      accuracy_margin: 0.5        # pp a trial may fall below the reference baseline (default 0.5)
      second_look: 1.0            # with the confirm runs: pp beyond the margin a trial is re-run at the
                                  # next seed beside the reference, judged by the mean gap (1.0; 0: never)
    start:                        # trials Optuna runs first, as given (any subset of the params;
      - {triaccel.precision.tau_low: 1000.0}   # the rest sampled): a known-good point to beat
    params:                       # the searched keys (dotted TrainConfig paths); tau in units of the median
      triaccel.precision.tau_low:  {distribution: loguniform, low: 1.0e-2, high: 1.0e+3}  # layer variance
      triaccel.precision.tau_high: {distribution: loguniform, low: 1.0e-1, high: 1.0e+4,  # (scale: relative,
                                    above: triaccel.precision.tau_low}                    # the default)

Distributions and their bounds (all bounds inclusive):
- ``uniform``: low <= x <= high;
- ``loguniform``: 0 < low <= x <= high, uniform in log x;
- ``int``: integers low, low+step, ... <= high;
- ``categorical``: one of ``choices``, each a value the key accepts (a pair for ``optim.betas``:
  ``choices: [[0.9, 0.999], [0.8, 0.99]]``).

Ordered pairs (tau_low < tau_high, rho_low < rho_high) hold by construction, not by
rejection: a parameter with ``above: OTHER`` is sampled as a position u in [0, 1] within the
part of its range above OTHER's value, ``x = lo' + u (high - lo')`` with
``lo' = max(low, OTHER * (1 + 1e-6))`` (in log space for loguniform). Optuna sees a fixed
box (OTHER and u), so TPE's multivariate model works unchanged. Every error is one line
naming the file and the key.

``start`` points are enqueued (Ray's ``points_to_evaluate``, Optuna's ``enqueue_trial``) before
any sampled trial: the search begins from what the space's author knows works (the shipped
spaces start from "every layer 16-bit, curvature barely scaling the lr, no promotions", the
Tri-Accel loop's nearest point to the static reference) and TPE models around it. A value of
an ``above`` parameter is given in real units and must lie above its partner's.
"""
from __future__ import annotations

import copy
import hashlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from triaccel.config import MAX_BATCH, TrainConfig, from_dict, path_kind, read_yaml, set_dotted
from triaccel.errors import ConfigError

DISTRIBUTIONS = ("uniform", "loguniform", "int", "categorical")
TOP_KEYS = {"name", "objective", "trials", "concurrency", "gpus_per_trial", "cpus_per_trial", "scheduler",
            "sampler", "seed", "grace_period", "train", "params", "description", "baseline", "start",
            "production_epochs", "judge_seeds"}
BASELINE_KEYS = {"batch_sizes", "amp_dtypes", "capture", "compile", "accuracy_margin", "second_look"}
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "reduce-overhead")
PARAM_KEYS = {"distribution", "low", "high", "step", "choices", "above"}
DIST_KEYS = {"uniform": {"distribution", "low", "high", "above"}, "loguniform": {"distribution", "low", "high", "above"},
             "int": {"distribution", "low", "high", "step", "above"}, "categorical": {"distribution", "choices", "above"}}
MAX_TRIALS = 10_000  # Tune rewrites its state, every trial in it, after every event: more is a typo
FRAC_SUFFIX = "@frac"  # Optuna's name for the position of an `above` parameter within its feasible range
EPS = 1e-6


@dataclass
class Param:
    key: str
    distribution: str
    low: float | None = None
    high: float | None = None
    step: int | None = None
    choices: list | None = None
    above: str | None = None


@dataclass
class SearchSpace:
    name: str
    train: dict
    params: dict[str, Param]
    objective: str = "efficiency"
    trials: int = 12
    concurrency: int = 2
    gpus_per_trial: float = 0.25
    cpus_per_trial: float = 1.0
    scheduler: str = "asha"
    sampler: str = "tpe"
    seed: int = 0
    grace_period: int = 1
    baseline_batches: list = field(default_factory=list)
    baseline_dtypes: list = field(default_factory=list)
    baseline_capture: list = field(default_factory=lambda: [False])
    baseline_compile: list = field(default_factory=lambda: [None])  # compile modes, None: eager forward
    margin: float = 0.5
    second_look: float = 1.0  # pp beyond the margin that earns a trial a second seed (results.to_recheck)
    start: list = field(default_factory=list)  # points to evaluate first, in Optuna's names (``sampled``)
    # the length a user trains the export for; the judge (triaccel.search.judge) re-runs the leading
    # trials and the reference there, paired by seed, over judge_seeds seeds. None: no such judging
    production_epochs: int | None = None
    judge_seeds: int = 3
    source: str = "<dict>"
    sha256: str = ""
    raw: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ Optuna
    def optuna_distributions(self) -> dict:
        import warnings

        import optuna.distributions as od

        out = {}
        for k, p in self.params.items():
            if p.above:
                out[k + FRAC_SUFFIX] = od.FloatDistribution(0.0, 1.0)
            elif p.distribution == "uniform":
                out[k] = od.FloatDistribution(p.low, p.high)
            elif p.distribution == "loguniform":
                out[k] = od.FloatDistribution(p.low, p.high, log=True)
            elif p.distribution == "int":
                out[k] = od.IntDistribution(int(p.low), int(p.high), step=p.step or 1)
            else:
                # Optuna warns that a list choice suits no database storage: the study lives in memory
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    out[k] = od.CategoricalDistribution(p.choices)
        return out

    def resolve(self, sampled: dict) -> dict:
        """Optuna's sample (with @frac positions) -> the real value of every searched key."""
        out = {}
        for k, p in self._ordered():
            if not p.above:
                out[k] = sampled[k]
                continue
            u = float(sampled[k + FRAC_SUFFIX])
            other = float(out[p.above])
            lo = max(p.low, other * (1 + EPS) if other > 0 else other + EPS)
            if p.distribution == "loguniform":
                out[k] = math.exp(math.log(lo) + u * (math.log(p.high) - math.log(lo)))
            else:
                out[k] = lo + u * (p.high - lo)
            out[k] = min(max(out[k], lo), p.high)  # exp(log(x)) may round just outside the bounds
        return out

    def sampled(self, values: dict) -> dict:
        """The inverse of ``resolve`` for a (partial) point: real values -> Optuna's names, an
        ``above`` parameter as its position within the range left above its partner."""
        out = {}
        for k, v in values.items():
            p = self.params[k]
            if not p.above:
                out[k] = v
                continue
            other = float(values[p.above])
            lo = max(p.low, other * (1 + EPS) if other > 0 else other + EPS)
            if p.distribution == "loguniform":
                span = math.log(p.high) - math.log(lo)
                u = (math.log(v) - math.log(lo)) / span if span > 0 else 0.0
            else:
                u = (v - lo) / (p.high - lo) if p.high > lo else 0.0
            out[k + FRAC_SUFFIX] = min(1.0, max(0.0, u))
        return out

    def _ordered(self):
        done, order = set(), []
        pending = dict(self.params)
        while pending:
            for k, p in list(pending.items()):
                if not p.above or p.above in done:
                    order.append((k, p))
                    done.add(k)
                    del pending[k]
        return order

    def train_dict(self, values: dict) -> dict:
        d = copy.deepcopy(self.train)
        for k, v in values.items():
            set_dotted(d, k, v)
        return d

    def train_config(self, values: dict) -> TrainConfig:
        return from_dict(TrainConfig, self.train_dict(values))

    @property
    def epochs(self) -> int:
        return from_dict(TrainConfig, copy.deepcopy(self.train)).epochs

    def baseline_runs(self) -> list[tuple[str, dict]]:
        """(label, train dict) of every static AMP baseline: the space's train settings as they
        are, in amp mode at each declared batch size, dtype, step (eager / captured) and forward
        (eager / compiled)."""
        out = []
        for comp in self.baseline_compile:
            for cap in self.baseline_capture:
                for dt in self.baseline_dtypes:
                    for b in self.baseline_batches:
                        d = copy.deepcopy(self.train)
                        d.pop("triaccel", None)
                        d.update(mode="amp", amp_dtype=dt, batch_size=b, evaluate_test=False, capture=cap,
                                 compile=comp)
                        d["accum_steps"] = 1
                        label = f"amp-{dt}-B{b}" + ("-captured" if cap else "")
                        if comp is not None:
                            label += "-compiled" + ("" if comp == "default" else f"-{comp}")
                        out.append((label, d))
        return out

    def baseline_train(self, label: str) -> dict:
        """The train dict of the baseline run ``label`` (an MLflow tag of a search's run). A search saved
        without baseline.compile labels a compiled baseline without its -compiled suffix."""
        runs = dict(self.baseline_runs())
        if label in runs:
            return copy.deepcopy(runs[label])
        comp = self.train.get("compile")
        if comp:
            old = f"{label}-compiled" + ("" if comp == "default" else f"-{comp}")
            if old in runs:
                return copy.deepcopy(runs[old])
        raise ConfigError(f"{self.source}: baseline: the search's baseline {label} is not among this space's "
                          f"({', '.join(runs) or 'none'}): its baseline section changed since the search ran")

    @property
    def metric(self):
        return "efficiency" if self.objective == "efficiency" else ["val_acc", "epoch_time_last5_s", "peak_mem_gib"]

    @property
    def mode(self):
        return "max" if self.objective == "efficiency" else ["max", "min", "min"]


def _err(src: str, key: str, msg: str) -> ConfigError:
    return ConfigError(f"{src}: {key}: {msg}")


def _num(src, key, v, what):
    """A finite number (a numeric string too: YAML reads 1e-8 as one): NaN or infinity would
    reach Optuna's bounds or Tune's resources and fail there, after the search started."""
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            pass
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise _err(src, key, f"{what} must be a number, got {v!r}")
    if not math.isfinite(v):
        raise _err(src, key, f"{what} must be a finite number, got {v!r}")
    return v


def _span(train: dict, params: dict, key: str, default):
    """The least and greatest value ``key`` takes in the search: its param's range or its fixed value."""
    p = params.get(key)
    if p is not None:
        if p.distribution == "categorical":
            nums = [c for c in p.choices if isinstance(c, (int, float)) and not isinstance(c, bool)]
            return (min(nums), max(nums)) if nums else (None, None)
        return p.low, p.high
    cur = train
    for part in key.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return default, default
        cur = cur[part]
    return (cur, cur) if isinstance(cur, (int, float)) and not isinstance(cur, bool) else (None, None)


def _check_batch_bounds(src: str, train: dict, params: dict) -> None:
    """A batch_size the batch controller's bounds can refuse for some draws (the trainer refuses it): said
    at the start, not trial by trial."""
    keys = ("batch_size", "triaccel.batch.min_batch", "triaccel.batch.max_batch")
    if not any(k in params for k in keys) or "mode" in params or train.get("mode") != "triaccel":
        return
    batch = train.get("triaccel", {}).get("batch", {}) if isinstance(train.get("triaccel"), dict) else {}
    if isinstance(batch, dict) and batch.get("enabled") is False:
        return
    (b_lo, b_hi), (_, mn_hi), (mx_lo, _) = (_span(train, params, "batch_size", 96),
                                            _span(train, params, keys[1], 8), _span(train, params, keys[2], 4096))
    if None in (b_lo, b_hi, mn_hi, mx_lo):
        return
    if b_hi > mx_lo:
        raise _err(src, "params", f"batch_size can be {b_hi:g}, above triaccel.batch.max_batch's least value "
                                  f"{mx_lo:g}: those draws would be refused; narrow one of the ranges")
    if b_lo < mn_hi:
        raise _err(src, "params", f"batch_size can be {b_lo:g}, below triaccel.batch.min_batch's greatest value "
                                  f"{mn_hi:g}: those draws would be refused; narrow one of the ranges")


CONTROLLER_DEFAULTS = "score"  # recorded with each search: the controller rules its unset keys meant


def pin_controller_defaults(raw: dict, saved_with: str | None) -> dict:
    """A saved search's space as it was trained: a search saved without ``saved_with`` trained its unset
    keys under the paper's rules, so ``triaccel.policy: paper`` is set
    where the space does not set a policy itself (resume and export would otherwise train and write rules
    the search never measured)."""
    if saved_with is not None or not isinstance(raw, dict) or not isinstance(raw.get("train", {}), (dict, type(None))):
        return raw
    raw = copy.deepcopy(raw)
    if raw.get("train") is None:  # `train:` left empty reads as {} (parse_space)
        raw["train"] = {}
    tri = raw["train"].get("triaccel")
    if tri is None:
        raw["train"]["triaccel"] = {"policy": "paper"}
    elif isinstance(tri, dict):
        tri.setdefault("policy", "paper")
    return raw


def is_section(key: str) -> bool:
    """Whether a dotted key names a section of the training config (triaccel.batch), not one key."""
    import dataclasses
    import typing

    cls = TrainConfig
    for part in key.split("."):
        if not dataclasses.is_dataclass(cls):
            return False
        hint = typing.get_type_hints(cls).get(part)
        inner = [a for a in typing.get_args(hint) if a is not type(None)]  # Optional[Section]
        cls = inner[0] if len(inner) == 1 else hint
    return dataclasses.is_dataclass(cls)


def section_refusal(key: str, spec) -> str:
    """Why a searched section is refused: its value would replace the whole section, so the section's other
    keys (fixed in train:, or defaults) would be dropped from every trial while the summary and the export's
    provenance show the searched mapping as if merged. Searching its keys one by one says what trains."""
    choices = spec.get("choices") if isinstance(spec, dict) else None
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    if first:
        k = next(iter(first))
        vals = [c.get(k) for c in choices if isinstance(c, dict)]
        example = f"params.{key}.{k}: {{distribution: categorical, choices: {vals}}}"
    else:
        example = f"params.{key}.KEY"
    return (f"names a section, not a key: a searched value would replace the whole section (its other keys "
            f"dropped); search the section's keys themselves, e.g. {example}")


def parse_space(data: dict, source: str = "<dict>", sha256: str = "", strict: bool = False) -> SearchSpace:
    """``strict``: also the rules that some saved searches' spaces do not meet (for a new search's
    space, from ``load_space`` or the CLI's overrides); a saved search's space is read as it was accepted,
    so its finished trials can still be resumed and exported."""
    src = source
    if not isinstance(data, dict):
        raise ConfigError(f"{src}: top level must be a mapping")
    for k in data:
        if k not in TOP_KEYS:
            raise _err(src, k, f"unknown key (valid: {', '.join(sorted(TOP_KEYS))})")
    for k in ("train", "params"):
        if k not in data:
            raise _err(src, k, "missing")
    train = data["train"] or {}
    try:
        base = from_dict(TrainConfig, copy.deepcopy(train))
    except ConfigError as e:
        raise ConfigError(f"{src}: train.{e}") from None
    raw_params = data["params"] or {}
    if not isinstance(raw_params, dict) or not raw_params:
        raise _err(src, "params", "must be a non-empty mapping of dotted config keys")
    params: dict[str, Param] = {}
    for key, spec in raw_params.items():
        pk = f"params.{key}"
        if not isinstance(key, str) or not key:
            raise _err(src, pk, "a searched key must be a dotted config key (text), e.g. optim.lr")
        if not isinstance(spec, dict):
            raise _err(src, pk, "must be a mapping with a distribution")
        for sk in spec:
            if sk not in PARAM_KEYS:
                raise _err(src, f"{pk}.{sk}", f"unknown key (valid: {', '.join(sorted(PARAM_KEYS))})")
        dist = spec.get("distribution")
        if dist not in DISTRIBUTIONS:
            raise _err(src, pk, f"unknown distribution {dist!r} (valid: {', '.join(DISTRIBUTIONS)})")
        for sk in spec:  # {distribution: uniform, ..., step: 0.25} would search a continuous range without a word
            if sk not in DIST_KEYS[dist]:
                raise _err(src, f"{pk}.{sk}", f"{dist} does not use {sk} (it takes "
                                              f"{', '.join(sorted(DIST_KEYS[dist] - {'distribution'}))})"
                           + ("; a grid is `distribution: int` with a step, or categorical choices"
                              if sk == "step" else ""))
        above = spec.get("above")
        if above is not None and not isinstance(above, str):
            raise _err(src, f"{pk}.above", f"must name another searched key, got {above!r}")
        if strict and is_section(key):
            raise _err(src, pk, section_refusal(key, spec))
        p = Param(key, dist, above=above)
        if dist == "categorical":
            ch = spec.get("choices")
            if not isinstance(ch, list) or not ch:
                raise _err(src, pk, "categorical needs a non-empty list of choices")
            dup = next((b for i, a in enumerate(ch) for b in ch[i + 1:] if type(a) is type(b) and a == b), None)
            if dup is not None:  # a repeated choice is drawn twice as often: a weight nobody wrote down
                raise _err(src, f"{pk}.choices", f"{dup!r} is listed twice")
            p.choices = ch
        else:
            if "low" not in spec or "high" not in spec:
                raise _err(src, pk, "needs low and high (inclusive bounds)")
            p.low = _num(src, pk, spec["low"], "low")
            p.high = _num(src, pk, spec["high"], "high")
            if p.low > p.high:
                raise _err(src, pk, f"low ({p.low}) > high ({p.high})")
            if dist == "loguniform" and p.low <= 0:
                raise _err(src, pk, f"a log range must be above 0, got low={p.low}")
            if dist == "int":
                if int(p.low) != p.low or int(p.high) != p.high:
                    raise _err(src, pk, "int bounds must be integers")
                step = spec.get("step", 1)
                if isinstance(step, float) and step.is_integer():
                    step = int(step)
                if not isinstance(step, int) or isinstance(step, bool) or step < 1:
                    raise _err(src, f"{pk}.step", f"must be an integer >= 1, got {step!r}")
                if (int(p.high) - int(p.low)) % step:  # Optuna narrowed [8, 12] step 8 to [8, 8] with only a warning
                    top = int(p.low) + (int(p.high) - int(p.low)) // step * step
                    raise _err(src, f"{pk}.step", f"high ({int(p.high)}) is not on the grid low + k * step "
                                                  f"(low {int(p.low)}, step {step}): the largest value drawn would be "
                                                  f"{top}; make high {top} or {top + step}")
                p.step = step
        # the key must be a real config key and every bound a value the config accepts
        for probe in ([p.low, p.high] if p.choices is None else p.choices):
            d = copy.deepcopy(train)
            try:
                set_dotted(d, key, probe)
                from_dict(TrainConfig, d)
            except ConfigError as e:
                msg = str(e)
                if "unknown key" in msg:
                    raise _err(src, pk, f"not a training config key ({msg})") from None
                if "must be > tau_low" in msg or "rho_high" in msg or "tau_high" in msg:
                    continue  # ordered pairs are checked below, against the partner's range
                raise _err(src, pk, f"bound {probe!r} is not a valid value: {msg}") from None
        params[key] = p
    for key, p in params.items():
        if p.above:
            pk = f"params.{key}.above"
            if p.above not in params:
                raise _err(src, pk, f"{p.above!r} is not a searched key")
            if p.above == key:
                raise _err(src, pk, "a key cannot be ordered above itself")
            q = params[p.above]
            if p.distribution not in ("uniform", "loguniform") or q.distribution not in ("uniform", "loguniform"):
                raise _err(src, pk, "ordered pairs need uniform or loguniform on both sides")
            if p.high <= q.low:
                raise _err(src, pk, f"high ({p.high}) must exceed {p.above}'s low ({q.low}): no value can lie above it")
            top = q.high * (1 + EPS) if q.high > 0 else q.high + EPS  # the least value above the partner's highest
            if strict and p.high <= top:
                # a draw of the partner above this high leaves no room: resolve() would clamp this key to its
                # high, below the partner, and every such trial would fail in the trainer
                raise _err(src, pk, f"high ({p.high:g}) must exceed {p.above}'s high ({q.high:g}): a draw of "
                                    f"{p.above} near its high would leave no value above it")
            if q.above:
                raise _err(src, pk, "chains of `above` are not supported")
    # unordered pairs the trainer would reject for some draws
    for lo_key, hi_key in (("triaccel.precision.tau_low", "triaccel.precision.tau_high"),
                           ("triaccel.batch.rho_low", "triaccel.batch.rho_high")):
        if lo_key in params and hi_key in params and params[hi_key].above != lo_key:
            lo, hi = params[lo_key], params[hi_key]
            if lo.high is not None and hi.low is not None and hi.low <= lo.high:
                raise _err(src, f"params.{hi_key}", f"ranges overlap {lo_key}'s: add `above: {lo_key}`")

    if strict:
        _check_batch_bounds(src, train, params)
        try:
            base.data.check_read()
        except ConfigError as e:
            raise ConfigError(f"{src}: train.{e}") from None

    def opt(key, typ, default, check=None, why=""):
        v = data.get(key, default)
        if typ is float:
            v = _num(src, key, v, key)
        elif not isinstance(v, typ) or isinstance(v, bool) and typ is not bool:
            raise _err(src, key, f"must be {typ.__name__}, got {v!r}")
        if check and not check(v):
            raise _err(src, key, why)
        return v

    space = SearchSpace(
        name=opt("name", str, Path(source).stem if source != "<dict>" else "search"),
        train=copy.deepcopy(train), params=params,
        objective=opt("objective", str, "efficiency", lambda v: v in ("efficiency", "pareto"),
                      "must be efficiency or pareto"),
        trials=opt("trials", int, 12, lambda v: 1 <= v <= MAX_TRIALS, f"must be in [1, {MAX_TRIALS}]"),
        concurrency=opt("concurrency", int, 2, lambda v: v >= 1, "must be >= 1"),
        gpus_per_trial=opt("gpus_per_trial", float, 0.25, lambda v: 0 < v <= 8, "must be in (0, 8]"),
        cpus_per_trial=opt("cpus_per_trial", float, 1.0, lambda v: v > 0, "must be > 0"),
        scheduler=opt("scheduler", str, "asha", lambda v: v in ("asha", "none"), "must be asha or none"),
        sampler=opt("sampler", str, "tpe", lambda v: v in ("tpe", "random"), "must be tpe or random"),
        seed=opt("seed", int, 0, lambda v: 0 <= v < 2**32, "must be in [0, 2**32) (the samplers' seed range)"),
        grace_period=opt("grace_period", int, 1, lambda v: v >= 1, "must be >= 1"),
        source=source, sha256=sha256, raw=copy.deepcopy(data))
    (space.baseline_batches, space.baseline_dtypes, space.baseline_capture, space.baseline_compile,
     space.margin, space.second_look) = _baseline(src, data.get("baseline"), base)
    space.start = _start(src, data.get("start"), space)
    if data.get("production_epochs") is not None:
        space.production_epochs = opt("production_epochs", int, None, lambda v: base.epochs <= v <= 100_000,
                                      f"must be in [train.epochs ({base.epochs}), 100000]: the length the "
                                      f"export is trained for, judged at that length")
    space.judge_seeds = opt("judge_seeds", int, 3, lambda v: 2 <= v <= 20,
                            "must be in [2, 20]: a lower bound over seeds needs at least two")
    for label, d in space.baseline_runs():  # built after the parent run: one that cannot train fails at load
        try:
            from_dict(TrainConfig, d)
        except ConfigError as e:
            raise _err(src, "baseline", f"the static baseline {label} (train settings in amp mode) is not a valid "
                                        f"config: {e}") from None
    if space.grace_period > base.epochs:
        raise _err(src, "grace_period", f"must be <= train.epochs ({base.epochs})")
    return space


# A trial Optuna ran from a ``start`` point (an enqueued trial) carries this key in its Tune config
# and this tag on its MLflow run. Known by where it came from, not by its values: a point that sets
# some keys would match every sampled trial that drew the same values for them.
START = "triaccel.start"


def _start(src: str, spec, space: SearchSpace) -> list:
    """The ``start`` points, checked against the params' ranges, in Optuna's names."""
    if spec is None:
        return []
    if not isinstance(spec, list):
        raise _err(src, "start", "must be a list of points (mappings of searched keys to values)")
    out = []
    for i, point in enumerate(spec):
        sk = f"start[{i}]"
        if not isinstance(point, dict) or not point:
            raise _err(src, sk, "must be a non-empty mapping of searched keys to values")
        later = lambda kv: bool(space.params.get(kv[0]) and space.params[kv[0]].above)  # noqa: E731
        for k, v in sorted(point.items(), key=later):  # an ordered key after its partner
            p = space.params.get(k)
            if p is None:
                raise _err(src, f"{sk}.{k}", "not a searched key (a start point sets params only)")
            if p.choices is not None:
                if v not in p.choices:
                    raise _err(src, f"{sk}.{k}", f"{v!r} is not one of the choices {p.choices}")
                continue
            v = _num(src, f"{sk}.{k}", v, "the value")
            if not p.low <= v <= p.high:
                raise _err(src, f"{sk}.{k}", f"{v} is outside the range [{p.low}, {p.high}]")
            if p.distribution == "int" and (v - p.low) % (p.step or 1):
                raise _err(src, f"{sk}.{k}", f"{v} is not on the int grid (low {p.low}, step {p.step})")
            point[k] = int(v) if p.distribution == "int" else v
            if p.above:
                if p.above not in point:
                    raise _err(src, f"{sk}.{k}", f"needs {p.above} in the same point (it is ordered above it)")
                other = float(point[p.above])
                least = other * (1 + EPS) if other > 0 else other + EPS  # what resolve() can give
                if not v >= least:  # resolve() would run it at least, not at v
                    raise _err(src, f"{sk}.{k}", f"{v} must be above {p.above} ({point[p.above]}) "
                                                 f"by at least {EPS:g} (relative)")
        out.append(space.sampled(point))
    return out


def _baseline(src: str, spec, base: TrainConfig) -> tuple[list, list, list, list, float, float]:
    """The ``baseline`` section: batch sizes, AMP dtypes, steps, forwards and the accuracy margin, checked."""
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise _err(src, "baseline", "must be a mapping (batch_sizes, amp_dtypes, accuracy_margin)")
    for k in spec:
        if k not in BASELINE_KEYS:
            raise _err(src, f"baseline.{k}", f"unknown key (valid: {', '.join(sorted(BASELINE_KEYS))})")
    b0 = base.batch_size
    sizes = spec.get("batch_sizes", [b0, 2 * b0, 4 * b0])
    if not isinstance(sizes, list) or not all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= MAX_BATCH
                                              for x in sizes):
        raise _err(src, "baseline.batch_sizes", f"must be a list of integers in [1, {MAX_BATCH}], got {sizes!r}")
    default_dt = base.amp_dtype if base.amp_dtype in ("bf16", "fp16") else "bf16"
    dtypes = spec.get("amp_dtypes", [default_dt])
    if not isinstance(dtypes, list) or not dtypes or not all(d in ("bf16", "fp16") for d in dtypes):
        raise _err(src, "baseline.amp_dtypes", f"must be a non-empty list of bf16 / fp16, got {dtypes!r}")
    capture = spec.get("capture", [False])
    if not isinstance(capture, list) or not capture or not all(isinstance(c, bool) for c in capture):
        raise _err(src, "baseline.capture", f"must be a non-empty list of true / false, got {capture!r}")
    # none (or null / false): the eager forward; default: the trials' own setting, so both compare like for like
    compile_ = spec.get("compile", [base.compile])
    if not isinstance(compile_, list) or not compile_:
        raise _err(src, "baseline.compile", f"must be a non-empty list of none / {' / '.join(COMPILE_MODES)}, "
                                            f"got {compile_!r}")
    modes = []
    for c in compile_:
        if c is None or c is False or c == "none":  # (not 0: 0 == False)
            modes.append(None)
        elif isinstance(c, str) and c in COMPILE_MODES:
            modes.append(c)
        else:
            raise _err(src, "baseline.compile", f"{c!r} is not one of none, {', '.join(COMPILE_MODES)}")
    margin = _num(src, "baseline.accuracy_margin", spec.get("accuracy_margin", 0.5), "accuracy_margin")
    if margin < 0:
        raise _err(src, "baseline.accuracy_margin", f"must be >= 0 (percentage points), got {margin}")
    look = _num(src, "baseline.second_look", spec.get("second_look", 1.0), "second_look")
    if not 0 <= look <= 100:
        raise _err(src, "baseline.second_look", f"must be in [0, 100] (percentage points), got {look}")
    return (sorted(set(sizes)), list(dict.fromkeys(dtypes)), list(dict.fromkeys(capture)), list(dict.fromkeys(modes)),
            float(margin), float(look))


def resolve_space_path(path: str) -> Path:
    """A file path, or the name of a space shipped with the package (``quickstart``)."""
    p = Path(path)
    is_dir, exists, is_link = path_kind(p)
    if exists and not is_dir:
        if not p.is_file():  # a pipe or a device: read twice below (settings, then the sha256 recorded)
            raise ConfigError(f"{path}: not a regular file; a space is read from a file")
        return p
    if is_dir:  # a folder that is there, not a missing space file
        raise ConfigError(f"{path}: is a folder, not a space file")
    # a path with a folder names a file, never a shipped space: pathlib reads "./quickstart.yaml" as
    # "quickstart.yaml", which would run the shipped space for a user who means the file in this folder
    if "/" in path or os.sep in path or is_link:  # a dangling link named so is the user's file too
        raise ConfigError(f"{path}: no such space file")
    from importlib import resources

    name = p.name if p.suffix == ".yaml" else p.name + ".yaml"
    shipped = resources.files("triaccel.spaces") / name
    if shipped.is_file():
        return Path(str(shipped))
    raise ConfigError(f"{path}: no such space file (shipped: {', '.join(shipped_spaces())})")


def shipped_spaces() -> list[str]:
    from importlib import resources

    return sorted(f.name[:-5] for f in resources.files("triaccel.spaces").iterdir() if f.name.endswith(".yaml"))


def load_space(path: str) -> SearchSpace:
    p = resolve_space_path(path)
    data = read_yaml(p)  # one line for what cannot be read (permissions, /proc files, pipes)
    try:
        raw = p.read_bytes()  # for the space's sha256, once read_yaml has accepted it
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror or e})") from None
    return parse_space(data, source=str(path), sha256=hashlib.sha256(raw).hexdigest(), strict=True)


def space_overrides(space: SearchSpace, **kw: Any) -> SearchSpace:
    for k, v in kw.items():
        if v is not None:
            setattr(space, k, v)
    return space
