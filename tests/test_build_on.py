"""Searches that build on earlier ones: baselines measured once, phase times, warm starts, extend, --storage.

Real parts throughout: a real sqlite MLflow store, real training on the digits set, real Optuna;
the end-to-end tests run the CLI with real local Ray.
"""
import copy
import json

import pytest

from _harness import DIGITS_SPACE, child_env
from conftest import small_cfg

SPACE = DIGITS_SPACE


# --------------------------------------------------------------------------- baselines measured once
def test_reuse_key_follows_training_settings_not_names():
    from triaccel.search.baseline_cache import reuse_key

    base = reuse_key(small_cfg())
    assert reuse_key(small_cfg(**{"tracking.run_name": "other", "tracking.experiment": "x"})) == base
    assert reuse_key(small_cfg(evaluate_test=True)) == base
    for change in ({"epochs": 3}, {"seed": 1}, {"batch_size": 32}, {"optim.lr": 0.1}, {"model.width": 16},
                   {"data.val_fraction": 0.2}, {"mode": "amp"}):
        assert reuse_key(small_cfg(**change)) != base, change


def test_reuse_key_follows_device_and_versions(monkeypatch):
    from triaccel.search import baseline_cache

    base = baseline_cache.reuse_key(small_cfg())
    monkeypatch.setattr(baseline_cache, "device_model", lambda device: "cuda:NVIDIA H200")
    assert baseline_cache.reuse_key(small_cfg()) != base
    monkeypatch.undo()
    real = baseline_cache.versions()
    monkeypatch.setattr(baseline_cache, "versions", lambda: {**real, "torch": "0.0.1"})
    assert baseline_cache.reuse_key(small_cfg()) != base


WIDTH = 8  # read as a global by the test's model function: a script's setting, not its source


def test_reuse_key_follows_the_users_model_and_data_code(tmp_path, monkeypatch):
    """A new user's search of a 1024-wide model reused the baseline an 8-wide one had measured under the same
    config (the same `model=` name, or the same class_path in a package edited since), and judged its trials
    at 0.02x against it. The user's code is in the key: a package's sources, a handed function's code and
    the plain globals it reads. An installed library is named by its version."""
    import sys

    import triaccel.userref as U
    from triaccel.search import baseline_cache

    key = lambda ref, section="model": baseline_cache.reuse_key(small_cfg(**{f"{section}.class_path": ref}))  # noqa: E731
    def wide(num_classes, in_channels, image_size):  # handed from Python: no import path (<locals>)
        from torch import nn

        return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size ** 2, WIDTH), nn.Linear(WIDTH, num_classes))

    ref = U.reference_of(wide, "model")
    assert U.is_callable_ref(ref)
    first = key(ref)
    assert key(ref) == first  # the same code: reused
    monkeypatch.setattr(sys.modules[__name__], "WIDTH", 1024)
    assert key(ref) != first
    monkeypatch.undo()
    assert key(ref) == first
    # a partial: its function and arguments; a callable object or a bound method: its state is not read, so
    # its baseline is never reused
    import functools

    part = lambda w: key(U.reference_of(functools.partial(wide, image_size=w), "model"))  # noqa: E731
    assert part(8) == part(8) != part(16)

    class Maker:
        def __call__(self, num_classes, in_channels, image_size):
            return wide(num_classes, in_channels, image_size)

    obj = U.reference_of(Maker(), "model")
    assert key(obj) != key(obj)
    # a package of the user's, edited between two searches
    pkg = tmp_path / "ucpkg_key"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text("def build(num_classes, width=32):\n    return width\n")
    (pkg / "layers.py").write_text("DEPTH = 2\n")
    # a data factory is called for its key too: the tensors it returns are in it (test_a_search_after_its_data...)
    (pkg / "data.py").write_text("import torch\nfrom torch.utils.data import TensorDataset\n\n\ndef build():\n"
                                 "    return {'train': TensorDataset(torch.zeros(20, 1, 8, 8), torch.arange(20) % 2)}\n")
    monkeypatch.chdir(tmp_path)
    before = key("ucpkg_key.models.build")
    assert key("ucpkg_key.models.build") == before and key("ucpkg_key.data.build", "data") != before
    (pkg / "layers.py").write_text("DEPTH = 3\n")  # a module the factory may import from
    assert key("ucpkg_key.models.build") != before
    # a library installed in site-packages: its version, not its thousands of files
    import hashlib
    from importlib.metadata import version

    assert baseline_cache.user_code(small_cfg(**{"model.class_path": "torch.nn:Linear"}))["model"] == \
        hashlib.sha256(f"torch=={version('torch')}".encode()).hexdigest()
    assert baseline_cache.user_code(small_cfg()) == {}  # the shipped models and data: their code is the project's


