"""A search's own state and its store (search/state.py): one driver per search, resume that keeps
the options and finished trials, a lost or unreadable state, a full disk, an MLflow store that is
unusable, fills or dies mid-search. Real subprocesses, real local Ray, a real MLflow store."""
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from _harness import SPACE, cli, free_port, run_search, runs, user_env, with_store


# The search's driver, SIGKILLed with its local Ray the moment Tune's Tuner has been built (it
# writes tuner.pkl as it is built) and before fit() starts the trials and writes the first
# experiment state. A kill timed from outside (poll for tuner.pkl, then kill) raced Tune's
# start-up: under load the experiment state could come first. Here the kill is part of the
# program, at that point: the real CLI, Ray, Tune and MLflow up to it, nothing mocked.
_DIE_ONCE_TUNER_BUILT = """
import os, signal, sys
from triaccel.cli import main
from triaccel.search import runner

real_tuner = runner.new_tuner


def tuner_then_die(*args, **kwargs):
    real_tuner(*args, **kwargs)  # tune.Tuner(...) writes tuner.pkl here
    os.killpg(os.getpgrp(), signal.SIGKILL)  # the driver and its local Ray: no chance to clean up


runner.new_tuner = tuner_then_die
sys.exit(main(sys.argv[1:]))
"""


