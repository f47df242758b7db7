"""The ``params`` of a search space: each searched key's distribution and bounds, every bound checked
as a value of the training config, and the rules between keys (``above``, the ordered pairs
tau_low < tau_high and rho_low < rho_high, batch sizes within the batch controller's bounds).
``triaccel.search.space`` documents the file format."""
from __future__ import annotations

import copy
import dataclasses
import math
import typing
from dataclasses import dataclass

from triaccel.config import TrainConfig, from_dict, set_dotted
from triaccel.config_io import unknown_key
from triaccel.errors import ConfigError

DISTRIBUTIONS = ("uniform", "loguniform", "int", "categorical")
PARAM_KEYS = {"distribution", "low", "high", "step", "choices", "above"}
DIST_KEYS = {"uniform": {"distribution", "low", "high", "above"}, "loguniform": {"distribution", "low", "high", "above"},
             "int": {"distribution", "low", "high", "step", "above"}, "categorical": {"distribution", "choices", "above"}}
FRAC_SUFFIX = "@frac"  # Optuna's name for the position of an `above` parameter within its feasible range
EPS = 1e-6
# the training config's ordered pairs (lower key, upper key): the trainer refuses lower >= upper
PAIRS = (("triaccel.precision.tau_low", "triaccel.precision.tau_high"),
         ("triaccel.batch.rho_low", "triaccel.batch.rho_high"))


@dataclass(frozen=True)
class Param:
    key: str
    distribution: str
    low: float | None = None
    high: float | None = None
    step: int | None = None
    choices: list | None = None
    above: str | None = None


def field_error(src: str, key: str, msg: str) -> ConfigError:
    return ConfigError(f"{src}: {key}: {msg}")


def number(src, key, v, what):
    """A finite number (a numeric string too: YAML reads 1e-8 as one): NaN or infinity would
    reach Optuna's bounds or Tune's resources and fail there, after the search started."""
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            pass
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise field_error(src, key, f"{what} must be a number, got {v!r}")
    if not math.isfinite(v):
        raise field_error(src, key, f"{what} must be a finite number, got {v!r}")
    return v


# keys that decide what the trials train and validate on (a block size in the user's data factory's arguments,
# the held-out share): never searched; augmentation and the data's placement are training settings
FIXED_DATA = {"data", "data.name", "data.class_path", "data.init_args", "data.data_dir", "data.val_fraction",
              "data.split_seed", "data.download", "data.cache_dir"}


def parse_params(src: str, raw_params, train: dict, strict: bool) -> dict[str, Param]:
    """Every searched key, checked alone and then against the others."""
    if not isinstance(raw_params, dict) or not raw_params:
        raise field_error(src, "params", "must be a non-empty mapping of dotted config keys")
    params = {}
    for key, spec in raw_params.items():
        params[key] = parse_param(src, key, spec, train, strict)
    check_order(src, params, strict, train)
    if strict:
        check_batch_bounds(src, train, params)
    return params


def check_params_read(src: str, params: dict, base) -> None:
    """A searched key the run never reads (triaccel.config.unread_keys) is refused: every trial would train
    the same run under different labels (``model.width`` beside the user's model, whose arguments are
    ``model.init_args.*``; a triaccel key while train.mode is amp). ``base``: the space's train settings as a
    TrainConfig. Where the key that decides (mode, class_path, the curvature method) is itself searched,
    its trials read what they read."""
    from triaccel.config import unread_keys

    unread = {k: why for k, (decider, why) in unread_keys(base).items() if decider not in params}
    for key in params:
        for prefix, why in unread.items():
            if key == prefix or prefix.endswith(".") and key.startswith(prefix):
                raise field_error(src, f"params.{key}", f"the run never reads it: {why}")


