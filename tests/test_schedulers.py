"""The search's early stopping (triaccel.search.schedulers): Ray Tune's real ASHA, with the
space's start points exempt from early stops."""
import pytest

pytest.importorskip("ray")

from ray.tune.experiment import Trial  # noqa: E402
from ray.tune.schedulers import TrialScheduler  # noqa: E402

from triaccel.search.schedulers import StartPointsFinishASHA  # noqa: E402
from triaccel.search.space import is_start_point  # noqa: E402

START = [{"batch_size": 96, "checkpointing": True, "triaccel.precision.tau_low": 1000.0,
          "triaccel.precision.tau_high@frac": 0.5}]


def trial(config):
    return Trial("trainable", config=config, stub=True)


def asha(start=START):
    return StartPointsFinishASHA(metric="search_score", mode="max", time_attr="training_iteration", max_t=8,
                                 grace_period=2, reduction_factor=2, start=start)


def result(it, score):
    return {"training_iteration": it, "search_score": score}


def test_start_point_match_is_every_key_it_sets():
    full = {**START[0], "triaccel.curvature.alpha": 0.3}  # a key the point leaves to the sampler
    assert is_start_point(full, START)
    assert is_start_point({**full, "triaccel.precision.tau_low": 1000.0 * (1 + 1e-12)}, START)  # float round trip
    assert not is_start_point({**full, "checkpointing": False}, START)
    assert not is_start_point({**full, "triaccel.precision.tau_low": 999.0}, START)
    assert not is_start_point({k: v for k, v in full.items() if k != "batch_size"}, START)
    assert not is_start_point({**full, "batch_size": True}, [{"batch_size": 1}])  # True is not 1
    assert not is_start_point(full, [])


def test_asha_stops_a_low_sampled_trial_but_a_start_point_runs_on():
    s = asha()
    good, low, start = (trial({**START[0], "batch_size": 192}), trial({**START[0], "checkpointing": False}),
                        trial({**START[0], "triaccel.curvature.alpha": 0.3}))
    for t in (good, low, start):
        s.on_trial_add(None, t)
    assert s.on_trial_result(None, good, result(2, 100.0)) == TrialScheduler.CONTINUE
    # the same low score at the first rung: ASHA stops the sampled trial, not the start point
    assert s.on_trial_result(None, low, result(2, 10.0)) == TrialScheduler.STOP
    assert s.on_trial_result(None, start, result(2, 10.0)) == TrialScheduler.CONTINUE
    # the start point's score still counts in the rung (sampled trials are cut against it)
    rung = next(r for r in s._brackets[0]._rungs if r[0] == 2)
    assert start.trial_id in rung[1]
    assert s.on_trial_result(None, start, result(4, 1.0)) == TrialScheduler.CONTINUE  # and at the next rung
    assert s._num_stopped == 1
    # at max_t it ends as every trial does
    assert s.on_trial_result(None, start, result(8, 1.0)) == TrialScheduler.STOP


def test_without_start_points_it_is_rays_asha():
    s = asha(start=[])
    good, low = trial(dict(START[0])), trial(dict(START[0]))
    for t in (good, low):
        s.on_trial_add(None, t)
    s.on_trial_result(None, good, result(2, 100.0))
    assert s.on_trial_result(None, low, result(2, 10.0)) == TrialScheduler.STOP
