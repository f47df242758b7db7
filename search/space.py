"""Search spaces: one schema, defined once, validated before Ray starts.

A space file (``spaces/*.yaml``)::

    name: quickstart              # default search name
    objective: efficiency         # efficiency (the paper's score, maximised) | pareto
    trials: 12                    # Optuna trials
    concurrency: 2                # trials at once
    gpus_per_trial: 0.25          # fraction of a GPU per trial (ignored without CUDA)
    scheduler: asha               # asha (early stopping) | none
    sampler: tpe                  # tpe | random
    near_best: 0.5                # share of sampled trials drawn near the best so far (tpe: 0.5, random: 0)
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
      stop_dominated: false       # stop a baseline after its second epoch when even 100 % accuracy and
                                  # later epochs twice as fast would leave it below the best finished one
    start:                        # trials Optuna runs first, as given (any subset of the params;
      - {triaccel.precision.tau_low: 1000.0}   # the rest sampled): a known-good point to beat
      - {reference: true, batch_size: 96}      # the reference baseline's 16-bit type, batch, capture and
                                               # compile where searched (start_points), else as written
    params:                       # the searched keys (dotted TrainConfig paths); tau in units of the median
      triaccel.precision.tau_low:  {distribution: loguniform, low: 1.0e-2, high: 1.0e+3}  # layer variance
      triaccel.precision.tau_high: {distribution: loguniform, low: 1.0e-1, high: 1.0e+4,  # (scale: relative,
                                    above: triaccel.precision.tau_low}                    # the default)
      batch_size: {distribution: categorical, choices: [96, 192]}                         # B0

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
import dataclasses
import hashlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from triaccel.config import MAX_BATCH, ModelConfig, TrainConfig, from_dict, path_kind, read_yaml, set_dotted
from triaccel.config_io import unknown_key
from triaccel.errors import ConfigError
from triaccel.search.params import EPS, FRAC_SUFFIX, Param, check_params_read, field_error, number, parse_params

TOP_KEYS = {"name", "objective", "trials", "concurrency", "gpus_per_trial", "cpus_per_trial", "scheduler",
            "sampler", "near_best", "seed", "grace_period", "train", "params", "description", "baseline", "start",
            "production_epochs", "judge_seeds"}
BASELINE_KEYS = {"batch_sizes", "amp_dtypes", "capture", "compile", "accuracy_margin", "second_look", "stop_dominated"}
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "reduce-overhead")
MAX_TRIALS = 10_000  # Tune rewrites its state, every trial in it, after every event: more is a typo


@dataclass(frozen=True)
class SearchSpace:
    """A space as ``parse_space`` accepted it; nothing changes it afterwards. Its train settings and the
    data it was parsed from are handed out as copies (``train``, ``raw``); an override is a new space
    (``with_options``), validated as the file would be."""
    name: str
    train_settings: Mapping = field(repr=False)  # read through ``train``: a copy, never the space's own
    params: Mapping[str, Param]
    objective: str = "efficiency"
    trials: int = 12
    concurrency: int = 2
    gpus_per_trial: float = 0.25
    cpus_per_trial: float = 1.0
    scheduler: str = "asha"
    sampler: str = "tpe"
    near_best: float = 0.5  # share of sampled trials drawn near the best feasible one (search.sampler)
    seed: int = 0
    grace_period: int = 1
    baseline_batches: tuple = ()
    baseline_dtypes: tuple = ()
    baseline_capture: tuple = (False,)
    baseline_compile: tuple = (None,)  # compile modes, None: eager forward
    margin: float = 0.5
    second_look: float = 1.0  # pp beyond the margin that earns a trial a second seed (results.to_recheck)
    stop_dominated: bool = False  # baselines that cannot become the reference stop at epoch 2 (search.alone)
    start: tuple = ()  # points to evaluate first, in Optuna's names (``sampled``)
    # the length a user trains the export for; the judge (triaccel.search.judge) re-runs the leading
    # trials and the reference there, paired by seed, over judge_seeds seeds. None: no such judging
    production_epochs: int | None = None
    judge_seeds: int = 3
    source: str = "<dict>"
    sha256: str = ""
    parsed_from: Mapping = field(default_factory=dict, repr=False)  # read through ``raw``

    @property
    def train(self) -> dict:
        """The fixed training settings (a copy)."""
        return copy.deepcopy(dict(self.train_settings))

    @property
    def raw(self) -> dict:
        """The data the space was parsed from (a copy): what a search saves and a worker parses again."""
        return copy.deepcopy(dict(self.parsed_from))

    def with_options(self, **options: Any) -> "SearchSpace":
        """A new space: this one's data with top-level keys set (``trials``, ``start``, ``seed`` ...), parsed
        and checked as a new search's space. The new values are in its ``raw``, so a saved search keeps them."""
        return parse_space({**self.raw, **options}, source=self.source, sha256=self.sha256, strict=True)

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

    def train_config(self, values: dict, fixed: dict | None = None) -> TrainConfig:
        """The config of a trial with ``values``; ``fixed``: dotted keys the caller sets (a trial's own
        tracking, say), validated with the rest."""
        d = self.train_dict(values)
        for k, v in (fixed or {}).items():
            *sections, last = k.split(".")
            sec = d
            for part in sections:
                if sec.get(part) is None:  # an empty section (`tracking:`) reads as its defaults
                    sec[part] = {}
                sec = sec[part]
            sec[last] = v
        return from_dict(TrainConfig, d)

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