def parse_param(src: str, key, spec, train: dict, strict: bool) -> Param:
    """One searched key: its distribution, its bounds or choices, each a value the config accepts."""
    pk = f"params.{key}"
    if not isinstance(key, str) or not key:
        raise field_error(src, pk, "a searched key must be a dotted config key (text), e.g. optim.lr")
    if not isinstance(spec, dict):
        raise field_error(src, pk, "must be a mapping with a distribution")
    for sk in spec:
        if sk not in PARAM_KEYS:
            raise field_error(src, f"{pk}.{sk}", unknown_key(sk, PARAM_KEYS))
    dist = spec.get("distribution")
    if dist not in DISTRIBUTIONS:
        raise field_error(src, pk, f"unknown distribution {dist!r} (valid: {', '.join(DISTRIBUTIONS)})")
    for sk in spec:  # {distribution: uniform, ..., step: 0.25} would search a continuous range without a word
        if sk not in DIST_KEYS[dist]:
            raise field_error(src, f"{pk}.{sk}", f"{dist} does not use {sk} (it takes "
                                                 f"{', '.join(sorted(DIST_KEYS[dist] - {'distribution'}))})"
                              + ("; a grid is `distribution: int` with a step, or categorical choices"
                                 if sk == "step" else ""))
    above = spec.get("above")
    if above is not None and not isinstance(above, str):
        raise field_error(src, f"{pk}.above", f"must name another searched key, got {above!r}")
    if strict and is_section(key):
        raise field_error(src, pk, section_refusal(key, spec))
    if strict and key == "epochs":  # trials of unequal length: ranked against baselines of another, cut by ASHA
        raise field_error(src, pk, "the trials' length is not searched: train.epochs sets it for every trial, the "
                                   "baselines and ASHA alike, and production_epochs the length the export is "
                                   "judged and trained at")
    if strict and (key in FIXED_DATA or key.startswith("data.init_args.")):
        raise field_error(src, pk, "the data and its validation split are the same for every trial and baseline "
                                   "(the score's accuracy is measured on them, and a trial on other data would be "
                                   "ranked against baselines on this): set it under train.data")
    if dist == "categorical":
        p = Param(key, dist, choices=_choices(src, pk, spec), above=above)
    else:
        p = Param(key, dist, *_range(src, pk, dist, spec), above=above)
    if strict and (p.choices is not None and len(p.choices) == 1 or p.choices is None and p.low == p.high):
        one = p.choices[0] if p.choices is not None else p.low  # a search of one value: a trial budget spent on nothing
        raise field_error(src, pk, f"searches one value ({one!r}); set it under train instead, or widen it")
    # the key must be a real config key and every bound a value the config accepts
    for probe in ([p.low, p.high] if p.choices is None else p.choices):
        check_bound(src, pk, train, key, probe)
    return p


def _choices(src: str, pk: str, spec: dict) -> list:
    ch = spec.get("choices")
    if not isinstance(ch, list) or not ch:
        raise field_error(src, pk, "categorical needs a non-empty list of choices")
    dup = next((b for i, a in enumerate(ch) for b in ch[i + 1:] if type(a) is type(b) and a == b), None)
    if dup is not None:  # a repeated choice is drawn twice as often: a weight nobody wrote down
        raise field_error(src, f"{pk}.choices", f"{dup!r} is listed twice")
    return ch


def _range(src: str, pk: str, dist: str, spec: dict) -> tuple:
    """(low, high, step) of a numeric distribution; step only for int."""
    if "low" not in spec or "high" not in spec:
        raise field_error(src, pk, "needs low and high (inclusive bounds)")
    low = number(src, pk, spec["low"], "low")
    high = number(src, pk, spec["high"], "high")
    if low > high:
        raise field_error(src, pk, f"low ({low}) > high ({high})")
    if dist == "loguniform" and low <= 0:
        raise field_error(src, pk, f"a log range must be above 0, got low={low}")
    if dist != "int":
        return low, high, None
    if int(low) != low or int(high) != high:
        raise field_error(src, pk, "int bounds must be integers")
    step = spec.get("step", 1)
    if isinstance(step, float) and step.is_integer():
        step = int(step)
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise field_error(src, f"{pk}.step", f"must be an integer >= 1, got {step!r}")
    if (int(high) - int(low)) % step:  # Optuna would narrow [8, 12] step 8 to [8, 8] with only a warning
        top = int(low) + (int(high) - int(low)) // step * step
        raise field_error(src, f"{pk}.step", f"high ({int(high)}) is not on the grid low + k * step "
                                             f"(low {int(low)}, step {step}): the largest value drawn would be "
                                             f"{top}; make high {top} or {top + step}")
    return low, high, step


def check_bound(src: str, pk: str, train: dict, key: str, probe) -> None:
    """``probe`` as the value of ``key`` in the space's train settings must make a valid config. A key of an
    ordered pair is probed beside a partner ordered with it: the pair's order is checked against the
    partner's range (``check_order``), not against one fixed partner value."""
    d = copy.deepcopy(train)
    try:
        set_dotted(d, key, probe)
        _order_partner(d, key, probe)
        from_dict(TrainConfig, d)
    except ConfigError as e:
        if not is_config_key(key):
            raise field_error(src, pk, f"not a training config key ({e})") from None
        raise field_error(src, pk, f"bound {probe!r} is not a valid value: {e}") from None