def _kill_in_tune_start_up(tmp_path, name):
    """Start a 2-trial search and kill -9 its driver once Tune wrote tuner.pkl, before its first
    experiment state (Tune's start-up): the on-disk state of #14 case 2."""
    import signal

    space = dict(SPACE, trials=2)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    tune_dir = tmp_path / "mlruns" / "tune" / name
    proc = subprocess.Popen([sys.executable, "-c", _DIE_ONCE_TUNER_BUILT, "search", "--space", "space.yaml",
                             "--name", name], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=user_env(), start_new_session=True)  # its own group: killpg takes only it
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of it if it did not get there
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, out[-2000:], err[-3000:])
    assert (tune_dir / "tuner.pkl").exists() and not list(tune_dir.glob("experiment_state-*.json")), \
        sorted(p.name for p in tune_dir.iterdir())  # the moment of #14 case 2
    return tune_dir


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
def test_driver_killed_in_tune_start_up_resumes_the_whole_search(tmp_path):
    """Restoring the directory a driver killed in Tune's start-up leaves made Tune plan one trial,
    and `resume` reported a finished 1-trial search. It must run every trial the space asked for."""
    with_store(tmp_path)  # a copy of the migrated template (the store's creation: elsewhere)
    _kill_in_tune_start_up(tmp_path, "s")
    r = cli("resume", "s", cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "Tune saved no trial yet: starting the trials" in r.stdout
    assert "search 's': 2 finished" in r.stdout and "2 trials in MLflow" in r.stdout, r.stdout[-2000:]
    _, all_runs = runs(tmp_path, "s")
    trials = [x for x in all_runs if x.data.tags["triaccel.role"] == "trial"]
    assert len(trials) == 2 and len({t.data.tags["triaccel.trial_id"] for t in trials}) == 2
    assert all(x.info.status == "FINISHED" for x in all_runs)  # the parent included


@pytest.mark.slow
def test_tune_state_planning_fewer_trials_than_the_space_is_refused_in_one_line(tmp_path):
    """The state the earlier `resume` left after a death in Tune's start-up (Tune restored with no
    experiment state plans one trial): resuming it can never run the rest, so `resume` refuses in
    one line saying what to do, instead of running nothing and promising `resume` again."""
    with_store(tmp_path)  # a copy of the migrated template (the store's creation: elsewhere)
    tune_dir = _kill_in_tune_start_up(tmp_path, "f")
    # what `triaccel resume` did before the fix, run for real: Tune restores tuner.pkl alone
    old_resume = ("import sys\nfrom pathlib import Path\nfrom ray import tune\n"
                  "from triaccel.search.cluster import init_ray\nfrom triaccel.search.state import read_state\n"
                  "from triaccel.search.tuner import trial_trainable\n"
                  "from triaccel.search.space import parse_space\nst = read_state('f')\n"
                  "sp = parse_space(st['space'], source=st['source'], sha256=st['sha256'])\ninit_ray(None)\n"
                  "tune.Tuner.restore(sys.argv[1], resume_unfinished=True,\n"
                  "                   trainable=trial_trainable(sp, st['shared'], None, Path(sys.argv[1]))).fit()\n")
    r = subprocess.run([sys.executable, "-c", old_resume, str(tune_dir)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=600, env=user_env())
    assert r.returncode == 0, r.stderr[-3000:]
    _, before = runs(tmp_path, "f", role="trial")
    assert len(before) == 1  # Tune planned one of the space's two

    r = cli("resume", "f", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [
        f"triaccel: error: search 'f': its Tune state in {tune_dir} plans 1 of the space's 2 trials and cannot run "
        f"the rest: start the search again under another name (`triaccel search --space space.yaml --name f2`)"]
    _, after = runs(tmp_path, "f", role="trial")
    assert [x.info.run_id for x in after] == [x.info.run_id for x in before]  # nothing ran


@pytest.mark.slow
def test_unreadable_search_state_is_one_line(tmp_path):
    """A search state file left empty (a disk that filled as the search started) or damaged:
    resume and export were a JSONDecodeError traceback, `searches` too (hiding every other search)."""
    d = tmp_path / "mlruns" / "tune" / "broken"
    d.mkdir(parents=True)
    (d / "triaccel_search.json").write_text("")
    line = (f"triaccel: error: search 'broken': its state {d / 'triaccel_search.json'} cannot be read (Expecting "
            f"value: line 1 column 1 (char 0)); move that folder away to reuse the name, or start the search "
            f"under another --name")
    for args in (["resume", "broken"], ["export", "broken", "--out", "t.yaml"]):
        r = cli(*args, cwd=tmp_path, timeout=600)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert r.stderr.strip().splitlines() == [line], args
    assert not (tmp_path / "t.yaml").exists()
    r = cli("searches", cwd=tmp_path, timeout=600)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "broken" in r.stdout and "cannot be read" in r.stdout


@pytest.mark.slow
def test_search_state_on_a_full_disk_takes_no_name(tmp_path):
    """TRIACCEL_TUNE_DIR on a full disk: the state file was left empty, so the name was taken by a
    search that could neither run nor be resumed. Now nothing is left and the same command works
    once there is room. Needs a tmpfs mount (root in a sandbox that allows it)."""
    with_store(tmp_path)  # a copy of the migrated template (the store's creation: elsewhere)
    full = tmp_path / "full"
    full.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        with contextlib.suppress(OSError), open(full / "fill", "wb", buffering=0) as f:
            while True:
                f.write(b"\0" * 4096)
        (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
        env = dict(user_env(), TRIACCEL_TUNE_DIR=str(full / "tune"))
        r = run_search(tmp_path, "--space", "space.yaml", "--name", "f", env=env)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert r.stderr.strip().splitlines() == [
            f"triaccel: error: {full / 'tune' / 'f'}: cannot write the search's state there (No space left on "
            f"device; TRIACCEL_TUNE_DIR chooses another folder)"]
        assert not (full / "tune" / "f").exists()
    finally:
        subprocess.run(["umount", str(full)], capture_output=True)


@pytest.mark.slow
def test_two_searches_of_one_name_at_once_run_one(tmp_path):
    """Two `search --name same` started together both passed the exists check and both ran, into
    one Tune folder and one parent run (4 trials and 2 baselines in a 2-trial search), both exit 0.
    Now the name is claimed exclusively: the second says so in one line and writes nothing."""
    with_store(tmp_path)  # a copy of the migrated template (the store's creation: elsewhere)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(dict(SPACE, trials=1, concurrency=1)))
    procs = [subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--name",
                               "same"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=user_env()) for _ in range(2)]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    assert sorted(rc for rc, _ in results) == [0, 2], [(rc, err[-2000:]) for rc, err in results]
    err = [e for rc, e in results if rc][0]
    assert "Traceback" not in err and err.strip().splitlines() == [
        f"triaccel: error: search 'same' already exists in {tmp_path / 'mlruns' / 'tune' / 'same'} (started "
        f"meanwhile by another process): choose another --name"], err
    _, all_runs = runs(tmp_path, "same")
    assert sorted(r.data.tags["triaccel.role"] for r in all_runs) == ["parent", "trial"]
    assert not list((tmp_path / "mlruns" / "tune" / "same").glob(".*.tmp"))


def test_two_searches_of_one_name_from_two_folders_on_one_store_run_one_the_earliest(tmp_path):
    """A team's two drivers (two Tune folders, one MLflow server) started `search --name n` at once: both
    passed the store's name check and shared one parent run, baselines and ranking. Each now makes its own
    parent run and the earliest keeps the name: here b's, made before a's driver claims, so a is refused in
    one line with nothing of it left (its state, its folder, its parent run, which b does not count as deleted)."""
    from triaccel.errors import ConfigError
    from triaccel.search.results import deleted_count
    from triaccel.search.space import parse_space
    from triaccel.search.state import _first_parent, _new_parent, claim_name, open_store, write_state

    uri = f"sqlite:///{with_store(tmp_path)}/mlruns/mlflow.db"
    space = parse_space(SPACE, source="space.yaml")
    folders = {k: tmp_path / k / "tune" / "n" for k in "ab"}
    for f in folders.values():
        f.mkdir(parents=True)
        write_state("n", f, {"name": "n"}, made=True)
    c, exp = open_store(uri)
    b_parent = _new_parent(c, exp, "n", space, 1)  # b's driver, a moment earlier
    with pytest.raises(ConfigError, match=rf"^the MLflow store {uri} took the name 'n' for another search started at "
                                          rf"the same moment \(its parent run {b_parent}, from another Tune folder "
                                          rf"than {folders['a'].parent}\): choose another --name$"):
        claim_name("n", space, uri, folders["a"], True, 1)
    assert not folders["a"].exists() and (folders["b"] / "triaccel_search.json").is_file()
    assert _first_parent(c, exp, "n").info.run_id == b_parent  # what b's own check finds: it runs
    assert [r.info.run_id for r in runs(tmp_path, "n")[1]] == [b_parent] and deleted_count(c, exp, "n") == 0
    claim_name("m", space, uri, folders["b"], False, 1)  # alone, a name is taken with its parent run
    assert [r.data.tags["triaccel.role"] for r in runs(tmp_path, "m")[1]] == ["parent"]


@pytest.mark.slow
def test_a_lost_tune_state_or_store_is_said_not_merged_or_started_anew(tmp_path):
    """Two of a tester's finds, after one finished search: (1) with mlruns/tune/NAME deleted, a new search of
    that name took the old baseline and parent run and ranked the old trials with its own ('6 finished' of a
    3-trial space); (2) with the store moved away, resume trained into a new, empty store and exited 0."""
    import shutil

    (tmp_path / "space.yaml").write_text(yaml.safe_dump(dict(SPACE, trials=1, concurrency=1)))
    r = cli("search", "--space", "space.yaml", "--name", "g", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    state = (tmp_path / "mlruns" / "tune" / "g" / "triaccel_search.json").read_text()
    assert f"sqlite:///{tmp_path}/mlruns/mlflow.db" in state  # recorded absolute, not against the current folder
    assert json.loads(state)["source_path"] == str(tmp_path / "space.yaml")  # so is the space file
    shutil.rmtree(tmp_path / "mlruns" / "tune" / "g")
    _, before = runs(tmp_path, "g")
    r = cli("search", "--space", "space.yaml", "--name", "g", cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "already holds runs of a search named 'g'" in lines[0], r.stderr
    _, after = runs(tmp_path, "g")
    assert len(after) == len(before) and not (tmp_path / "mlruns" / "tune" / "g" / "triaccel_search.json").exists()

    (tmp_path / "space.yaml").write_text(yaml.safe_dump(dict(SPACE, train=dict(SPACE["train"], epochs=3))))
    proc = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--name", "m"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=user_env(),
                            start_new_session=True)
    import signal

    out = ""
    try:
        for line in proc.stdout:
            out += line
            if line.startswith("trial "):  # one trial in: stop it, as Ctrl-C does
                os.killpg(proc.pid, signal.SIGINT)
                break
        proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out[-2000:]
    (tmp_path / "mlruns" / "mlflow.db").rename(tmp_path / "moved.db")
    r = cli("resume", "m", cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and f"its MLflow store {tmp_path}/mlruns/mlflow.db is gone" \
        in lines[0], r.stderr[-2000:]
    assert not (tmp_path / "mlruns" / "mlflow.db").exists()  # no new, empty store


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
    with_store(tmp_path)  # a copy of the migrated template (the store's creation: elsewhere)
    space = dict(SPACE, trials=2, concurrency=1)  # one to run after the refused resume
    space["train"] = dict(SPACE["train"], epochs=2)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    proc = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--name", "f",
                             "--confirm", "0"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=user_env(), start_new_session=True)
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
    assert len([x for x in all_runs if x.data.tags["triaccel.role"] == "trial"]) == 2


@pytest.mark.slow
def test_a_checkpoint_the_saved_state_names_but_tune_deleted_is_no_failed_trial(tmp_path):
    """Tune deletes a trial's older checkpoint as it registers a new one, and its saved state naming the new one
    reaches storage later (synced in the background): a driver killed in between (kill -9 just after a 'trial
    ... done' line) left a state naming a deleted checkpoint, and resume marked the trial FAILED ("Could not
    recover from checkpoint as it does not exist on storage anymore"). That storage is made here without the
    race: the search stopped (Ctrl-C) with a trial unfinished, its named checkpoint then moved to the next
    index, as Tune leaves it. The trial continues from the checkpoint on storage."""
    with_store(tmp_path)  # a copy of the migrated template (the store's creation: elsewhere)
    space = dict(SPACE, trials=1, concurrency=1)
    space["train"] = dict(SPACE["train"], epochs=6)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    folder = tmp_path / "mlruns" / "tune" / "k"
    proc = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--name", "k",
                             "--confirm", "0"], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=user_env(), start_new_session=True)
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
    assert [x.info.status for x in trials] == ["FINISHED"], [x.data.tags for x in trials]
    for x in trials:  # trained to the end, no epoch logged twice
        steps = sorted(m.step for m in c.get_metric_history(x.info.run_id, "val_acc"))
        assert steps[-1] == 6 and len(steps) == len(set(steps)), steps


@pytest.mark.slow
def test_resume_keeps_the_options_the_search_was_started_with(tmp_path):
    """Resume forgot --confirm: a `search --confirm 1` stopped (Ctrl-C) resumed with no confirm run, and export
    used unconfirmed figures. The options are saved with the search and resume uses them unless given again;
    so does extend, which holds the search's driver lock, and resume continues an extend that was stopped."""
    with_store(tmp_path)  # a copy of the migrated template (the store's creation: elsewhere)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    proc = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--name", "o",
                             "--confirm", "1", "--trials", "1"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=user_env(), start_new_session=True)
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
    # extend: refused while another driver holds the search; run alone, it confirms as the search was started
    import fcntl

    with open(tmp_path / "mlruns" / "tune" / "o" / "driver.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        r = cli("extend", "o", "--trials", "1", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith(
        "triaccel: error: search 'o' is being run by"), r.stderr[-2000:]
    assert r.stderr.strip().endswith("then `triaccel extend o --trials N`"), r.stderr[-2000:]  # not resume: extend
    r = cli("extend", "o", "--trials", "1", cwd=tmp_path)
    assert r.returncode == 0 and "confirm " in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    assert sorted(x.info.status for x in runs(tmp_path, "o")[1] if x.data.tags["triaccel.role"] == "trial") == [
        "FINISHED"] * 2
    # an extend stopped by Ctrl-C after its first trial: `resume` (as the stop's line says) runs the added trials
    # left, not the finished search's own folder again, and leaves no run RUNNING
    proc = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "extend", "o", "--trials", "3"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=user_env(),
                            start_new_session=True)
    try:
        for line in proc.stdout:
            if line.startswith("trial"):  # the first added trial has ended; the others run
                os.killpg(proc.pid, signal.SIGINT)
                break
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and "`triaccel resume o` continues it" in err, err[-2000:]
    r = cli("searches", cwd=tmp_path)  # out of the search's one trial, the 1 and the 3 added
    assert next(ln for ln in r.stdout.splitlines() if ln.startswith("o ")).split()[3].endswith("/5"), r.stdout
    r = cli("resume", "o", cwd=tmp_path)
    assert r.returncode == 0 and "extend-2" in r.stdout.splitlines()[0], r.stdout[-2000:] + r.stderr[-2000:]
    trials = [x.info.status for x in runs(tmp_path, "o")[1] if x.data.tags["triaccel.role"] == "trial"]
    assert trials.count("FINISHED") == 5 and "RUNNING" not in trials, trials