def parse_space(data: dict, source: str = "<dict>", sha256: str = "", strict: bool = False) -> SearchSpace:
    """``strict``: also the rules that some saved searches' spaces do not meet (for a new search's
    space, from ``load_space`` or the CLI's overrides); a saved search's space is read as it was accepted,
    so its finished trials can still be resumed and exported."""
    src = source
    if not isinstance(data, dict):
        raise ConfigError(f"{src}: top level must be a mapping")
    if "train" not in data and "params" not in data and {"mode", "model", "optim", "epochs", "data"} & set(data):
        raise ConfigError(f"{src}: a training config, not a search space (it has no train: and params:): "
                          f"`triaccel train --config {src}` trains it; a space holds such settings under train: "
                          f"and the keys it searches under params: (docs/search.md)")
    for k in data:
        if k not in TOP_KEYS:
            raise field_error(src, k, unknown_key(k, TOP_KEYS))
    for k in ("train", "params"):
        if k not in data:
            raise field_error(src, k, "missing")
    train = data["train"] or {}
    try:
        base = from_dict(TrainConfig, copy.deepcopy(train))
    except ConfigError as e:
        raise ConfigError(f"{src}: train.{e}") from None
    params = parse_params(src, data["params"] or {}, train, strict)
    if strict:
        try:
            base.data.check_read()
            ModelConfig.check_written(train.get("model"))
        except ConfigError as e:
            raise ConfigError(f"{src}: train.{e}") from None
        check_params_read(src, params, base)
    space = SearchSpace(train_settings=MappingProxyType(copy.deepcopy(train)), params=MappingProxyType(params),
                        **_options(src, data, source), **_baseline(src, data.get("baseline"), base),
                        source=source, sha256=sha256,
                        parsed_from=MappingProxyType(copy.deepcopy(data)))
    space = dataclasses.replace(space, start=_start(src, data.get("start"), space), **_judging(src, data, base))
    for label, d in space.baseline_runs():  # built after the parent run: one that cannot train fails at load
        try:
            from_dict(TrainConfig, d)
        except ConfigError as e:
            raise field_error(src, "baseline", f"the static baseline {label} (train settings in amp mode) is not "
                                               f"a valid config: {e}") from None
    if space.grace_period > base.epochs:
        raise field_error(src, "grace_period", f"must be <= train.epochs ({base.epochs})")
    return space


def _opt(src: str, data: dict, key: str, typ, default, check=None, why=""):
    """A top-level option, of its type and passing ``check``."""
    v = data.get(key, default)
    if typ is float:
        v = number(src, key, v, key)
    elif not isinstance(v, typ) or isinstance(v, bool) and typ is not bool:
        raise field_error(src, key, f"must be {typ.__name__}, got {v!r}")
    if check and not check(v):
        raise field_error(src, key, why)
    return v


