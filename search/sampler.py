"""The search's Optuna sampler: TPE (or random) for most trials, and a share of them drawn near the best.

TPE models the space from the trials it has seen. A search runs few trials in many dimensions (the
shipped ResNet-18 space: 16 trials, 13 keys), so its later trials land almost anywhere, and on the
H200 every one of them lost badly to the start points, which sit where the controllers are idle.
``NearBestSampler`` gives a share of the sampled trials (``near_best``, a space option) to the region
that wins: each such trial is the best feasible trial so far with a few keys moved a short way (the
space's start points stand in while no trial has finished). The others are the base sampler's, which
models every trial, these too.

A move, per key: with probability ``min(1, KEYS_MOVED / keys)`` the key moves (at least one key does);
a number by a normal step of ``scale`` of its range (in logs for a log range), reflected into the
range and put on its step; a choice to another choice, drawn uniformly. Whether a trial is drawn
near the best is decided by the search's seed and the trial's number alone, so a resumed search
decides as the first did.
"""
from __future__ import annotations

import math
import random
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

KEYS_MOVED = 3  # keys a near-best trial moves on average (all of them in a space of three or fewer)
NEAR_ATTR = "triaccel:near_best"  # system attr of a near-best trial: the number of the trial it was drawn near


class NearBestSampler(BaseSampler):
    """``base`` for most trials; a ``fraction`` of the trials it samples (an enqueued start point is
    never one) drawn near the best feasible completed trial, or near a start point while none has
    completed. Single-objective studies only: with several objectives every trial is ``base``'s."""

    def __init__(self, base: BaseSampler, fraction: float, scale: float = 0.1, seed: int = 0):
        self._base = base
        self.fraction = float(fraction)
        self.scale = float(scale)
        self.seed = int(seed)
        self._chosen: dict = {}  # trial id -> (centre's number, its params, keys to move): the trial being asked

    # ------------------------------------------------------------------ which trials
    def is_near(self, trial: FrozenTrial) -> bool:
        """Whether trial number ``trial.number`` is drawn near the best: by the seed and the number alone."""
        if self.fraction <= 0 or "fixed_params" in trial.system_attrs:
            return False
        return random.Random(f"{self.seed}:{trial.number}").random() < self.fraction

    def centre(self, study: Study, trial: FrozenTrial) -> FrozenTrial | None:
        """The trial to draw near: the best feasible completed one; while none has completed, a start
        point (an enqueued trial), chosen by the trial's number; None where there is neither."""
        if len(study.directions) != 1:
            return None
        done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if t.value is not None and math.isfinite(t.value) and _feasible(t)]
        if done:
            pick = max if study.direction == StudyDirection.MAXIMIZE else min
            return pick(done, key=lambda t: t.value)
        starts = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.COMPLETE))
                  if "fixed_params" in t.system_attrs and t.params and t.number != trial.number]
        return starts[trial.number % len(starts)] if starts else None

    # ------------------------------------------------------------------ Optuna's sampler interface
    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        if self._near(study, trial) is not None:
            return {}  # every key through sample_independent, near the centre
        return self._base.infer_relative_search_space(study, trial)

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return self._base.sample_relative(study, trial, search_space)  # {} for a near-best trial: nothing

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        near = self._near(study, trial)
        if near is None or param_name not in near[1]:
            return self._base.sample_independent(study, trial, param_name, param_distribution)
        _, params, moved = near
        value = params[param_name]
        if param_name in moved:
            value = self._move(value, param_distribution, random.Random(f"{self.seed}:{trial.number}:{param_name}"))
        if not _contains(param_distribution, value):  # a centre from a space with another range (extend, warm start)
            return self._base.sample_independent(study, trial, param_name, param_distribution)
        return value

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self._base.before_trial(study, trial)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState, values) -> None:
        self._base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._base.reseed_rng()

    # ------------------------------------------------------------------ the draw
    def _near(self, study: Study, trial: FrozenTrial) -> tuple[int, dict, set] | None:
        """(the centre's number, its params, the keys to move) for a near-best trial, chosen once per
        trial; None for the base sampler's trials. The centre's number goes to the trial's system
        attrs (``NEAR_ATTR``)."""
        if not self.is_near(trial):
            return None
        if trial._trial_id in self._chosen:
            return self._chosen[trial._trial_id]
        centre = self.centre(study, trial)
        if centre is None:
            return None
        keys = sorted(centre.params)
        rng = random.Random(f"{self.seed}:{trial.number}:keys")
        p = min(1.0, KEYS_MOVED / max(1, len(keys)))
        moved = {k for k in keys if rng.random() < p}
        if not moved and keys:
            moved = {rng.choice(keys)}
        study._storage.set_trial_system_attr(trial._trial_id, NEAR_ATTR, centre.number)
        self._chosen = {trial._trial_id: (centre.number, dict(centre.params), moved)}  # one trial is asked at a time
        return self._chosen[trial._trial_id]

    def _move(self, value, dist: BaseDistribution, rng: random.Random):
        if isinstance(dist, CategoricalDistribution):
            others = [c for c in dist.choices if c != value]
            return rng.choice(others) if others else value
        if not isinstance(dist, (FloatDistribution, IntDistribution)):
            return value
        lo, hi, x = float(dist.low), float(dist.high), float(value)
        if dist.log:
            lo, hi, x = math.log(lo), math.log(hi), math.log(x)
        if hi <= lo:
            return value
        y = x + rng.gauss(0.0, self.scale * (hi - lo))
        while y < lo or y > hi:  # reflected into the range (a step past both ends reflects again)
            y = 2 * lo - y if y < lo else 2 * hi - y
        if dist.log:
            y = min(max(math.exp(y), float(dist.low)), float(dist.high))
        step = getattr(dist, "step", None)
        if step:  # on the grid, and at least one step from where it was (a moved key moves)
            low, high = float(dist.low), float(dist.high)
            y = low + round((y - low) / step) * step
            if abs(y - float(value)) < step / 2:
                up = y + step <= high + 1e-12 and (rng.random() < 0.5 or y - step < low - 1e-12)
                y = y + step if up else y - step
            y = min(max(y, low), high)
        return int(round(y)) if isinstance(dist, IntDistribution) else float(y)


def _feasible(t: FrozenTrial) -> bool:
    """Optuna's rule: every constraint (system attr ``constraints:*``) zero or less; none set: feasible."""
    return all(v <= 0 for k, v in t.system_attrs.items() if k.startswith("constraints:"))


def _contains(dist: BaseDistribution, value) -> bool:
    try:
        return bool(dist._contains(dist.to_internal_repr(value)))
    except (ValueError, TypeError):
        return False
