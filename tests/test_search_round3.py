"""Hardening, third round (issue 34): one driver per search, finished trials that stay finished,
resume that keeps the search's options, searched mappings, a locked store, Ray that cannot start, a
lost worker. Real subprocesses, real local Ray, a real sqlite MLflow store, real signals."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from test_search_hardening import SPACE, _env, cli, runs


def _state(tmp_path, name):
    d = tmp_path / "mlruns" / "tune" / name
    d.mkdir(parents=True)
    (d / "triaccel_search.json").write_text(json.dumps({"space": {}, "source": "s.yaml", "sha256": "",
                                                        "tracking_uri": "sqlite:///nowhere.db"}))
    return d


HOLD = ("import fcntl, json, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, json.dumps({'pid': os.getpid(), 'host': 'h1', 'command': 'search', "
        "'since': 'then'}).encode())\n"
        "print('held', flush=True)\n"
        "time.sleep(600)\n")


def test_resume_while_another_driver_holds_the_search_is_refused_until_it_dies(tmp_path):
    """A second driver of one search (here a process holding the search's lock as a driver does) is refused
    in one line naming the holder, exit 2, nothing written; once the holder is killed (-9, no clean-up) the
    kernel has released the lock and resume gets past it."""
    d = _state(tmp_path, "x")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(d / "driver.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = sorted(p.name for p in d.iterdir())
        r = cli("resume", "x", cwd=tmp_path, timeout=600)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert r.stderr.strip().splitlines() == [
            f"triaccel: error: search 'x' is being run by pid {holder.pid} on h1 (search, since then): one search "
            f"has one driver at a time; wait for it to end (or stop it), then `triaccel resume x`"]
        assert sorted(p.name for p in d.iterdir()) == before and not (tmp_path / "nowhere.db").exists()
    finally:
        holder.kill()
        holder.wait()
    r = cli("resume", "x", cwd=tmp_path, timeout=600)
    assert "being run by" not in r.stderr, r.stderr[-2000:]  # past the lock: refused later, for its empty state


@pytest.mark.slow
def test_resume_while_the_search_runs_is_refused_and_the_search_runs_its_trials(tmp_path):
    """`triaccel resume f` after the running search's first trial line ran a second driver: both ran, 12 trials
    landed for 8. Now it is refused in one line and the search alone runs its trials."""
    space = dict(SPACE, trials=3, concurrency=1)
    space["train"] = dict(SPACE["train"], epochs=2)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    proc = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--name", "f",
                             "--confirm", "0"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(), start_new_session=True)
    try:
        out = ""
        for line in proc.stdout:
            out += line
            if line.startswith("trial "):
                break
        r = cli("resume", "f", "--confirm", "0", cwd=tmp_path, timeout=600)
        rest, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"triaccel: error: search 'f' is being run by pid {proc.pid} on "), line
    assert proc.returncode == 0, err[-2000:]
    _, all_runs = runs(tmp_path, "f")
    assert len([x for x in all_runs if x.data.tags["triaccel.role"] == "trial"]) == 3


def _named_checkpoints(folder):
    """The checkpoints (trial/checkpoint_N) of unfinished trials that Tune's newest saved state names."""
    states = sorted(folder.glob("experiment_state-*.json"))
    if not states:
        return []
    try:
        data = json.loads(states[-1].read_text())["trial_data"]
    except ValueError:  # being written
        return []
    out = []
    for trial, meta in data:
        trial, last = json.loads(trial), json.loads(meta).get("last_result") or {}
        if trial["status"] != "TERMINATED" and last.get("checkpoint_dir_name"):
            out.append(f"{trial['trial_id']}/{last['checkpoint_dir_name']}")
    return out


@pytest.mark.slow
def test_a_checkpoint_the_saved_state_names_but_tune_deleted_is_no_failed_trial(tmp_path):
    """Tune deletes a trial's older checkpoint as it registers a new one, and its saved state naming the new one
    reaches storage later (synced in the background): a driver killed in between (kill -9 just after a 'trial
    ... done' line) left a state naming a deleted checkpoint, and resume marked the trial FAILED ("Could not
    recover from checkpoint as it does not exist on storage anymore"). That storage is made here without the
    race: the search stopped (Ctrl-C) with a trial unfinished, its named checkpoint then moved to the next
    index, as Tune leaves it. The trial continues from the checkpoint on storage."""
    space = dict(SPACE, trials=2, concurrency=1)
    space["train"] = dict(SPACE["train"], epochs=6)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    folder = tmp_path / "mlruns" / "tune" / "k"
    proc = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--name", "k",
                             "--confirm", "0"], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=_env(), start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not any(f.stat().st_size for f in folder.glob("*/result.json")):
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # Tune saves a state naming the trial's checkpoint
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    named = _named_checkpoints(folder)
    assert named, "the search never saved a state naming a checkpoint"
    for rel in named:
        src = folder / rel
        index = int(src.name.rsplit("_", 1)[1])
        newer = src.with_name(f"checkpoint_{index + 1:06d}")
        if newer.is_dir():  # Tune had made the next one: only the deletion is left to do
            shutil.rmtree(src)
        elif src.is_dir():
            src.rename(newer)
    r = cli("resume", "k", "--confirm", "0", cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "FAILED" not in r.stdout and "does not exist on storage" not in r.stdout + r.stderr, r.stdout[-2000:]
    c, all_runs = runs(tmp_path, "k")
    trials = [x for x in all_runs if x.data.tags["triaccel.role"] == "trial"]
    assert sorted(x.info.status for x in trials) == ["FINISHED", "FINISHED"], [x.data.tags for x in trials]
    for x in trials:  # trained to the end, no epoch logged twice
        steps = sorted(m.step for m in c.get_metric_history(x.info.run_id, "val_acc"))
        assert steps[-1] == 6 and len(steps) == len(set(steps)), steps

@pytest.mark.parametrize("key,spec,example", [
    ("triaccel.batch", {"distribution": "categorical", "choices": [{"min_batch": 16}, {"min_batch": 32}]},
     "params.triaccel.batch.min_batch: {distribution: categorical, choices: [16, 32]}"),
    ("optim", {"distribution": "categorical", "choices": [{"lr": 0.1}, {"lr": 0.01, "momentum": 0.8}]},
     "params.optim.lr: {distribution: categorical, choices: [0.1, 0.01]}"),
    ("triaccel.precision", {"distribution": "categorical", "choices": [{}, {"tau_low": 1.0}]},
     "params.triaccel.precision.KEY"),
])
def test_a_searched_section_is_refused_not_replaced(tmp_path, key, spec, example):
    """A categorical over mappings at a section's key replaced the section: its other keys (budget_gb fixed in
    train:, the defaults) were dropped from every trial while the summary and provenance.searched showed the
    mapping as if merged. A new search refuses it in one line naming the key; a saved search's space is read
    as it was accepted (its export writes what its trials trained)."""
    from triaccel.errors import ConfigError
    from triaccel.search.space import parse_space

    space = dict(SPACE, params={key: spec})
    with pytest.raises(ConfigError) as ei:
        parse_space(space, source="s.yaml", strict=True)
    assert str(ei.value) == (f"s.yaml: params.{key}: names a section, not a key: a searched value would replace "
                             f"the whole section (its other keys dropped); search the section's keys themselves, "
                             f"e.g. {example}")
    parse_space(space, source="s.yaml")
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    r = cli("search", "--space", "space.yaml", cwd=tmp_path, timeout=600)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert f"params.{key}: names a section" in r.stderr and not (tmp_path / "mlruns").exists()


@pytest.mark.slow
def test_resume_keeps_the_options_the_search_was_started_with(tmp_path):
    """Resume forgot --confirm: a `search --confirm 1` stopped (Ctrl-C) resumed with no confirm run, and export
    used unconfirmed figures. The options are saved with the search and resume uses them unless given again."""
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    proc = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--name", "o",
                             "--confirm", "1", "--trials", "1"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(), start_new_session=True)
    try:
        assert proc.stdout.readline().startswith("triaccel search 'o'")  # its state is saved
        os.killpg(proc.pid, signal.SIGINT)
        proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130
    r = cli("resume", "o", cwd=tmp_path)
    assert r.returncode == 0 and "confirm " in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    _, all_runs = runs(tmp_path, "o")
    assert sorted((x.data.tags["triaccel.role"], x.info.status) for x in all_runs) == [
        ("confirm", "FINISHED"), ("parent", "FINISHED"), ("trial", "FINISHED")]
    r = cli("export", "o", "--out", "t.yaml", cwd=tmp_path)
    assert r.returncode == 0 and yaml.safe_load((tmp_path / "t.yaml").read_text())["provenance"]["confirmed_alone"]
    # a finished search resumed: said so, nothing run (it printed the summary again, as if it had run)
    r = cli("resume", "o", cwd=tmp_path)
    assert r.returncode == 0 and "the search has finished; nothing was left to run" in r.stdout, r.stdout[-2000:]
    assert len(runs(tmp_path, "o")[1]) == 3
    r = cli("searches", cwd=tmp_path)
    assert r.returncode == 0 and next(ln for ln in r.stdout.splitlines() if ln.startswith("o ")).split()[3] == \
        "finished", r.stdout


