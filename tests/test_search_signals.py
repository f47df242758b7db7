"""Signals and stops (search/signals.py): Ctrl-C and SIGTERM in the baselines, the trials and the
confirm runs, a Ctrl-C a library wraps, a SIGTERM whose exception Python drops (it landed in a
weakref callback), a full disk met while stopping; resume finishes what was stopped. Real
subprocesses, real local Ray, a real sqlite MLflow store, real signals."""
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
import yaml

from _harness import SPACE, cli, runs, user_env, with_store


def _signal_when(tmp_path, name, space, ready, sig=signal.SIGTERM):
    """Start a search and, once ``ready()`` holds, stop it: SIGTERM to its process alone (as `kill PID`
    or a scheduler sends it), SIGINT to its process group (as Ctrl-C in a terminal sends it). Returns
    (returncode, stdout, stderr)."""
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    proc = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--name", name],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=user_env(),
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None and not ready():
            time.sleep(0.05)
        assert proc.poll() is None, "the search ended before the moment to stop it"
        os.killpg(proc.pid, sig) if sig == signal.SIGINT else proc.send_signal(sig)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out, err


def _baseline_epoch_in(tmp_path):
    """A test of whether the search's first baseline epoch is in its store."""
    def ready():
        try:
            with contextlib.closing(sqlite3.connect(tmp_path / "mlruns" / "mlflow.db")) as db:
                return bool(db.execute("select count(*) from metrics where key = 'val_acc'").fetchone()[0])
        except sqlite3.Error:
            return False
    return ready


def _stopped_in_the_baselines(tmp_path, name, rc, want_rc, out, err):
    """A search stopped while its baseline trained: the stop's exit status and one line naming `resume`,
    its baseline and parent runs KILLED."""
    assert rc == want_rc and "Traceback" not in err, (rc, out[-2000:], err[-2000:])
    assert err.strip().splitlines()[-1] == (f"triaccel: interrupted: search '{name}' stopped before it finished: "
                                            f"`triaccel resume {name}` continues it")
    _, all_runs = runs(tmp_path, name)
    assert sorted((r.data.tags["triaccel.role"], r.info.status) for r in all_runs) == [
        ("baseline", "KILLED"), ("parent", "KILLED")]


