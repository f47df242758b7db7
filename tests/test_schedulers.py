"""The search's early stopping (triaccel.search.schedulers) and how start points are known: Ray
Tune's real ASHA, with the space's start points exempt from early stops, and the real Optuna
searcher marking the trials it runs from ``start`` points."""
import pytest

pytest.importorskip("ray")

from ray.tune.experiment import Trial  # noqa: E402
from ray.tune.schedulers import ASHAScheduler, TrialScheduler  # noqa: E402

from triaccel.search.schedulers import StartPointsFinishASHA  # noqa: E402
from triaccel.search.space import START  # noqa: E402

KW = dict(metric="search_score", mode="max", time_attr="training_iteration", max_t=8, grace_period=2,
          reduction_factor=2)


def trial(start=False):
    return Trial("trainable", config={"x": 1.0, **({START: True} if start else {})}, stub=True)


def feed(s, schedule):
    """schedule: [(trial, iteration, score)] in order -> the actions."""
    return [s.on_trial_result(None, t, {"training_iteration": it, "search_score": v}) for t, it, v in schedule]


def test_asha_stops_a_low_sampled_trial_but_a_start_point_runs_on():
    s = StartPointsFinishASHA(**KW)
    good, low, start = trial(), trial(), trial(start=True)
    for t in (good, low, start):
        s.on_trial_add(None, t)
    C, S = TrialScheduler.CONTINUE, TrialScheduler.STOP
    # the same low score at the first rung: ASHA stops the sampled trial, not the start point
    assert feed(s, [(good, 2, 100.0), (low, 2, 10.0), (start, 2, 10.0)]) == [C, S, C]
    rung = next(r for r in s._brackets[0]._rungs if r[0] == 2)
    assert start.trial_id in rung[1]  # its score at that rung counts, as plain ASHA counts it
    assert feed(s, [(start, 3, 1.0), (start, 4, 1.0)]) == [C, C]
    assert s._num_stopped == 1
    assert feed(s, [(start, 8, 1.0)]) == [S]  # at max_t it ends as every trial does
    s.on_trial_complete(None, start, {"training_iteration": 8, "search_score": 1.0})


@pytest.mark.parametrize("cls", [ASHAScheduler, StartPointsFinishASHA])
def test_sampled_trials_are_cut_as_by_rays_asha(cls):
    """An exempted start point's later scores stay out of the rungs: its 10 at rung 4 would pull
    that cut-off down and keep B (60) going where Ray's ASHA stops it (reviewer's case)."""
    s = cls(**KW)
    a, st, b = trial(), trial(start=True), trial()
    for t in (a, st, b):
        s.on_trial_add(None, t)
    acts = feed(s, [(a, 2, 100.0), (st, 2, 10.0), (b, 2, 90.0), (a, 4, 100.0)])
    if cls is StartPointsFinishASHA:
        acts += feed(s, [(st, 4, 10.0)])
    assert feed(s, [(b, 4, 60.0)]) == [TrialScheduler.STOP]
    assert acts[1] == (TrialScheduler.CONTINUE if cls is StartPointsFinishASHA else TrialScheduler.STOP)


def test_the_searcher_marks_its_start_point_trials_and_only_those():
    """A start point that sets one key (the others sampled) marks the trial Optuna ran from it,
    not every sampled trial that drew the same value for that key."""
    from triaccel.search.tuner import new_searcher
    from triaccel.search.space import parse_space

    space = parse_space({
        "name": "t", "trials": 12, "concurrency": 12, "sampler": "random",
        "train": {"epochs": 2, "data": {"name": "digits"}, "model": {"name": "small_cnn"}},
        "params": {"optim.lr": {"distribution": "loguniform", "low": 1e-3, "high": 1.0},
                   "checkpointing": {"distribution": "categorical", "choices": [False, True]}},
        "start": [{"checkpointing": True}, {"optim.lr": 0.01, "checkpointing": False}]}, source="t.yaml")
    alg = new_searcher(space)
    configs = [alg.suggest(f"t{i}") for i in range(12)]
    marked = [i for i, c in enumerate(configs) if c.get(START)]
    assert marked == [0, 1], configs
    assert configs[0]["checkpointing"] is True and configs[1]["optim.lr"] == 0.01
    assert sum(c["checkpointing"] is True for c in configs) > 1  # sampled trials drew it too, unmarked
    assert space.resolve(configs[0]).keys() == {"optim.lr", "checkpointing"}  # the mark is no param