LOCKER = ("import sqlite3, sys, time\n"
          "db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)\n"
          "db.execute('BEGIN EXCLUSIVE')\n"
          "print('locked', flush=True)\n"
          "time.sleep(float(sys.argv[2]))\n"
          "db.execute('COMMIT')\n")

TRAIN = {"epochs": 40, "batch_size": 64, "device": "cpu", "eval_batch_size": 512, "evaluate_test": False,
         "data": {"name": "digits", "crop_padding": 1}, "model": {"name": "small_cnn", "width": 8},
         "optim": {"lr": 0.05, "warmup_epochs": 0.5}, "tracking": {"enabled": True}}


def _train_with_the_store_locked(tmp_path, hold_s, wait_s):
    """`triaccel train` whose sqlite store another process holds (BEGIN EXCLUSIVE) for hold_s seconds once
    the run's first epoch is in."""
    import sqlite3

    (tmp_path / "c.yaml").write_text(yaml.safe_dump(TRAIN))
    env = dict(_env(), TRIACCEL_STORE_LOCK_WAIT_S=str(wait_s))
    proc = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "train", "--config", "c.yaml"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    db = tmp_path / "mlruns" / "mlflow.db"
    locker = None
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None and locker is None:
            try:
                with sqlite3.connect(db) as c:
                    if c.execute("select count(*) from metrics where key = 'val_acc'").fetchone()[0]:
                        locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(db), str(hold_s)],
                                                  stdout=subprocess.PIPE, text=True)
                        assert locker.stdout.readline().strip() == "locked"
            except sqlite3.Error:
                pass
            time.sleep(0.1)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
        if locker is not None:
            locker.wait(timeout=600)
    assert locker is not None, "train ended before its first epoch was in the store"
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=f"sqlite:///{db}")
    (run,) = c.search_runs([c.get_experiment_by_name("triaccel-train").experiment_id])
    return proc.returncode, out, err, run