def _resumed_from_the_baselines(tmp_path, name):
    """`resume` of a search stopped in its baselines trains the baseline again and runs the trials."""
    r = cli("resume", name, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    _, all_runs = runs(tmp_path, name)
    assert sorted((r.data.tags["triaccel.role"], r.info.status) for r in all_runs) == [
        ("baseline", "FINISHED"), ("baseline", "KILLED"), ("parent", "FINISHED"), ("trial", "FINISHED"),
        ("trial", "FINISHED")]


@pytest.mark.slow
def test_ctrl_c_mid_search_is_no_finished_search_and_resume_finishes_it(tmp_path):
    """SIGINT to the process group, as Ctrl-C in a terminal sends it, once the first epoch is in:
    Tune stops the trials and returns as if the search had finished; the search must say it
    stopped (exit 130, how to resume), close its runs KILLED, and `resume` must finish it."""
    with_store(tmp_path)  # a copy of the migrated template (the store's creation: elsewhere)
    import re
    import signal

    space = dict(SPACE, trials=4, concurrency=2)  # two trials still to start when the first epoch is in
    space["train"] = dict(SPACE["train"], epochs=3)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    proc = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--name", "i"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=user_env(),
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if any(f.stat().st_size for f in (tmp_path / "mlruns" / "tune" / "i").glob("*/result.json")):
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the search ended before the first epoch was reported"
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    assert "Traceback" not in err and "export the best" not in out
    assert re.fullmatch(r"triaccel: interrupted: search 'i' stopped before it finished \([1-4] of 4 trials left\): "
                        r"`triaccel resume i` continues it", err.strip().splitlines()[-1]), err[-2000:]
    _, all_runs = runs(tmp_path, "i")
    parent = [r for r in all_runs if r.data.tags["triaccel.role"] == "parent"]
    assert [r.info.status for r in parent] == ["KILLED"]
    assert not [r for r in all_runs if r.info.status == "RUNNING"]

    before = [ln for ln in out.splitlines() if ln.startswith("trial ")]
    # the listing counts as done every trial that ended, ASHA's early stops included (it read 0/2 for a
    # stopped search whose one ended trial ASHA had stopped); the trials Ctrl-C ended are not done
    r = cli("searches", cwd=tmp_path)
    row = next(ln.split() for ln in r.stdout.splitlines() if ln.startswith("i "))
    assert r.returncode == 0 and f"{len(before)}/4" in row, (before, r.stdout)
    # and says nothing runs it now: a teammate sees which searches need a resume
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("i "))
    assert line.endswith("stopped: `triaccel resume i` continues it"), line
    r = cli("resume", "i", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "export the best" in r.stdout
    after = [ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("trial ")]
    # the resumed lines go on from the trials the first run finished, up to 4 of 4
    assert after == [f"{i}/4" for i in range(len(before) + 1, 5)], (before, after)
    _, all_runs = runs(tmp_path, "i")
    trials = [r for r in all_runs if r.data.tags["triaccel.role"] == "trial"]
    assert len(trials) == 4 and len({t.data.tags["triaccel.trial_id"] for t in trials}) == 4
    assert all(r.info.status == "FINISHED" for r in all_runs)  # the parent included


# a baseline at B=8: seconds of it to stop in; three of its epochs left after the first is in
BASELINE_SPACE = dict(SPACE, baseline={"batch_sizes": [8]}, train=dict(SPACE["train"], epochs=4))


@pytest.mark.slow
def test_ctrl_c_in_the_baselines_closes_the_runs_and_names_resume(tmp_path):
    """Ctrl-C while the baselines train (before Tune holds any state): exit 130, runs KILLED, the line
    naming `resume`. The resume from that state is the SIGTERM case's: the two signals reach one handler."""
    with_store(tmp_path)  # a copy of the migrated template (the store's creation: elsewhere)
    rc, out, err = _signal_when(tmp_path, "ib", BASELINE_SPACE, _baseline_epoch_in(tmp_path), signal.SIGINT)
    _stopped_in_the_baselines(tmp_path, "ib", rc, 130, out, err)


@pytest.mark.slow
def test_sigterm_in_the_baselines_closes_the_runs_and_resume_finishes(tmp_path):
    """SIGTERM while a baseline trains: Python died at once (exit -15), the parent and baseline
    runs left RUNNING in MLflow. Now as Ctrl-C: exit 143, the line saying how to resume, runs
    KILLED; `resume` finishes the search."""
    with_store(tmp_path)  # a copy of the migrated template (the store's creation: elsewhere)
    rc, out, err = _signal_when(tmp_path, "tb", BASELINE_SPACE, _baseline_epoch_in(tmp_path))
    _stopped_in_the_baselines(tmp_path, "tb", rc, 143, out, err)
    _resumed_from_the_baselines(tmp_path, "tb")


@pytest.mark.slow
def test_sigterm_in_the_trials_is_no_abort_and_closes_the_runs(tmp_path):
    """SIGTERM once trials report: Ray's handler aborted the driver with a stack dump (exit 134),
    the parent run left RUNNING. Now Tune stops as for Ctrl-C: exit 143, one line, runs KILLED.
    The resume from a stop in the trials is the Ctrl-C case's (one handler for both signals)."""
    with_store(tmp_path)  # a copy of the migrated template (the store's creation: elsewhere)
    space = dict(SPACE)
    space["train"] = dict(SPACE["train"], epochs=4)
    rc, out, err = _signal_when(tmp_path, "tt", space, lambda: any(
        f.stat().st_size for f in (tmp_path / "mlruns" / "tune" / "tt").glob("*/result.json")))
    assert rc == 143 and "SIGTERM received" not in err and "Traceback" not in err, (rc, out[-2000:], err[-2000:])
    assert err.strip().splitlines()[-1].startswith("triaccel: interrupted: search 'tt' stopped before it finished (")
    _, all_runs = runs(tmp_path, "tt")
    assert [r.info.status for r in all_runs if r.data.tags["triaccel.role"] == "parent"] == ["KILLED"]
    assert not [r for r in all_runs if r.info.status == "RUNNING"]


@pytest.mark.slow
def test_ctrl_c_wrapped_by_a_library_is_still_a_stopped_search(tmp_path):
    """Ctrl-C (or SIGTERM, which the CLI maps to it) that lands inside MLflow's SQL layer reaches
    the search wrapped in the library's own error: it is still a stopped search (its runs closed
    KILLED, the line naming `resume`), not a traceback with runs left RUNNING (train did that once
    in CI; the search had the same path). A real sqlite store."""
    from triaccel.errors import Interrupted
    from triaccel.search import signals, state
    from triaccel.search.callbacks import TAG_SEARCH

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    c, exp = state.open_store(uri)
    run = c.create_run(exp, tags={TAG_SEARCH: "w"}).info.run_id
    other = c.create_run(exp, tags={TAG_SEARCH: "someone-else"}).info.run_id
    with pytest.raises(Interrupted, match=r"search 'w' stopped before it finished: `triaccel resume w`"):
        with signals.interruptible("w", uri):
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt as e:  # what sqlalchemy does with an interrupt mid-statement
                raise RuntimeError("(sqlite3.OperationalError) interrupted") from e
    assert c.get_run(run).info.status == "KILLED"
    assert c.get_run(other).info.status == "RUNNING"
    run = c.create_run(exp, tags={TAG_SEARCH: "w"}).info.run_id
    from triaccel.errors import TriAccelError

    # any other error is a failed search, not a stop: one line naming the cause and `resume`, its runs KILLED
    with pytest.raises(TriAccelError, match=r"search 'w' stopped: not an interrupt; once its cause is fixed, `triaccel resume w` "
                                                 r"continues it") as e:
        with signals.interruptible("w", uri):
            raise RuntimeError("not an interrupt")
    assert not isinstance(e.value, Interrupted) and c.get_run(run).info.status == "KILLED"


@pytest.mark.slow
def test_a_full_disk_met_while_stopping_is_said_as_full(tmp_path):
    """A full disk that a Ctrl-C's clean-up ran into (Tune saving its state after the interrupt:
    the OSError's context is the KeyboardInterrupt) is said as a full disk, as before a wrapped
    interrupt counted as a stop: reported as stopped it hid the disk, and closing the runs wrote to
    the full store."""
    import errno

    from triaccel.errors import Interrupted, TriAccelError
    from triaccel.search import signals, state

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    state.open_store(uri)
    with pytest.raises(TriAccelError, match=r"search 'w' stopped: a disk it writes is full") as ei:
        with signals.interruptible("w", uri):
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                raise OSError(errno.ENOSPC, "No space left on device")
    assert not isinstance(ei.value, Interrupted)


@pytest.mark.slow
@pytest.mark.parametrize("sig,rc", [("SIGINT", 130)])  # SIGTERM reaches the same handler (errors.stop_on_sigterm);
def test_a_signal_in_the_confirm_runs_stops_the_search(tmp_path, sig, rc):  # it passed too, and costs CI a minute
    """Tune leaves its own SIGINT handler installed after fit() returns: Ctrl-C or SIGTERM during the confirm
    runs set an event nobody read, and the search ran on to its summary, a FINISHED parent and exit 0
    (a tester's report). Now: the exit status of a stop, runs closed KILLED, and resume finishes it."""
    import signal

    with_store(tmp_path)  # a copy of the migrated template (the store's creation: elsewhere)
    space = dict(SPACE, trials=1, concurrency=1)
    # a confirm run long enough to be interrupted: the signal follows the line at once (flushed), and
    # the run's own start-up (its process, data, model) is seconds before its first step
    space["train"] = dict(SPACE["train"], epochs=8)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    proc = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--name", "c",
                             "--confirm", "1"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=user_env(), start_new_session=True)
    out = ""
    try:
        for line in proc.stdout:  # the driver prints this line, then trains the confirm run
            out += line
            if "re-running alone" in line:  # Ctrl-C reaches the process group; `kill PID` the driver alone
                os.killpg(proc.pid, signal.SIGINT) if sig == "SIGINT" else proc.send_signal(signal.SIGTERM)
                break
        rest, err = proc.communicate(timeout=600)
        out += rest
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "re-running alone" in out, out[-2000:]
    assert proc.returncode == rc, out[-2000:] + err[-2000:]
    assert "Traceback" not in err and "export the best" not in out, err[-2000:]
    assert "`triaccel resume c` continues it" in err.strip().splitlines()[-1], err[-2000:]
    _, all_runs = runs(tmp_path, "c")
    assert [r.info.status for r in all_runs if r.data.tags["triaccel.role"] == "parent"] == ["KILLED"]
    assert not [r for r in all_runs if r.info.status == "RUNNING"]

    # an export of the stopped search says so, in its output and its provenance (it said nothing)
    r = cli("export", "c", "--out", "early.yaml", cwd=tmp_path)
    assert r.returncode == 0 and "search 'c' has not finished" in r.stderr, r.stderr[-2000:]
    assert yaml.safe_load((tmp_path / "early.yaml").read_text())["provenance"]["search_finished"] is False
    # resume runs the space it saved, and says so when the file has changed since (edits were ignored silently)
    (tmp_path / "space.yaml").write_text((tmp_path / "space.yaml").read_text() + "# edited\n")
    r = cli("resume", "c", "--confirm", "1", cwd=tmp_path)
    assert r.returncode == 0 and "export the best" in r.stdout, r.stderr[-3000:]
    assert "space.yaml has changed since the search started" in r.stderr, r.stderr[-2000:]
    _, all_runs = runs(tmp_path, "c")
    assert [r.info.status for r in all_runs if r.data.tags["triaccel.role"] == "parent"] == ["FINISHED"]
    assert [r.info.status for r in all_runs if r.data.tags["triaccel.role"] == "confirm"].count("FINISHED") == 1
    r = cli("export", "c", "--out", "done.yaml", cwd=tmp_path)
    assert r.returncode == 0 and "has not finished" not in r.stderr, r.stderr[-2000:]
    assert yaml.safe_load((tmp_path / "done.yaml").read_text())["provenance"]["search_finished"] is True


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

    monkeypatch.setattr(tuner, "left_to_run", lambda name, planned, path=None: 1)
    # the saved state lags: one trial RUNNING
    tuner.check_finished("s", 3, stopped=False)  # no signal: Tune's loop ended because every trial had
    with pytest.raises(Interrupted, match="1 of 3 trials left"):
        tuner.check_finished("s", 3, stopped=True)
    with pytest.raises(Interrupted):  # not known (TUNE_DISABLE_SIGINT_HANDLER): the saved state decides
        tuner.check_finished("s", 3, stopped=None)
    monkeypatch.setenv("TUNE_DISABLE_SIGINT_HANDLER", "1")
    assert signals.tune_saw_a_signal(signal.default_int_handler) is None


