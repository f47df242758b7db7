"""The search's sampler (triaccel.search.sampler): a share of the sampled trials drawn near the best
feasible trial so far, the rest the base sampler's. Real Optuna studies, asked as Ray's OptunaSearch
asks them (``ask(fixed_distributions=...)``)."""
import math

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from triaccel.search.sampler import NEAR_ATTR, NearBestSampler

optuna.logging.set_verbosity(optuna.logging.WARNING)

DISTS = {  # shaped like the shipped ResNet-18 space's keys
    "tau_low": FloatDistribution(1e-2, 1e3, log=True),
    "alpha": FloatDistribution(1e-3, 3.0, log=True),
    "rho_high": FloatDistribution(0.65, 0.95),
    "delta_down": IntDistribution(16, 128, step=16),
    "batch_size": CategoricalDistribution([96, 192, 384]),
    "checkpointing": CategoricalDistribution([False, True]),
    "grow_factor": FloatDistribution(1.25, 2.0),
    "lr_rule": CategoricalDistribution(["none", "sqrt"]),
    "tau_curv": FloatDistribution(1.0, 1000.0, log=True),
    "frac": FloatDistribution(0.0, 1.0),
}
BEST = {"tau_low": 1000.0, "alpha": 0.001, "rho_high": 0.78, "delta_down": 96, "batch_size": 96,
        "checkpointing": False, "grow_factor": 1.66, "lr_rule": "none", "tau_curv": 1000.0, "frac": 0.5}


def _done(study, params, value, constraint=None):
    attrs = {} if constraint is None else {"constraints:accuracy": constraint}
    study.add_trial(create_trial(params=params, distributions=DISTS, value=value, system_attrs=attrs))


def _study(fraction, seed=0, base=None):
    sampler = NearBestSampler(base or optuna.samplers.RandomSampler(seed=seed), fraction, seed=seed)
    return optuna.create_study(direction="maximize", sampler=sampler), sampler


def _scale(d, v):
    return math.log(v) if getattr(d, "log", False) else float(v)