def _options(src: str, data: dict, source: str) -> dict:
    """The search's options: its name, objective, trial counts, resources, scheduler and sampler."""
    return dict(
        name=_opt(src, data, "name", str, Path(source).stem if source != "<dict>" else "search"),
        objective=_opt(src, data, "objective", str, "efficiency", lambda v: v in ("efficiency", "pareto"),
                       "must be efficiency or pareto"),
        trials=_opt(src, data, "trials", int, 12, lambda v: 1 <= v <= MAX_TRIALS, f"must be in [1, {MAX_TRIALS}]"),
        concurrency=_opt(src, data, "concurrency", int, 2, lambda v: v >= 1, "must be >= 1"),
        gpus_per_trial=_opt(src, data, "gpus_per_trial", float, 0.25, lambda v: 0 < v <= 8, "must be in (0, 8]"),
        cpus_per_trial=_opt(src, data, "cpus_per_trial", float, 1.0, lambda v: v > 0, "must be > 0"),
        scheduler=_opt(src, data, "scheduler", str, "asha", lambda v: v in ("asha", "none"), "must be asha or none"),
        sampler=_opt(src, data, "sampler", str, "tpe", lambda v: v in ("tpe", "random"), "must be tpe or random"),
        near_best=_opt(src, data, "near_best", float, 0.5 if data.get("sampler", "tpe") == "tpe" else 0.0,
                       lambda v: 0 <= v <= 1, "must be in [0, 1] (the share of sampled trials drawn near the best)"),
        seed=_opt(src, data, "seed", int, 0, lambda v: 0 <= v < 2**32,
                  "must be in [0, 2**32) (the samplers' seed range)"),
        grace_period=_opt(src, data, "grace_period", int, 1, lambda v: v >= 1, "must be >= 1"))


MAX_PRODUCTION_EPOCHS = 100_000


def _judging(src: str, data: dict, base: TrainConfig) -> dict:
    """The production length the judge judges at (none unless set) and its number of seeds."""
    out = {}
    if data.get("production_epochs") is not None:
        out["production_epochs"] = _opt(src, data, "production_epochs", int, None,
                                        lambda v: base.epochs <= v <= MAX_PRODUCTION_EPOCHS,
                                        f"must be in [train.epochs ({base.epochs}), {MAX_PRODUCTION_EPOCHS}]: the length the "
                                        f"export is trained for, judged at that length")
    out["judge_seeds"] = _opt(src, data, "judge_seeds", int, 3, lambda v: 2 <= v <= 20,
                              "must be in [2, 20]: a lower bound over seeds needs at least two")
    return out


# A trial Optuna ran from a ``start`` point (an enqueued trial) carries this key in its Tune config
# and this tag on its MLflow run. Known by where it came from, not by its values: a point that sets
# some keys would match every sampled trial that drew the same values for them.
START = "triaccel.start"
# A trial the sampler drew near the best trial so far (search.sampler) carries this key in its Tune
# config and this tag on its MLflow run: the Tune id of the trial it was drawn near.
NEAR = "triaccel.near"


# ``reference: true`` in a start point: the keys the reference baseline decides (searched key -> its
# ``triaccel.values`` key) take the reference's values where the space's ranges hold them (start_points).
# What the user would have run decides the 16-bit type and the step's form: on EfficientNet-B0 (H100) static
# fp16 captured + compiled scored 2.6x its bf16 twin, where the ResNet-18 spaces' start points are bf16
REFERENCE_KEYS = {"triaccel.precision.half": "amp_dtype", "batch_size": "batch_size", "capture": "capture",
                  "compile": "compile"}
FOLLOWS = "triaccel.follows_reference"  # marks such a point in ``SearchSpace.start`` until start_points


def admits(p, v) -> bool:
    """Whether searched parameter ``p`` can take value ``v`` (a non-``above`` parameter)."""
    if p.choices is not None:
        return v in p.choices
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not p.low <= v <= p.high:
        return False
    return p.distribution != "int" or not (v - p.low) % (p.step or 1)