def test_reuse_key_follows_the_data_files_a_run_reads(tmp_path):
    """A baseline measured on a data folder was reused after images were added to it: the files on disk
    were not in the key. Now they are, by path, size and modification time: data.data_dir's files (unread,
    so not in the key, where a data factory reads its own) and every path the model's or data's init_args
    name, such as a factory's weights file."""
    from triaccel.search import baseline_cache

    cat = tmp_path / "imgs" / "train" / "cat"
    cat.mkdir(parents=True)
    (cat / "a.png").write_bytes(b"x" * 10)

    def key(**over):  # what a new search computes: the files as they are now
        baseline_cache.clear_file_fingerprints()
        return baseline_cache.reuse_key(small_cfg(**{"data.name": "imagefolder", "data.data_dir": str(tmp_path / "imgs"),
                                                     **over}))

    first = key()
    assert key() == first  # nothing changed: reused
    (cat / "b.png").write_bytes(b"y" * 10)  # an image added
    added = key()
    assert added != first
    (cat / "b.png").write_bytes(b"y" * 11)  # an image edited
    assert key() not in (first, added)
    (cat / "b.png").unlink()
    assert key() == first  # removed again: the folder as the first search saw it
    # cached within a search's baselines until cleared: a walk of a large folder is read once per search
    fp = baseline_cache._files_fingerprint(str((tmp_path / "imgs").resolve()))
    (cat / "c.png").write_bytes(b"z")
    assert baseline_cache._files_fingerprint(str((tmp_path / "imgs").resolve())) == fp
    baseline_cache.clear_file_fingerprints()
    assert baseline_cache._files_fingerprint(str((tmp_path / "imgs").resolve())) != fp
    # a path a factory's init_args name (a weights file); a string that names no file is a plain setting
    weights = tmp_path / "w.pt"
    weights.write_bytes(b"1")
    files = lambda: (baseline_cache.clear_file_fingerprints(), baseline_cache.data_files(small_cfg(**{  # noqa: E731
        "model.class_path": "torch.nn:Linear", "model.init_args.weights": str(weights),
        "model.init_args.note": "not-a-file"})))[1]
    before = files()
    assert list(before) == ["model.init_args.weights"]
    weights.write_bytes(b"22")
    assert files() != before
    assert baseline_cache.data_files(small_cfg()) == {}  # digits ships with the install: no files named
    # a linked class folder is read as the image loader reads it; a dangling link is part of the folder
    dog = tmp_path / "elsewhere" / "dog"
    dog.mkdir(parents=True)
    (tmp_path / "imgs" / "train" / "dog").symlink_to(dog)
    (tmp_path / "imgs" / "train" / "gone").symlink_to(tmp_path / "nowhere")
    linked = key()
    assert "unread" not in json.dumps(baseline_cache.data_files(small_cfg(**{
        "data.name": "imagefolder", "data.data_dir": str(tmp_path / "imgs")})))
    (dog / "d.png").write_bytes(b"w")
    assert key() != linked
    # strings that name no data: not a path (~ of no user), or a folder too broad to be data (the working
    # folder, which holds the search's own store, its parents, the home folder): left out, nothing walked
    many = {"model.class_path": "torch.nn:Linear", "model.init_args.a": "~no_such_user_x/cifar",
            "model.init_args.b": ".", "model.init_args.c": "/", "model.init_args.d": "~"}
    assert baseline_cache.data_files(small_cfg(**many)) == {}


def _runs(uri, name, role="baseline"):
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    exp = c.get_experiment_by_name("triaccel-search")
    return c, c.search_runs([exp.experiment_id], filter_string=f"tags.`triaccel.search` = '{name}' and "
                                                               f"tags.`triaccel.role` = '{role}'")


