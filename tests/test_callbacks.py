"""The search's MLflow callback against a real sqlite store, driven as Tune drives it on resume,
without Ray: a trial stands in as the two attributes the callback reads (trial_id, config)."""
import pickle
import time
from types import SimpleNamespace

from triaccel.search.callbacks import MLflowSearchCallback
from triaccel.search.space import parse_space

SPACE = {"name": "cb", "trials": 2, "baseline": {"batch_sizes": []},
         "train": {"mode": "triaccel", "epochs": 1, "device": "cpu", "data": {"name": "digits"},
                   "model": {"name": "small_cnn"}},
         "params": {"triaccel.precision.tau_low": {"distribution": "loguniform", "low": 1e-8, "high": 1e-4}}}


def _callback(tmp_path):
    return MLflowSearchCallback(f"sqlite:///{tmp_path}/mlflow.db", "triaccel-search", "cb", parse_space(SPACE),
                                shared=2)


def test_a_trial_finished_before_a_crash_keeps_its_run_closed_on_resume(tmp_path):
    """A trial completed after Tune's last periodic save, then the search was SIGKILLed: on resume Tune
    completes it again (without training it). Its run kept FINISHED but was re-opened RUNNING and its end
    time re-stamped (CI, 2026-11-30); a trial still running at the crash is re-opened as before."""
    done = SimpleNamespace(trial_id="t_done", config={"triaccel.precision.tau_low": 1e-6}, checkpoint=None)
    live = SimpleNamespace(trial_id="t_live", config={"triaccel.precision.tau_low": 1e-5}, checkpoint=None)
    cb = _callback(tmp_path)
    for t in (done, live):
        cb.on_trial_start(0, [], t)
        cb.on_trial_result(0, [], t, {"training_iteration": 1, "val_acc": 50.0, "efficiency": 1.0})
    cb.on_trial_complete(0, [], done)
    c = cb.client
    rid_done, rid_live = cb.child_run_id(done), cb.child_run_id(live)
    end = c.get_run(rid_done).info.end_time
    time.sleep(0.05)

    resumed = _callback(tmp_path)  # a new driver process: no cache, the runs found in the store
    for t in (done, live):
        resumed.on_trial_start(0, [], t)
    assert resumed.child_run_id(done) == rid_done and resumed.child_run_id(live) == rid_live
    assert c.get_run(rid_done).info.status == "FINISHED"
    assert c.get_run(rid_live).info.status == "RUNNING"
    resumed.on_trial_result(0, [], done, {"training_iteration": 1, "val_acc": 50.0, "efficiency": 1.0})
    resumed.on_trial_complete(0, [], done)
    resumed.on_trial_complete(0, [], live)
    assert c.get_run(rid_done).info.end_time == end  # not closed a second time
    assert c.get_run(rid_live).info.status == "FINISHED"
    assert len(c.get_metric_history(rid_done, "val_acc")) == 1  # the replayed result is not logged twice


def test_a_search_saved_before_the_score_defaults_resumes_and_exports_the_paper_rules(tmp_path, monkeypatch):
    """The controllers' defaults moved from the paper's rules to the score-aimed ones (2026-12-01). A search
    saved before that left unset keys to the paper's rules: read back (resume, export, the Tune callback
    pickled with it), its space pins `triaccel.policy: paper`; a new search's state, or a space that names
    its policy, is read as written."""
    import json

    from triaccel.search import state as saved

    monkeypatch.setenv("TRIACCEL_TUNE_DIR", str(tmp_path / "tune"))
    rules = lambda cfg: (cfg.triaccel.precision.scale, cfg.triaccel.curvature.method, cfg.triaccel.batch.policy)
    for name, extra, space, want in [
            ("old", {}, SPACE, ("absolute", "power", "paper")),
            ("new", {"controller_defaults": "score"}, SPACE, ("relative", "fisher", "score")),
            ("named", {}, {**SPACE, "train": {**SPACE["train"], "triaccel": {"policy": "score"}}},
             ("relative", "fisher", "score"))]:
        d = tmp_path / "tune" / name
        d.mkdir(parents=True)
        (d / "triaccel_search.json").write_text(json.dumps({"name": name, "space": space, "source": "s.yaml",
                                                            "sha256": "", "tracking_uri": "sqlite:///x.db", **extra}))
        state = saved.read_state(name)
        assert rules(parse_space(state["space"]).train_config({})) == want, name
    assert SPACE["train"].get("triaccel") is None  # the caller's dict is not changed
    from triaccel.search.space import pin_controller_defaults

    empty = {k: v for k, v in SPACE.items() if k != "train"}  # `train:` empty, mode searched (a reviewer's find)
    empty["params"] = {"mode": {"distribution": "categorical", "choices": ["triaccel", "amp"]}}
    for train in (None, "absent"):
        raw = dict(empty, train=None) if train is None else dict(empty)
        assert rules(parse_space(pin_controller_defaults(raw, None)).train_config({"mode": "triaccel"})) == \
            ("absolute", "power", "paper")

    cb = _callback(tmp_path)
    assert rules(cb.space.train_config({})) == ("relative", "fisher", "score")
    del cb.controller_defaults
    cb = pickle.loads(pickle.dumps(cb))  # as unpickled from an older search's Tune state
    assert rules(cb.space.train_config({})) == ("absolute", "power", "paper")


def test_a_callback_pickled_by_an_older_version_unpickles_with_every_cache(tmp_path):
    """Tune restores its callbacks from the pickle a search saved: one pickled before a cache existed
    (here `_closed`) raised AttributeError at its first trial on resume."""
    import pickle

    cb = _callback(tmp_path)
    state = cb.__getstate__()
    del state["_closed"], state["controller_defaults"]  # as an older version pickled it
    old = MLflowSearchCallback.__new__(MLflowSearchCallback)  # what pickle.loads does with that state:
    setstate = getattr(old, "__setstate__", None)
    setstate(state) if setstate is not None else old.__dict__.update(state)
    t = SimpleNamespace(trial_id="t1", config={"triaccel.precision.tau_low": 1e-6}, checkpoint=None)
    old.on_trial_start(0, [], t)
    old.on_trial_complete(0, [], t)
    assert old.client.get_run(old.child_run_id(t)).info.status == "FINISHED"
    again = pickle.loads(pickle.dumps(old))
    assert again._runs == {} and again._closed == set() and again._client is None