# the user's model: at its 5th training forward in the search's driver (a baseline), SIGTERM to its own
# process from inside a weakref callback, once (a marker file: not again in the trials or on resume)
MODEL = '''
import os, signal, weakref
import torch.nn as nn


class Net(nn.Module):
    def __init__(self, num_classes, in_channels, image_size):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size ** 2, 32), nn.ReLU(),
                                  nn.Linear(32, num_classes))
        self.calls = 0

    def forward(self, x):
        self.calls += self.training
        if self.training and self.calls == 5 and not os.path.exists("signalled"):
            open("signalled", "w").close()

            class Thing:
                pass

            def callback(ref):
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(100_000):
                    pass

            thing = Thing()
            self.ref = weakref.ref(thing, callback)
            del thing
        return self.body(x)


def net(num_classes, in_channels, image_size):
    return Net(num_classes, in_channels, image_size)
'''


@pytest.mark.slow
def test_a_search_stops_in_its_baselines_when_the_sigterm_lands_in_a_weakref_callback(tmp_path):
    """`triaccel search` gets SIGTERM while a weakref callback runs in its first baseline: the exception
    is dropped, yet the search stops there (exit 143, the line naming resume, its runs KILLED) and
    trains neither the rest of that baseline nor the next one. The dropped exception prints no
    traceback ("Exception ignored in ..."): the one line is all the user reads."""
    with_store(tmp_path)
    (tmp_path / "stopmodel.py").write_text(MODEL)
    space = dict(SPACE, name="w", baseline={"batch_sizes": [8, 16]})
    space["train"] = dict(SPACE["train"], epochs=3, model={"class_path": "stopmodel.net"})
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    r = subprocess.run([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml"], cwd=tmp_path,
                       capture_output=True, text=True, env=user_env(), timeout=600)
    assert (tmp_path / "signalled").exists(), r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "Exception ignored in" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 143, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    assert r.stderr.strip().splitlines()[-1] == ("triaccel: interrupted: search 'w' stopped before it finished: "
                                                 "`triaccel resume w` continues it")
    _, all_runs = runs(tmp_path, "w")
    assert sorted((r.data.tags["triaccel.role"], r.info.status) for r in all_runs) == [
        ("baseline", "KILLED"), ("parent", "KILLED")]
    with contextlib.closing(sqlite3.connect(tmp_path / "mlruns" / "mlflow.db")) as db:
        epochs = db.execute("select count(*) from metrics where key = 'val_acc'").fetchone()[0]
    assert epochs == 0  # the 5th step of 3 epochs' first: no epoch finished after the stop