def _order_partner(d: dict, key: str, v) -> None:
    """Set the pair partner of ``key`` in ``d`` to a value ordered with ``v``. tau: the partner unset (the
    config orders an unset tau_low or tau_high against the other); rho: rho_high at its top (1), or
    rho_low at half of ``v``."""
    for lo, hi in PAIRS:
        if key not in (lo, hi):
            continue
        partner = hi if key == lo else lo
        section, _, name = partner.rpartition(".")
        sec = d
        for part in section.split("."):
            sec = sec.get(part) if isinstance(sec, dict) else None
        if lo.startswith("triaccel.precision."):
            if isinstance(sec, dict):
                sec.pop(name, None)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            if key == lo:
                set_dotted(d, partner, 1.0)
            elif v > 0:
                set_dotted(d, partner, v / 2)


def is_config_key(key: str) -> bool:
    """Whether a dotted key names a field of the training config (a key inside a field that is not a
    section, such as a mapping of keyword arguments, counts as the config's to judge)."""
    cls = TrainConfig
    for part in key.split("."):
        if not dataclasses.is_dataclass(cls):
            return True
        if part not in {f.name for f in dataclasses.fields(cls)}:
            return False
        cls = _field_type(cls, part)
    return True


def _field_type(cls, name: str):
    hint = typing.get_type_hints(cls).get(name)
    inner = [a for a in typing.get_args(hint) if a is not type(None)]  # Optional[Section]
    return inner[0] if len(inner) == 1 else hint


def is_section(key: str) -> bool:
    """Whether a dotted key names a section of the training config (triaccel.batch), not one key."""
    cls = TrainConfig
    for part in key.split("."):
        if not dataclasses.is_dataclass(cls):
            return False
        cls = _field_type(cls, part)
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


def check_order(src: str, params: dict[str, Param], strict: bool, train: dict | None = None) -> None:
    """``above`` names another searched key of a continuous range that leaves room above it; an ordered pair
    searched without ``above`` has ranges that cannot overlap, nor (``strict``) a searched key's range and its
    partner's value fixed under ``train``."""
    for key, p in params.items():
        if p.above:
            pk = f"params.{key}.above"
            if p.above not in params:
                raise field_error(src, pk, f"{p.above!r} is not a searched key")
            if p.above == key:
                raise field_error(src, pk, "a key cannot be ordered above itself")
            q = params[p.above]
            if p.distribution not in ("uniform", "loguniform") or q.distribution not in ("uniform", "loguniform"):
                raise field_error(src, pk, "ordered pairs need uniform or loguniform on both sides")
            if p.high <= q.low:
                raise field_error(src, pk, f"high ({p.high}) must exceed {p.above}'s low ({q.low}): no value can "
                                           f"lie above it")
            top = q.high * (1 + EPS) if q.high > 0 else q.high + EPS  # the least value above the partner's highest
            if strict and p.high <= top:
                # a draw of the partner above this high leaves no room: resolve() would clamp this key to its
                # high, below the partner, and every such trial would fail in the trainer
                raise field_error(src, pk, f"high ({p.high:g}) must exceed {p.above}'s high ({q.high:g}): a draw "
                                           f"of {p.above} near its high would leave no value above it")
            if q.above:
                raise field_error(src, pk, "chains of `above` are not supported")
    for lo_key, hi_key in PAIRS:  # unordered pairs the trainer would reject for some draws
        if lo_key in params and hi_key in params and params[hi_key].above != lo_key:
            lo, hi = params[lo_key], params[hi_key]
            if lo.high is not None and hi.low is not None and hi.low <= lo.high:
                raise field_error(src, f"params.{hi_key}", f"ranges overlap {lo_key}'s: add `above: {lo_key}`")
    for lo_key, hi_key in PAIRS if strict and train is not None else ():  # one side searched, the other fixed
        if (lo_key in params) == (hi_key in params):
            continue
        (_, lo_top), (hi_bottom, _) = _span(train, params, lo_key, None), _span(train, params, hi_key, None)
        if lo_top is not None and hi_bottom is not None and hi_bottom <= lo_top:
            key, fixed = (lo_key, hi_key) if lo_key in params else (hi_key, lo_key)
            side = "below" if key == lo_key else "above"
            raise field_error(src, f"params.{key}", f"its range reaches {fixed} = "
                                                    f"{hi_bottom if key == lo_key else lo_top:g}, fixed under train: a "
                                                    f"draw there fails in the trainer; keep the range {side} it")


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


def check_batch_bounds(src: str, train: dict, params: dict) -> None:
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
        raise field_error(src, "params", f"batch_size can be {b_hi:g}, above triaccel.batch.max_batch's least "
                                         f"value {mx_lo:g}: those draws would be refused; narrow one of the ranges")
    if b_lo < mn_hi:
        raise field_error(src, "params", f"batch_size can be {b_lo:g}, below triaccel.batch.min_batch's greatest "
                                         f"value {mn_hi:g}: those draws would be refused; narrow one of the ranges")