@pytest.mark.slow
def test_a_second_search_reuses_the_baseline_and_fresh_trains_it(tmp_store, capsys):
    """run_baselines as a search calls it, five searches of one space in one store."""
    from triaccel.search.baseline_cache import KEY_TAG, REUSED_FROM, REUSED_SEARCH
    from triaccel.search.alone import run_baselines
    from triaccel.search.space import parse_space

    space = parse_space(copy.deepcopy(SPACE))
    first = run_baselines("s1", space, tmp_store, 1)
    c, (b1,) = _runs(tmp_store, "s1")
    assert REUSED_FROM not in b1.data.tags and b1.data.tags[KEY_TAG]
    capsys.readouterr()

    second = run_baselines("s2", space, tmp_store, 1)
    _, (b2,) = _runs(tmp_store, "s2")
    assert b2.data.tags[REUSED_FROM] == b1.info.run_id and b2.data.tags[REUSED_SEARCH] == "s1"
    assert b2.data.tags[KEY_TAG] == b1.data.tags[KEY_TAG]
    assert b2.data.metrics == b1.data.metrics and second == first  # the reference curve too
    assert b2.data.params == b1.data.params and b2.info.status == "FINISHED"
    assert b2.data.tags["mlflow.parentRunId"] != b1.data.tags["mlflow.parentRunId"]
    assert f"reused from search 's1' run {b1.info.run_id}" in capsys.readouterr().out

    # a copy of a copy names the run that trained the figures
    run_baselines("s3", space, tmp_store, 1)
    _, (b3,) = _runs(tmp_store, "s3")
    assert b3.data.tags[REUSED_FROM] == b1.info.run_id and b3.data.tags[REUSED_SEARCH] == "s1"

    run_baselines("s4", space, tmp_store, 1, fresh=True)
    _, (b4,) = _runs(tmp_store, "s4")
    assert REUSED_FROM not in b4.data.tags
    assert b4.data.metrics["wall_s"] != b1.data.metrics["wall_s"]  # trained again, timed again

    # b4 measured beside another search's trials (half the efficiency, as a teammate's search on the cluster
    # made it): the next search reuses the better measurement, b1, not the newest
    c.log_metric(b4.info.run_id, "efficiency", b1.data.metrics["efficiency"] / 2, step=SPACE["train"]["epochs"])
    run_baselines("s5", space, tmp_store, 1)
    _, (b5,) = _runs(tmp_store, "s5")
    assert b5.data.tags[REUSED_FROM] == b1.info.run_id, (b5.data.tags[REUSED_SEARCH], b4.info.run_id)


SAVED_DATA = """
import torch
from torch.utils.data import TensorDataset


def saved(path):  # the user's data, from a file named beside the space
    x, y = torch.load(path)
    cut = len(y) * 4 // 5
    return {"train": TensorDataset(x[:cut], y[:cut]), "test": TensorDataset(x[cut:], y[cut:])}


def fetched(source, root):  # the user's data, fetched into root on first use (as a download is)
    import os, shutil

    os.makedirs(root, exist_ok=True)
    if not os.path.exists(os.path.join(root, "d.pt")):
        shutil.copyfile(source, os.path.join(root, "d.pt"))
    return saved(os.path.join(root, "d.pt"))


def hidden():  # nanoGPT's way: the factory finds its file by itself, named in no setting
    return saved("data/hidden.pt")
"""