def test_near_best_trials_move_a_few_keys_of_the_best_feasible_trial_a_short_way():
    """Every trial at fraction 1 is drawn near the best *feasible* trial (an infeasible one scored
    higher), moves at least one key and about three of ten, and stays on each key's range and step."""
    study, _ = _study(1.0)
    far = {**BEST, "tau_low": 0.02, "alpha": 2.0, "batch_size": 384}
    _done(study, far, 300.0, constraint=2.0)  # the highest score, below the accuracy margin
    _done(study, BEST, 200.0, constraint=-0.5)
    _done(study, {**BEST, "alpha": 1.0}, 100.0, constraint=-1.0)
    moved_counts, shifts = [], []
    for _ in range(60):
        t = study.ask(fixed_distributions=DISTS)
        assert study._storage.get_trial_system_attrs(t._trial_id)[NEAR_ATTR] == 1  # the feasible best's number
        moved = [k for k in DISTS if t.params[k] != BEST[k]]
        assert moved, t.params
        moved_counts.append(len(moved))
        for k, d in DISTS.items():
            v = t.params[k]
            assert d._contains(d.to_internal_repr(v)), (k, v)
            if isinstance(d, FloatDistribution):
                shifts.append(abs(_scale(d, v) - _scale(d, BEST[k])) / (_scale(d, d.high) - _scale(d, d.low)))
        study.tell(t, state=TrialState.FAIL)  # not a new best: every trial is drawn near the same one
    assert 2.0 <= sum(moved_counts) / len(moved_counts) <= 4.5, moved_counts
    moved_shifts = [x for x in shifts if x > 0]
    assert sorted(moved_shifts)[len(moved_shifts) // 2] < 0.15, moved_shifts  # a short way: σ is 0.1 of a range


def test_the_share_of_near_best_trials_follows_the_fraction_and_the_rest_are_the_base_samplers():
    study, sampler = _study(0.5)
    _done(study, BEST, 200.0)  # no constraint: feasible (a search without a baseline)
    near = 0
    for _ in range(100):
        t = study.ask(fixed_distributions=DISTS)
        attrs = study._storage.get_trial_system_attrs(t._trial_id)
        assert (NEAR_ATTR in attrs) is sampler.is_near(study._storage.get_trial(t._trial_id))
        near += NEAR_ATTR in attrs
        if NEAR_ATTR not in attrs:  # a random draw: far from the best in most keys
            assert sum(t.params[k] != BEST[k] for k in DISTS) >= 5
        study.tell(t, state=TrialState.FAIL)
    assert 35 <= near <= 65, near


def test_while_no_trial_has_finished_the_start_points_are_the_centres():
    """Concurrent trials: the trials after the start points are asked while those still run."""
    study, _ = _study(1.0)
    starts = [BEST, {**BEST, "checkpointing": True, "delta_down": 32}]
    for p in starts:
        study.enqueue_trial(p)
    running = [study.ask(fixed_distributions=DISTS) for _ in starts]
    assert [t.params for t in running] == starts
    assert all(NEAR_ATTR not in study._storage.get_trial_system_attrs(t._trial_id) for t in running)
    centres = set()
    for _ in range(6):
        t = study.ask(fixed_distributions=DISTS)
        centres.add(study._storage.get_trial_system_attrs(t._trial_id)[NEAR_ATTR])
    assert centres == {running[0].number, running[1].number}


def test_near_best_draws_depend_on_the_seed_and_the_trial_number_alone():
    def params(seed):
        study, _ = _study(0.5, seed=seed)
        _done(study, BEST, 200.0)
        out = []
        for _ in range(12):
            t = study.ask(fixed_distributions=DISTS)
            out.append(t.params)
            study.tell(t, state=TrialState.FAIL)
        return out
    assert params(3) == params(3) and params(3) != params(4)


def test_a_centre_outside_the_current_range_is_not_copied_and_several_objectives_draw_nothing_near():
    study, _ = _study(1.0)
    _done(study, BEST, 200.0)
    narrow = dict(DISTS, tau_low=FloatDistribution(1e-2, 10.0, log=True))  # an extended search's new range
    for _ in range(10):
        t = study.ask(fixed_distributions=narrow)
        assert 1e-2 <= t.params["tau_low"] <= 10.0
        study.tell(t, state=TrialState.FAIL)
    multi = optuna.create_study(directions=["maximize", "minimize"],
                                sampler=NearBestSampler(optuna.samplers.RandomSampler(seed=0), 1.0))
    multi.add_trial(create_trial(params=BEST, distributions=DISTS, values=[1.0, 1.0]))
    t = multi.ask(fixed_distributions=DISTS)
    assert NEAR_ATTR not in multi._storage.get_trial_system_attrs(t._trial_id)


def test_tpe_wrapped_models_the_near_best_trials_too():
    """The base sampler (TPE, multivariate, as a search builds it) sees every completed trial, the
    near-best ones among them, and still runs the trials that are not near-best."""
    tpe = optuna.samplers.TPESampler(seed=0, multivariate=True, constant_liar=True, n_startup_trials=2)
    study, sampler = _study(0.5, base=tpe)
    for i in range(16):
        t = study.ask(fixed_distributions=DISTS)
        study.tell(t, -abs(math.log(t.params["alpha"]) - math.log(0.001)) - 0.01 * i)
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 16
    assert any(NEAR_ATTR in t.system_attrs for t in study.trials)
    assert any(NEAR_ATTR not in t.system_attrs for t in study.trials)


@pytest.mark.parametrize("fraction", [0.0])
def test_a_zero_fraction_is_the_base_sampler_alone(fraction):
    study, _ = _study(fraction)
    _done(study, BEST, 200.0)
    for _ in range(5):
        t = study.ask(fixed_distributions=DISTS)
        assert NEAR_ATTR not in study._storage.get_trial_system_attrs(t._trial_id)
        study.tell(t, state=TrialState.FAIL)