@pytest.mark.slow
@pytest.mark.parametrize("uri,why", [
    ("foo://x", "unknown MLflow store scheme 'foo' in foo://x"),
    ("http://127.0.0.1:{port}", "no MLflow server answers at http://127.0.0.1:{port}"),
    ("sqlite:///space.yaml/mlflow.db",
     "cannot use the MLflow store sqlite:///space.yaml/mlflow.db (space.yaml is a file, not a folder)"),
])
def test_unusable_tracking_store_is_one_line_and_takes_no_search_name(tmp_path, uri, why):
    """MLFLOW_TRACKING_URI that cannot be used: one line naming it, exit 2, before the search writes
    its state (it was written first, so the name was taken by a search that never ran; a sqlite
    path under a file was a FileExistsError traceback)."""
    port = free_port()
    uri, why = uri.format(port=port), why.format(port=port)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    r = run_search(tmp_path, "--space", "space.yaml", env=dict(user_env(), MLFLOW_TRACKING_URI=uri))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"triaccel: error: MLFLOW_TRACKING_URI: {why}"), lines
    assert not (tmp_path / "mlruns").exists()


@pytest.mark.slow
def test_store_filling_mid_search_is_one_line_and_resume_finishes(tmp_path):
    """The MLflow store's disk fills while trials run: the search ended in a traceback of MLflow's
    (exit 1). Now its last line says the disk is full and how to continue, exit 2; with room again
    `resume` finishes it. Needs a tmpfs mount (root in a sandbox that allows it)."""
    import signal

    full = tmp_path / "full"
    full.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(full)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        space = dict(SPACE, trials=1, concurrency=1)
        space["train"] = dict(SPACE["train"], epochs=6)
        (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
        env = dict(user_env(), MLFLOW_TRACKING_URI=f"sqlite:///{full}/mlflow.db")
        proc = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--name",
                                 "d"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and proc.poll() is None and not any(
                    f.stat().st_size for f in (tmp_path / "mlruns" / "tune" / "d").glob("*/result.json")):
                time.sleep(0.1)
            assert proc.poll() is None, "the search ended before its trials reported"
            with contextlib.suppress(OSError), open(full / "fill", "wb", buffering=0) as f:
                while True:
                    f.write(b"\0" * 4096)
            out, err = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 2, (proc.returncode, err[-3000:])
        assert err.strip().splitlines()[-1] == (
            "triaccel: error: search 'd' stopped: a disk it writes is full (database or disk is full); free space, "
            "then `triaccel resume d` continues it"), err[-3000:]
        (full / "fill").unlink()
        r = subprocess.run([sys.executable, "-m", "triaccel.cli", "resume", "d"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=600, env=env)
        assert r.returncode == 0 and "export the best" in r.stdout, r.stderr[-3000:]
    finally:
        subprocess.run(["umount", str(full)], capture_output=True)


@pytest.mark.slow
def test_an_mlflow_server_that_dies_mid_search_is_one_line_in_seconds(tmp_path):
    """A real `mlflow server` (through `triaccel ui`), killed once a trial has reported: the search hung for
    8.5 minutes in MLflow's retries, then a 260-line traceback (a tester's report). Now it stops within
    seconds with one line saying how to continue."""
    import signal
    import urllib.request

    port = free_port()
    env = dict(user_env(), MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/srv.db")
    server = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "ui", "--port", str(port)], cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    proc = None
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
                break
            time.sleep(0.5)
        space = dict(SPACE, trials=4, concurrency=1)
        space["train"] = dict(SPACE["train"], epochs=3)
        (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
        proc = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--name",
                                 "s"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(user_env(), MLFLOW_TRACKING_URI=f"http://127.0.0.1:{port}"),
                                start_new_session=True)
        out = ""
        for line in proc.stdout:
            out += line
            if line.startswith("trial "):
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(timeout=30)
                t0 = time.monotonic()
                break
        assert "trial " in out, out[-2000:] + proc.stderr.read()[-2000:]
        rest, err = proc.communicate(timeout=600)
        took = time.monotonic() - t0
    finally:
        for p in (server, proc):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    lines = err.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in err, err[-3000:]
    assert lines[-1].startswith(f"triaccel: error: search 's' stopped: the MLflow server at http://127.0.0.1:{port} "
                                f"stopped answering") and "`triaccel resume s` continues" in lines[-1], err[-3000:]
    assert took < 200, took  # MLflow's own retries took about 4 minutes a call


def test_a_damaged_tune_state_is_refused_in_one_line_not_restored_into_a_fresh_plan(tmp_path, monkeypatch):
    """Tune met a truncated experiment state with its traceback, then ran a fresh plan and the search
    ended FINISHED with trials missing. The search's state and an extension's are read before resume
    restores either."""
    from triaccel.errors import TriAccelError
    from triaccel.search.space import parse_space
    from triaccel.search.tuner import restorable, unfinished_extension

    monkeypatch.setenv("TRIACCEL_TUNE_DIR", str(tmp_path))
    space = parse_space(dict(SPACE, name="d"), source="s.yaml")
    for folder in (tmp_path / "d", tmp_path / "d" / "extend-1"):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "experiment_state-2026-12-05_04-00-00.json").write_text('{"trial_data": [["{\\"trial_id')
    with pytest.raises(TriAccelError, match=r"^search 'd': its Tune state .*/d/experiment_state-2026-12-05_04-00-00"
                                            r"\.json cannot be read \(.*\), so resume cannot continue it"):
        restorable("d", space)
    with pytest.raises(TriAccelError, match=r"extend-1/experiment_state-.*cannot be read"):
        unfinished_extension("d")
    (tmp_path / "d" / "extend-1" / "experiment_state-2026-12-05_04-00-00.json").unlink()
    assert unfinished_extension("d") is None  # an extension with no saved state: nothing to continue


def test_an_extend_stopped_before_tune_saved_anything_is_found_for_resume_to_name(tmp_path, monkeypatch):
    """An extend stopped before its first trial started left a folder without Tune's state: resume closed
    the search without the added trials and said nothing. `unstarted_extension` finds it (the newest
    only; an extend that Tune saved, or a stray folder, is not one)."""
    from triaccel.search.tuner import unstarted_extension

    monkeypatch.setenv("TRIACCEL_TUNE_DIR", str(tmp_path))
    (tmp_path / "d").mkdir()
    assert unstarted_extension("d") is None  # never extended
    for i in (1, 2, 10):
        (tmp_path / "d" / f"extend-{i}").mkdir()
    (tmp_path / "d" / "extend-x").mkdir()  # not one of extend's folders
    for i in (1, 2):
        (tmp_path / "d" / f"extend-{i}" / "experiment_state-2026-12-05_04-00-00.json").write_text("{}")
    assert unstarted_extension("d") == tmp_path / "d" / "extend-10"  # by number: 10 is newer than 2
    (tmp_path / "d" / "extend-10" / "experiment_state-2026-12-05_05-00-00.json").write_text("{}")
    assert unstarted_extension("d") is None


def test_resume_from_another_folder_compares_the_space_file_the_search_started_from(tmp_path, monkeypatch, capsys):
    """A teammate's `resume NAME --storage ...` from their own folder read the typed relative path (space.yaml)
    against that folder: a false 'has changed' note for their different file, and real edits to the search's
    own file unsaid. The state records the file's absolute path."""
    import hashlib

    from triaccel.search.state import note_space_edits

    a, b = tmp_path / "alice", tmp_path / "bob"
    for d, seed in ((a, 0), (b, 7)):
        d.mkdir()
        (d / "space.yaml").write_text(yaml.safe_dump(dict(SPACE, seed=seed)))
    state = {"source": "space.yaml", "source_path": str(a / "space.yaml"),
             "sha256": hashlib.sha256((a / "space.yaml").read_bytes()).hexdigest()}
    monkeypatch.chdir(b)
    note_space_edits(state)
    assert capsys.readouterr().err == ""
    (a / "space.yaml").write_text((a / "space.yaml").read_text() + "# edited\n")
    note_space_edits(state)
    assert f"note: {a / 'space.yaml'} has changed since the search started" in capsys.readouterr().err


def test_a_printed_command_names_the_storage_the_search_is_in(tmp_path, monkeypatch):
    """A teammate's search in a shared folder (--storage): the lines it printed (`triaccel export NAME`, `triaccel
    resume NAME`) ran against the teammate's own mlruns/tune and failed ('no search named ...')."""
    from triaccel.search.state import again

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRIACCEL_TUNE_DIR", raising=False)
    assert again("resume", "x") == "triaccel resume x"
    monkeypatch.setenv("TRIACCEL_TUNE_DIR", str(tmp_path / "team share"))  # what --storage sets
    assert again("export", "x", "--out tuned.yaml") == f"triaccel export x --storage '{tmp_path}/team share' --out tuned.yaml"
    monkeypatch.setenv("TRIACCEL_TUNE_DIR", "mlruns/tune")  # the default, spelled out: nothing to add
    assert again("resume", "x") == "triaccel resume x"


def test_the_listing_tells_a_running_search_from_a_stopped_one_by_its_driver_lock(tmp_path):
    """`triaccel searches` showed a stopped search as it showed a running one (0/4 … baseline): a teammate could
    not tell which needs `resume`. The driver lock decides, as it does for a second driver: a record left by a
    driver that died (kill -9, another node's) names no running search. The listing's probe, a shared lock
    for an instant, must not refuse a driver that starts then: the driver tries for a second."""
    import fcntl
    import json
    import os
    import socket
    import subprocess
    import sys
    import threading
    import time

    from triaccel.search.lock import LOCK_FILE, driver_lock, running_driver

    assert running_driver(tmp_path) is None  # no lock file
    with driver_lock("s", tmp_path, "search"):
        d = running_driver(tmp_path)
        assert (d["pid"], d["host"], d["command"]) == (os.getpid(), socket.gethostname(), "search")
    assert running_driver(tmp_path) is None  # released by a process that lives on (a notebook): no driver
    # the record of a driver killed before it could clear it: pid 1 runs, another node cannot be seen; no lock
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": socket.gethostname(), "command": "search",
                                                  "since": "2026-01-01T00:00:00"}))
    assert running_driver(tmp_path) is None
    # a driver in another process
    code = ("import sys; from pathlib import Path; from triaccel.search.lock import driver_lock\n"
            "with driver_lock('s', Path(sys.argv[1]), 'resume'):\n    print('held', flush=True); sys.stdin.readline()\n")
    other = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        assert running_driver(tmp_path)["pid"] == other.pid and running_driver(tmp_path)["command"] == "resume"
    finally:
        other.communicate("\n", timeout=60)
    assert running_driver(tmp_path) is None
    # a listing's probe held while a driver starts: the driver waits it out
    fd = os.open(tmp_path / LOCK_FILE, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    threading.Thread(target=lambda: (time.sleep(0.3), os.close(fd)), daemon=True).start()
    with driver_lock("s", tmp_path, "search"):
        assert running_driver(tmp_path)["command"] == "search"


def test_a_search_started_from_python_is_continued_from_python_in_every_hint(tmp_path, monkeypatch):
    """A search started from Python with functions that have no import path said `triaccel resume NAME`
    continues it, which refuses it (the CLI does not know those functions): its hints name the Python call,
    with every function to hand again. A search with import paths keeps the CLI's command."""
    import json

    from triaccel.search.state import again

    monkeypatch.setenv("TRIACCEL_TUNE_DIR", str(tmp_path / "tune"))
    for name, callables in (("nb", {"model.class_path": "callable:make_model", "data.class_path": "callable:data.make"}),
                            ("pkg", {})):
        (tmp_path / "tune" / name).mkdir(parents=True)
        (tmp_path / "tune" / name / "triaccel_search.json").write_text(json.dumps(
            {"space": {"name": name, "trials": 2, "train": {}}, "source": name, "sha256": "0" * 64,
             "tracking_uri": f"sqlite:///{tmp_path}/none.db", "callables": callables}))
    assert again("resume", "nb") == "triaccel.resume('nb', model=make_model, data=make) from Python"
    assert again("extend", "nb", "--trials N") == "triaccel.extend('nb', TRIALS, model=make_model, data=make) from Python"
    assert again("resume", "nb", "--address local") == \
        "triaccel.resume('nb', model=make_model, data=make, address='local') from Python"  # the cluster is gone
    assert again("extend", "nb", "--trials 4 --confirm 0") == \
        "triaccel.extend('nb', 4, model=make_model, data=make, confirm=0) from Python"
    assert again("export", "nb", "--out tuned.yaml").startswith("triaccel export nb --storage ")
    assert again("resume", "pkg").startswith("triaccel resume pkg --storage ")
    assert again("resume", "none_yet").startswith("triaccel resume none_yet")  # no state: the CLI's form