@pytest.mark.slow
def test_a_search_after_its_data_file_changed_measures_the_baseline_again(tmp_store, tmp_path, monkeypatch, capsys):
    """Each search reads the data files as they are when its baselines start, also where one process runs
    several (the Python API in a notebook): the baseline is reused while the file the data factory reads is
    unchanged, and measured again once it changed. Data that the first run fetched (a download, a factory
    writing its cache) keys that run as it is after it: the next search reuses it."""
    import torch

    from triaccel.data import digits_arrays
    from triaccel.search.alone import run_baselines
    from triaccel.search.baseline_cache import REUSED_FROM
    from triaccel.search.space import parse_space

    (tmp_path / "bopkg").mkdir()
    (tmp_path / "bopkg" / "__init__.py").write_text("")
    (tmp_path / "bopkg" / "data.py").write_text(SAVED_DATA)
    monkeypatch.chdir(tmp_path)
    x, y = digits_arrays()

    def save(n):
        torch.save((torch.tensor(x[:n], dtype=torch.float32).unsqueeze(1) / 16, torch.tensor(y[:n])), "d.pt")

    save(500)
    space = copy.deepcopy(SPACE)
    space["train"]["data"] = {"class_path": "bopkg.data.saved", "init_args": {"path": "d.pt"}, "val_fraction": 0.15}
    space = parse_space(space)

    def measured(name):  # whether the search trained its baseline (not reused)
        run_baselines(name, space, tmp_store, 1)
        _, (b,) = _runs(tmp_store, name)
        return REUSED_FROM not in b.data.tags

    assert measured("d1")
    assert not measured("d2")  # the same file: reused
    save(600)  # the user's data grew
    assert measured("d3")
    assert not measured("d4")
    fetch = copy.deepcopy(space.raw)  # its folder is made and filled by the first run
    fetch["train"]["data"]["class_path"] = "bopkg.data.fetched"
    fetch["train"]["data"]["init_args"] = {"source": "d.pt", "root": "fetched"}
    space = parse_space(fetch)
    assert measured("f1") and (tmp_path / "fetched" / "d.pt").is_file()
    assert not measured("f2")  # keyed by the data the first run left, not by the empty place it started from
    # a file the factory finds by itself, changed in place (same size): each search's start loads the data
    # (check_references) and keys its baselines by what the factory returned
    from triaccel.userref import check_references

    (tmp_path / "data").mkdir()
    torch.save((torch.tensor(x[:500], dtype=torch.float32).unsqueeze(1) / 16, torch.tensor(y[:500])),
               "data/hidden.pt")
    own = copy.deepcopy(space.raw)
    own["train"]["data"] = {"class_path": "bopkg.data.hidden", "val_fraction": 0.15}
    space = parse_space(own)

    def search_measured(name):
        check_references(space.raw["train"])
        return measured(name)

    assert search_measured("h1") and not search_measured("h2")
    torch.save((torch.tensor(x[500:1000], dtype=torch.float32).unsqueeze(1) / 16, torch.tensor(y[500:1000])),
               "data/hidden.pt")  # other digits, same shapes
    assert search_measured("h3")  # was reused: trials judged against a baseline trained on the old data
    assert not search_measured("h4")


def test_a_reused_baseline_costs_the_search_no_device_time():
    from triaccel.search.results import gpu_seconds

    trained = {"metrics": {"wall_s": 10.0, "gpu_share": 1.0}, "tags": {}}
    reused = {"metrics": {"wall_s": 10.0, "gpu_share": 1.0}, "tags": {"triaccel.reused_from": "abc"}}
    assert gpu_seconds([trained, reused]) == 10.0


# --------------------------------------------------------------------------- time by phase
def test_phase_seconds_add_up_on_the_parent_run_across_resumes(tmp_store):
    from triaccel.search import phases
    from triaccel.search.state import open_store

    c, exp = open_store(tmp_store)
    phases.add(c, exp, "p", "trials", 5.0)  # no parent run yet: nothing to record it on
    c.create_run(exp, tags={"triaccel.search": "p", "triaccel.role": "parent"})
    assert phases.read(c, exp, "p") == {"baselines": 0.0, "trials": 0.0, "confirm": 0.0}
    phases.add(c, exp, "p", "trials", 5.0)
    phases.add(c, exp, "p", "trials", 2.5)  # a resume's share
    with phases.timed(tmp_store, "p", "baselines"):
        pass
    got = phases.read(c, exp, "p")
    assert got["trials"] == 7.5 and 0.0 <= got["baselines"] < 5 and got["confirm"] == 0.0
    assert phases.read(c, exp, "other") == {"baselines": 0.0, "trials": 0.0, "confirm": 0.0}
    assert "trials 8 s" in phases.words(got)


# --------------------------------------------------------------------------- warm start
def _other_space():
    """Another space: rho_low's range narrower, tau_low's range narrower, lr searched, tau_high gone."""
    s = copy.deepcopy(SPACE)
    s["params"] = {
        "triaccel.precision.tau_low": {"distribution": "loguniform", "low": 1e-6, "high": 1e-4},
        "triaccel.batch.rho_low": {"distribution": "uniform", "low": 0.4, "high": 0.6},
        "triaccel.batch.rho_high": {"distribution": "uniform", "low": 0.5, "high": 0.95,
                                    "above": "triaccel.batch.rho_low"},
        "triaccel.control_every": {"distribution": "int", "low": 4, "high": 10, "step": 2},
        "optim.lr": {"distribution": "categorical", "choices": [0.05, 0.1]},
    }
    from triaccel.search.space import parse_space

    return parse_space(s)