@pytest.mark.slow
def test_train_rides_through_a_store_locked_by_another_process(tmp_path):
    """A store locked for 25 s (more than the 20 s MLflow has sqlite wait) during `train`: a 189-line traceback,
    exit 1, the run left RUNNING. Within the bound (TRIACCEL_STORE_LOCK_WAIT_S) the call is retried."""
    rc, out, err, run = _train_with_the_store_locked(tmp_path, hold_s=25, wait_s=60)
    assert rc == 0 and "Traceback" not in err, err[-3000:]
    assert run.info.status == "FINISHED"


@pytest.mark.slow
def test_a_store_locked_beyond_the_bound_is_one_line_and_the_run_killed(tmp_path):
    rc, out, err, run = _train_with_the_store_locked(tmp_path, hold_s=30, wait_s=1)
    assert rc == 2 and "Traceback" not in err, err[-3000:]
    (line,) = err.strip().splitlines()
    assert line.startswith("triaccel: error: the MLflow store sqlite:///"), line
    assert "stayed locked by another process for more than 1 s" in line, line
    assert run.info.status == "KILLED"


@pytest.mark.slow
def test_ray_that_cannot_start_is_one_line_and_leaves_no_run_running(tmp_path):
    """Under `ulimit -f 2000` Ray cannot start: Ray's raw traceback, exit 1, the parent run left RUNNING."""
    space = dict(SPACE, baseline={"batch_sizes": [64]})
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    r = subprocess.run(["bash", "-c", f"ulimit -f 2000; exec {sys.executable} -m triaccel.cli search --space "
                                      f"space.yaml --name u"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=600, env=_env())
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("triaccel: error: Ray could not start on this machine ("), line
    _, all_runs = runs(tmp_path, "u")
    assert all_runs and not [x for x in all_runs if x.info.status == "RUNNING"]


def test_help_says_every_argument_and_the_score_once():
    """Gaps a newcomer met: `export name`, `--out`, `resume name`, `--address`, `ui --port`, `--host`,
    `profile --config`, `--set`, `--warmup` had no help text, `searches` no description; `search --address`
    showed a ray:// example where the README says HOST:PORT; the score had no definition."""
    from triaccel.cli import build_parser

    p = build_parser()
    for cmd, parser in p.commands.items():
        for a in parser._actions:
            if a.dest != "help":
                assert a.help, f"{cmd} {a.option_strings or a.dest}: no help text"
    assert p.commands["searches"].description
    assert "ray://" not in p.commands["search"].format_help()
    text = " ".join(p.commands["search"].format_help().split())
    assert "efficiency score" in text and "peak GPU memory (GB)" in text


def test_a_static_export_and_the_summary_columns_read_plainly():
    from triaccel.search.summary import headers

    assert headers(["triaccel.batch.grow_factor", "optim.lr"]) == ["grow_factor", "lr"]
    assert headers(["triaccel.batch.rho_high", "triaccel.precision.rho_high"]) == ["batch.rho_high",
                                                                                   "precision.rho_high"]


def test_only_a_signal_that_reached_tune_makes_a_search_with_trials_left_interrupted(monkeypatch):
    """Tune's fit() returns normally in two cases: every trial ended (an ERROR one included: a lost
    worker), or SIGINT/SIGUSR1 reached its handler. Its saved state can lag behind (a trial still RUNNING
    there); that state decides only where a signal came. Tune's real handler, a real SIGINT."""
    from ray.tune.tune import _setup_signal_catching

    from triaccel.errors import Interrupted
    from triaccel.search import signals, tuner

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    try:
        with signals.own_signals() as quiet:
            _setup_signal_catching()  # what fit() does first; it returns with the handler in place
        with signals.own_signals() as stopped:
            _setup_signal_catching()
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C during fit(): Tune's handler takes it
            time.sleep(0.05)
        after = signal.getsignal(signal.SIGINT)
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
    assert quiet.stopped is False and stopped.stopped is True
    assert after is saved[signal.SIGINT]  # own_signals put the handler from before fit() back

    monkeypatch.setattr(tuner, "left_to_run", lambda name, planned: 1)  # the saved state lags: one trial RUNNING
    tuner.check_finished("s", 3, stopped=False)  # no signal: Tune's loop ended because every trial had
    with pytest.raises(Interrupted, match="1 of 3 trials left"):
        tuner.check_finished("s", 3, stopped=True)
    with pytest.raises(Interrupted):  # not known (TUNE_DISABLE_SIGINT_HANDLER): the saved state decides
        tuner.check_finished("s", 3, stopped=None)
    monkeypatch.setenv("TUNE_DISABLE_SIGINT_HANDLER", "1")
    assert signals.tune_saw_a_signal(signal.default_int_handler) is None


def _training_workers(sid: int) -> list[int]:
    """The pids of trial actors training now in the session ``sid``: process title ray::<trainable>.train
    (Tune's with_resources names the trainable ResourceTrainable; an actor done training is titled
    ray::SearchTrial, an idle worker ray::IDLE)."""
    out = subprocess.run(["ps", "-eo", "pid,sid,args"], capture_output=True, text=True).stdout
    pids = []
    for ln in out.splitlines()[1:]:
        pid, s, args = ln.split(None, 2)
        if int(s) == sid and args.startswith("ray::") and ".train" in args and (
                "ResourceTrainable" in args or "SearchTrial" in args):
            pids.append(int(pid))
    return pids


@pytest.mark.slow
def test_a_killed_trial_worker_is_a_failed_trial_and_the_search_finishes(tmp_path):
    """kill -9 of one trial's worker mid-search: that trial is FAILED in MLflow, the others run, the
    search finishes (exit 0, parent FINISHED); nobody stopped it, so it is never 'interrupted' (130)."""
    space = dict(SPACE, trials=3, concurrency=1)
    space["train"] = dict(SPACE["train"], epochs=6)  # a trial trains for seconds: time to find and kill it
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    proc = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--name", "k"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                            start_new_session=True)
    killed = []
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None and not killed:
            workers = _training_workers(proc.pid)
            if workers and any(f.stat().st_size for f in (tmp_path / "mlruns" / "tune" / "k").glob("*/result.json")):
                os.kill(workers[0], signal.SIGKILL)
                killed.append(workers[0])
            time.sleep(0.2)
        assert killed, "no trial worker was found while the search ran"
        out, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-2000:] + err[-3000:]
    assert "interrupted" not in err
    _, trials = runs(tmp_path, "k", role="trial")
    assert sorted(t.info.status for t in trials) == ["FAILED", "FINISHED", "FINISHED"], [t.info.status for t in trials]
    _, parents = runs(tmp_path, "k", role="parent")
    assert [p.info.status for p in parents] == ["FINISHED"]