def start_points(space: SearchSpace, ref: dict | None) -> tuple[list[dict], list[str]]:
    """The start points Optuna enqueues: a ``reference: true`` point with the reference baseline's values
    (``ref``: its ``triaccel.values``) for the REFERENCE_KEYS the space searches and can take; its own
    values for the rest, and everywhere when there is no reference. Also one line per such point, for
    the console."""
    out, said = [], []
    for i, point in enumerate(space.start):
        point = dict(point)
        if not point.pop(FOLLOWS, False):
            out.append(point)
            continue
        took = {}
        for key, rkey in REFERENCE_KEYS.items():
            p = space.params.get(key)
            if p is None or p.above or ref is None or rkey not in ref:
                continue
            if key == "triaccel.precision.half" and ref.get("mode", "amp") != "amp":
                continue  # an fp32 reference has no 16-bit type
            if admits(p, ref[rkey]):  # compile's None (eager) is a value
                point[key] = took[key] = ref[rkey]
        out.append(point)
        if ref is None:
            said.append(f"start point {i} follows the reference baseline, and none finished: it runs as written")
            continue
        kept = [k for k in REFERENCE_KEYS if k in space.params and k not in took]
        said.append(f"start point {i} follows the reference baseline: "
                    + (", ".join(f"{k} {'null' if v is None else v}" for k, v in took.items()) or "none of its keys")
                    + (f" (its own {', '.join(kept)}: the reference's do not fit the space)" if kept else ""))
    return out, said


def _start(src: str, spec, space: SearchSpace) -> tuple:
    """The ``start`` points, checked against the params' ranges, in Optuna's names."""
    if spec is None:
        return ()
    if not isinstance(spec, list):
        raise field_error(src, "start", "must be a list of points (mappings of searched keys to values)")
    out = []
    for i, point in enumerate(spec):
        sk = f"start[{i}]"
        if not isinstance(point, dict) or not point:
            raise field_error(src, sk, "must be a non-empty mapping of searched keys to values")
        point = dict(point)  # an int key's value made int below: the caller's data stays as given
        follows = point.pop("reference", False)
        if not isinstance(follows, bool):
            raise field_error(src, f"{sk}.reference", f"must be true or false, got {follows!r}")
        if follows and not any(k in space.params for k in REFERENCE_KEYS):
            raise field_error(src, f"{sk}.reference", f"the space searches none of the keys the reference "
                                                      f"decides ({', '.join(REFERENCE_KEYS)})")
        later = lambda kv: bool(space.params.get(kv[0]) and space.params[kv[0]].above)  # noqa: E731
        for k, v in sorted(point.items(), key=later):  # an ordered key after its partner
            p = space.params.get(k)
            if p is None:
                raise field_error(src, f"{sk}.{k}", "not a searched key (a start point sets params only)")
            if p.choices is not None:
                if v not in p.choices:
                    raise field_error(src, f"{sk}.{k}", f"{v!r} is not one of the choices {p.choices}")
                continue
            v = number(src, f"{sk}.{k}", v, "the value")
            if not p.low <= v <= p.high:
                raise field_error(src, f"{sk}.{k}", f"{v} is outside the range [{p.low}, {p.high}]")
            if p.distribution == "int" and (v - p.low) % (p.step or 1):
                raise field_error(src, f"{sk}.{k}", f"{v} is not on the int grid (low {p.low}, step {p.step})")
            point[k] = int(v) if p.distribution == "int" else v
            if p.above:
                if p.above not in point:
                    raise field_error(src, f"{sk}.{k}", f"needs {p.above} in the same point (it is ordered above it)")
                other = float(point[p.above])
                least = other * (1 + EPS) if other > 0 else other + EPS  # what resolve() can give
                if not v >= least:  # resolve() would run it at least, not at v
                    raise field_error(src, f"{sk}.{k}", f"{v} must be above {p.above} ({point[p.above]}) "
                                                 f"by at least {EPS:g} (relative)")
        out.append({**space.sampled(point), **({FOLLOWS: True} if follows else {})})
    return tuple(out)