def test_a_point_maps_onto_another_space_clipped_or_left_out_and_says_so():
    from triaccel.search.warmstart import map_point

    space = _other_space()
    point, notes = map_point({"triaccel.precision.tau_low": 1e-7, "triaccel.precision.tau_high": 0.01,
                              "triaccel.batch.rho_low": 0.65, "triaccel.batch.rho_high": 0.58,
                              "triaccel.control_every": 7, "optim.lr": 0.2}, space)
    assert point == {"triaccel.precision.tau_low": 1e-6, "triaccel.batch.rho_low": 0.6,
                     "triaccel.control_every": 8}
    text = "; ".join(notes)
    assert "not searched here: triaccel.precision.tau_high" in text
    assert "tau_low 1e-07 clipped to 1e-06" in text and "rho_low 0.65 clipped to 0.6" in text
    assert "rho_high left out (0.58 not above triaccel.batch.rho_low (0.6))" in text
    assert "optim.lr left out (0.2 not among the choices)" in text
    assert "control_every 7 clipped to 8" in text
    # inside the bounds: kept as it is, nothing said
    same, quiet = map_point({"triaccel.batch.rho_low": 0.5, "triaccel.batch.rho_high": 0.7, "optim.lr": 0.1}, space)
    assert same == {"triaccel.batch.rho_low": 0.5, "triaccel.batch.rho_high": 0.7, "optim.lr": 0.1} and not quiet
    # the mapped point is a valid start point of the new space
    from triaccel.search.space import parse_space

    raw = dict(space.raw, start=[point, same])
    assert len(parse_space(raw).start) == 2


@pytest.mark.slow
def test_warm_start_options_are_refused_in_one_line_before_anything_is_written(tmp_path):
    import subprocess
    import sys

    (tmp_path / "s.yaml").write_text(json.dumps(SPACE))
    for args, key in ((["--warm-start", "nope"], "--warm-start nope"),
                      (["--warm-start-k", "2"], "--warm-start-k"),
                      (["--warm-start", "x", "--warm-start-k", "0"], "--warm-start-k"),
                      (["--warm-start", "../x"], "--warm-start")):
        r = subprocess.run([sys.executable, "-m", "triaccel.cli", "search", "--space", "s.yaml", *args],
                           cwd=tmp_path, capture_output=True, text=True, timeout=600,
                           env=child_env(TRIACCEL_TUNE_DIR=str(tmp_path / "tune"),
                                         MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/m.db"))
        assert r.returncode != 0 and key in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "tune").exists() and not (tmp_path / "m.db").exists()


# --------------------------------------------------------------------------- extend
def _row(i, status="FINISHED", eff=None, **values):
    v = {"triaccel.precision.tau_low": 1e-6 * (i + 1), "triaccel.precision.tau_high": 1e-3 * (i + 1),
         "triaccel.batch.rho_low": 0.4 + 0.01 * i, **values}
    m = {} if eff is None else {"efficiency": eff, "acc_constraint": -1.0}
    return {"run_id": f"r{i}", "status": status, "values": v, "metrics": m, "trial_id": f"t{i}", "tags": {}}


def test_the_extended_study_holds_every_earlier_trial_before_its_first_suggestion():
    """The searcher as extend builds it, with real Optuna: what the sampler sees is in the study."""
    import optuna

    from triaccel.search.extend import earlier_trials
    from triaccel.search.tuner import new_searcher
    from triaccel.search.space import FRAC_SUFFIX, parse_space

    space = parse_space(copy.deepcopy(SPACE))
    rows = [_row(0, eff=10.0), _row(1, eff=12.0), _row(2, status="FAILED"), _row(3, status="KILLED", eff=3.0),
            _row(4, eff=11.0)]
    seeds = earlier_trials(rows, space)
    states = [t.state for t in seeds]
    C = optuna.trial.TrialState
    assert states == [C.COMPLETE, C.COMPLETE, C.FAIL, C.COMPLETE]  # the KILLED run cut short: left out
    assert seeds[1].value == 12.0 and seeds[1].system_attrs["constraints:accuracy"] == -1.0
    # an ordered key travels as its position above its partner, as the sampler draws it
    assert set(seeds[0].params) == {"triaccel.precision.tau_low", "triaccel.precision.tau_high" + FRAC_SUFFIX,
                                    "triaccel.batch.rho_low"}
    assert space.resolve(seeds[0].params)["triaccel.precision.tau_high"] == pytest.approx(1e-3)

    alg = new_searcher(space, seeds).searcher
    config = alg.suggest("new-1")
    assert alg.seen_before_first == 3
    study = alg._ot_study
    assert len(study.get_trials(states=(C.COMPLETE,))) == 3 and len(study.trials) == 5
    assert study.best_value == 12.0  # the earlier best, as the sampler models it
    assert set(space.params) <= set(space.resolve(config))


# --------------------------------------------------------------------------- end to end, --storage
def _cli(*args, cwd, store):
    import subprocess
    import sys

    env = child_env("TRIACCEL_TUNE_DIR", MLFLOW_TRACKING_URI=store)
    return subprocess.run([sys.executable, "-m", "triaccel.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=900, env=env)


def _said(r) -> str:
    """A run's output less Ray's own log lines."""
    keep = lambda t: "\n".join(x for x in t.splitlines() if "core_worker" not in x and x.strip())[-3000:]
    return f"rc {r.returncode}\nstdout:\n{keep(r.stdout)}\nstderr:\n{keep(r.stderr)}"


@pytest.fixture(scope="module")
def built_on(tmp_path_factory):
    """Search 'a' from one working folder with its state in a separate storage folder; then, from
    another folder, search 'b' of the same space warm-started from 'a', and extend 'a'."""
    root = tmp_path_factory.mktemp("built_on")
    storage, d1, d2 = root / "storage", root / "w1", root / "w2"
    d1.mkdir()
    d2.mkdir()
    store = f"sqlite:///{root}/mlflow.db"
    for d in (d1, d2):
        (d / "space.yaml").write_text(json.dumps(SPACE))
    out = {"root": root, "storage": storage, "d1": d1, "d2": d2, "store": store}
    out["a"] = _cli("search", "--space", "space.yaml", "--name", "a", "--storage", str(storage), cwd=d1, store=store)
    assert out["a"].returncode == 0, _said(out["a"])
    from triaccel.search.results import outcome, trial_table
    from triaccel.search.state import open_store

    c, exp = open_store(store)
    o = outcome(trial_table(c, exp, "a"), [], [], SPACE["train"]["epochs"])
    out["a_best2"] = [x.row["values"] for x in o.ranked[:2]]  # what --warm-start a --warm-start-k 2 takes
    out["b"] = _cli("search", "--space", "space.yaml", "--name", "b", "--storage", str(storage), "--trials", "2",
                    "--warm-start", "a", "--warm-start-k", "2", cwd=d2, store=store)  # its two warm-start points
    assert out["b"].returncode == 0, _said(out["b"])
    out["x"] = _cli("extend", "a", "--trials", "1", "--storage", f"file://{storage}", cwd=d2, store=store)
    assert out["x"].returncode == 0, _said(out["x"])
    return out


@pytest.mark.slow
def test_the_second_search_trains_no_baseline(built_on):
    from triaccel.search.baseline_cache import REUSED_FROM

    store = built_on["store"]
    _, (ba,) = _runs(store, "a")
    _, (bb,) = _runs(store, "b")
    assert REUSED_FROM not in ba.data.tags and bb.data.tags[REUSED_FROM] == ba.info.run_id
    out = built_on["b"].stdout
    assert f"reused from search 'a' run {ba.info.run_id}" in out
    assert "baselines:" in out and "time by phase" in out
    r = _cli("export", "b", "--out", str(built_on["root"] / "b.yaml"), "--storage", str(built_on["storage"]),
             cwd=built_on["d1"], store=store)
    assert r.returncode == 0, _said(r)
    import yaml

    prov = yaml.safe_load((built_on["root"] / "b.yaml").read_text())["provenance"]
    assert prov["baseline"]["reused_from"]["mlflow_run_id"] == ba.info.run_id
    assert prov["baseline"]["reused_from"]["search"] == "a"


@pytest.mark.slow
def test_warm_start_runs_the_earlier_best_first(built_on):
    from triaccel.search.results import trial_table
    from triaccel.search.state import open_store

    c, exp = open_store(built_on["store"])
    best2 = built_on["a_best2"]
    starts = [r["values"] for r in trial_table(c, exp, "b") if r["tags"].get("triaccel.start") == "true"]
    assert len(starts) == 2
    for want in best2:
        assert any(all(got[k] == pytest.approx(v, rel=1e-6) for k, v in want.items()) for got in starts), (want, starts)
    assert "sampler seed 8 (the space's 5 + its 3 trials)" in built_on["b"].stdout


@pytest.mark.slow
def test_extend_seeds_the_sampler_with_every_earlier_trial_and_ranks_them_together(built_on):
    c, parents = _runs(built_on["store"], "a", role="parent")
    seen = c.get_metric_history(parents[0].info.run_id, "extend_seen_trials")
    assert [m.value for m in seen] == [3.0]  # the first search's three finished trials
    _, trials = _runs(built_on["store"], "a", role="trial")
    assert len(trials) == 4 and all(t.info.status == "FINISHED" for t in trials)
    assert parents[0].info.status == "FINISHED"
    assert "search 'a': 4 finished" in built_on["x"].stdout
    assert (built_on["storage"] / "a" / "extend-1").is_dir()


@pytest.mark.slow
def test_storage_export_and_resume_from_another_working_folder(built_on, tmp_path):
    import yaml

    d3 = tmp_path / "elsewhere"
    d3.mkdir()
    storage, store = str(built_on["storage"]), built_on["store"]
    assert not (built_on["d1"] / "mlruns" / "tune").exists()  # the state went to --storage
    r = _cli("export", "a", "--out", "t.yaml", "--storage", storage, cwd=d3, store=store)
    assert r.returncode == 0, r.stderr
    prov = yaml.safe_load((d3 / "t.yaml").read_text())["provenance"]
    _, trials = _runs(store, "a", role="trial")
    _, base = _runs(store, "a")
    assert prov["mlflow_run_id"] in {t.info.run_id for t in trials} | {b.info.run_id for b in base}
    assert set(prov["device_s_by_phase"]) == {"baselines", "trials", "confirm"}
    assert prov["device_s_by_phase"]["trials"] > 0 and prov["device_s_by_phase"]["baselines"] > 0
    r = _cli("searches", "--storage", storage, cwd=d3, store=store)
    assert r.returncode == 0 and {"a", "b"} <= {line.split()[0] for line in r.stdout.splitlines()[1:] if line}
    r = _cli("resume", "b", "--storage", storage, cwd=d3, store=store)
    assert r.returncode == 0, _said(r)
    assert "triaccel resume 'b': the search has finished; nothing was left to run" in r.stdout  # found from d3
    # a new search under that finished search's name is pointed at export and extend, not at resume
    (d3 / "space.yaml").write_text(json.dumps(SPACE))
    r = _cli("search", "--space", "space.yaml", "--name", "b", "--storage", storage, cwd=d3, store=store)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, _said(r)
    assert "search 'b' already exists in" in r.stderr and "and has finished: `triaccel export b" in r.stderr
    assert "triaccel resume" not in r.stderr and "`triaccel extend b" in r.stderr
    (d3 / "space.yaml").unlink()
    assert not (d3 / "mlruns").exists()  # nothing read or written relative to the working folder


def test_storage_names_a_folder_or_says_why_not(tmp_path):
    from triaccel.errors import ConfigError
    from triaccel.search.storage import storage_root

    assert storage_root(str(tmp_path / "new")) == tmp_path / "new"  # made by the search that writes it
    assert storage_root(f"file://{tmp_path}") == tmp_path
    assert storage_root(f"local://{tmp_path}") == tmp_path  # any URI pyarrow opens as the local file system
    (tmp_path / "f").write_text("x")
    # mock://: pyarrow's in-memory file system, a remote one that answers offline
    for bad, why in ((str(tmp_path / "f"), "is a file"), ("mock:///tune", "mock:// answers, but .* mount it"),
                     ("nosuch://x", "not a file system pyarrow can open"),
                     ("file://relative/x", "absolute path"), ("  ", "empty")):
        with pytest.raises(ConfigError, match=why) as e:
            storage_root(bad)
        assert str(e.value).startswith("--storage ")