def _baseline(src: str, spec, base: TrainConfig) -> dict:
    """The ``baseline`` section: batch sizes, AMP dtypes, steps, forwards and the accuracy margin, checked."""
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise field_error(src, "baseline", "must be a mapping (batch_sizes, amp_dtypes, accuracy_margin)")
    for k in spec:
        if k not in BASELINE_KEYS:
            raise field_error(src, f"baseline.{k}", unknown_key(k, BASELINE_KEYS))
    b0 = base.batch_size
    sizes = spec.get("batch_sizes", [b0, 2 * b0, 4 * b0])
    if not isinstance(sizes, list) or not all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= MAX_BATCH
                                              for x in sizes):
        raise field_error(src, "baseline.batch_sizes", f"must be a list of integers in [1, {MAX_BATCH}], got {sizes!r}")
    default_dt = base.amp_dtype if base.amp_dtype in ("bf16", "fp16") else "bf16"
    dtypes = spec.get("amp_dtypes", [default_dt])
    if not isinstance(dtypes, list) or not dtypes or not all(d in ("bf16", "fp16") for d in dtypes):
        raise field_error(src, "baseline.amp_dtypes", f"must be a non-empty list of bf16 / fp16, got {dtypes!r}")
    capture = spec.get("capture", [False])
    if not isinstance(capture, list) or not capture or not all(isinstance(c, bool) for c in capture):
        raise field_error(src, "baseline.capture", f"must be a non-empty list of true / false, got {capture!r}")
    # none (or null / false): the eager forward; default: the trials' own setting, so both compare like for like
    compile_ = spec.get("compile", [base.compile])
    if not isinstance(compile_, list) or not compile_:
        raise field_error(src, "baseline.compile", f"must be a non-empty list of none / {' / '.join(COMPILE_MODES)}, "
                                            f"got {compile_!r}")
    modes = []
    for c in compile_:
        if c is None or c is False or c == "none":  # (not 0: 0 == False)
            modes.append(None)
        elif isinstance(c, str) and c in COMPILE_MODES:
            modes.append(c)
        else:
            raise field_error(src, "baseline.compile", f"{c!r} is not one of none, {', '.join(COMPILE_MODES)}")
    margin = number(src, "baseline.accuracy_margin", spec.get("accuracy_margin", 0.5), "accuracy_margin")
    if margin < 0:
        raise field_error(src, "baseline.accuracy_margin", f"must be >= 0 (percentage points), got {margin}")
    look = number(src, "baseline.second_look", spec.get("second_look", 1.0), "second_look")
    if not 0 <= look <= 100:
        raise field_error(src, "baseline.second_look", f"must be in [0, 100] (percentage points), got {look}")
    stop = spec.get("stop_dominated", False)
    if not isinstance(stop, bool):
        raise field_error(src, "baseline.stop_dominated", f"must be true or false, got {stop!r}")
    return dict(baseline_batches=tuple(sorted(set(sizes))), baseline_dtypes=tuple(dict.fromkeys(dtypes)),
                baseline_capture=tuple(dict.fromkeys(capture)), baseline_compile=tuple(dict.fromkeys(modes)),
                margin=float(margin), second_look=float(look), stop_dominated=stop)


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
    from importlib import resources

    name = p.name if p.suffix == ".yaml" else p.name + ".yaml"
    shipped = resources.files("triaccel.spaces") / name
    if "/" in path or os.sep in path or is_link:  # a dangling link named so is the user's file too
        # spaces/quickstart.yaml as README writes it, run outside a checkout: the shipped one has a name
        hint = f" (the shipped space of that name: --space {p.stem})" if shipped.is_file() and not is_link else ""
        raise ConfigError(f"{path}: no such space file{hint}")
    if shipped.is_file():
        return Path(str(shipped))
    raise ConfigError(f"{path}: no such space file (shipped: {', '.join(shipped_spaces())})")


def shipped_spaces() -> list[str]:
    from importlib import resources

    return sorted(f.name[:-5] for f in resources.files("triaccel.spaces").iterdir() if f.name.endswith(".yaml"))


def load_space(path: str, source: str | None = None) -> SearchSpace:
    """The space in the YAML file ``path``; ``source``: what its messages and the search's state call it, where
    that is not the file (a space the Python API wrote out for a dict or for functions handed to it)."""
    p = resolve_space_path(path)
    data = read_yaml(p)  # one line for what cannot be read (permissions, /proc files, pipes)
    try:
        raw = p.read_bytes()  # for the space's sha256, once read_yaml has accepted it
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror or e})") from None
    return parse_space(data, source=source or str(path), sha256=hashlib.sha256(raw).hexdigest(), strict=True)
