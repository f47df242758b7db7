"""The search service fed what users feed it: an address where no cluster runs, list-valued
choices, Ctrl-C mid-search. Real subprocesses, real local Ray, a real sqlite MLflow store."""
import contextlib
import os
import socket
import subprocess
import sys
import time

import pytest
import yaml

pytestmark = pytest.mark.slow

SPACE = {
    "name": "h", "objective": "efficiency", "trials": 2, "concurrency": 2, "scheduler": "none", "sampler": "random",
    "seed": 0, "baseline": {"batch_sizes": []},
    "train": {"mode": "triaccel", "epochs": 1, "batch_size": 64, "device": "cpu", "eval_batch_size": 512,
              "data": {"name": "digits", "val_fraction": 0.15, "crop_padding": 1},
              "model": {"name": "small_cnn", "width": 8}, "optim": {"lr": 0.05, "warmup_epochs": 1},
              "triaccel": {"control_every": 5, "curvature": {"method": "fisher", "every": 10},
                           "batch": {"budget_gb": 0.004, "min_batch": 16}}},
    "params": {"triaccel.precision.tau_low": {"distribution": "loguniform", "low": 1e-8, "high": 1e-4}},
}


def _env():
    # one intra-op thread: on a shared 2-core machine a busy neighbour stalls torch's second thread
    # and the driver's in-process baselines slow down a hundredfold (the Ray trials use one already)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("TRIACCEL_TUNE_DIR", None)
    return env


def cli(*args, cwd, timeout=600):
    return subprocess.run([sys.executable, "-m", "triaccel.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=_env())


def runs(d, name, role=None):
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=f"sqlite:///{d}/mlruns/mlflow.db")
    exp = c.get_experiment_by_name("triaccel-search")
    flt = f"tags.`triaccel.search` = '{name}'" + (f" and tags.`triaccel.role` = '{role}'" if role else "")
    return c, c.search_runs([exp.experiment_id], filter_string=flt, max_results=1000)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens there


@pytest.mark.parametrize("address,why", [
    ("127.0.0.1:{port}", "cannot join a Ray cluster there (nothing answers on 127.0.0.1:{port}: Connection refused)"),
    ("ray://127.0.0.1:{port}", "cannot join a Ray cluster there (nothing answers on 127.0.0.1:{port}: "
                               "Connection refused)"),
    ("headnode", "expected HOST:PORT, ray://HOST:PORT or auto"),
])
def test_address_where_no_cluster_answers_fails_in_seconds_and_writes_nothing(tmp_path, address, why):
    port = _closed_port()
    address, why = address.format(port=port), why.format(port=port)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    t0 = time.monotonic()
    r = cli("search", "--space", "space.yaml", "--address", address, cwd=tmp_path, timeout=600)
    # ray.init alone retried such an address for minutes (over 200 s); 90 s leaves room for the
    # imports of a process started beside two other test processes on a loaded 2-core machine
    assert time.monotonic() - t0 < 90
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [f"triaccel: error: --address {address}: {why}"]
    assert not (tmp_path / "mlruns").exists()  # no search state: the same command works once the cluster runs


def test_address_where_something_else_answers_fails_in_seconds(tmp_path):
    """A port that accepts connections but is not Ray (here a real HTTP server): ray.init retried it
    for minutes; the search says so in one line, before anything is written."""
    port = _closed_port()
    srv = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "0.0.0.0"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            time.sleep(0.2)
        (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
        t0 = time.monotonic()
        r = cli("search", "--space", "space.yaml", "--address", f"127.0.0.1:{port}", cwd=tmp_path, timeout=600)
        assert time.monotonic() - t0 < 90  # as above: ray.init retried for minutes
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert r.stderr.strip().splitlines() == [
            f"triaccel: error: --address 127.0.0.1:{port}: cannot join a Ray cluster there (something answers on "
            f"127.0.0.1:{port}, but not Ray: no gRPC server)"]
        assert not (tmp_path / "mlruns").exists()
    finally:
        srv.kill()
        srv.wait()


@pytest.mark.ray_cluster
def test_address_auto_without_a_cluster_fails_before_the_baselines(tmp_path):
    """--address auto where no `ray start` cluster runs: one line, before the baselines train (it used
    to fail only after them, in ray.init)."""
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--address", "auto"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert time.monotonic() - t0 < 90  # as above: ray.init retried for minutes
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    (line,) = r.stderr.strip().splitlines()
    # no cluster at all, or a stale record of one that has stopped: either way, said at once
    assert line.startswith("triaccel: error: --address auto") and (
        "no running Ray cluster found" in line or "nothing answers" in line), line
    assert not (tmp_path / "mlruns").exists()  # no baseline ran, no state written


def test_list_valued_choices_search_end_to_end(tmp_path):
    """optim.betas is a pair, so a categorical over it has list choices: the search runs, the summary
    and the parent's plot show them, the parent run finishes and the export trains as it is."""
    from triaccel.config import load_config

    betas = [[0.9, 0.999], [0.8, 0.99]]
    space = dict(SPACE, trials=3, params={**SPACE["params"],
                                          "optim.betas": {"distribution": "categorical", "choices": betas}})
    space["train"] = dict(SPACE["train"], optim={"name": "adamw", "lr": 0.005, "warmup_epochs": 1})
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    r = cli("search", "--space", "space.yaml", "--name", "b", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "UserWarning" not in r.stderr
    table = r.stdout[r.stdout.index("\nsearch 'b':") + 1:]
    assert "betas" in table.splitlines()[1] and any(str(b) in table for b in betas)
    c, parents = runs(tmp_path, "b", role="parent")
    assert [p.info.status for p in parents] == ["FINISHED"]
    assert "trials_vs_params.png" in {a.path for a in c.list_artifacts(parents[0].info.run_id)}
    _, trials = runs(tmp_path, "b", role="trial")
    assert len(trials) == 3 and all(t.info.status == "FINISHED" for t in trials)
    import json

    assert all(json.loads(t.data.tags["triaccel.values"])["optim.betas"] in betas for t in trials)
    r = cli("export", "b", "--out", "tuned.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert list(load_config(tmp_path / "tuned.yaml").optim.betas) in betas


def test_ctrl_c_mid_search_is_no_finished_search_and_resume_finishes_it(tmp_path):
    """SIGINT to the process group, as Ctrl-C in a terminal sends it, once the first epoch is in:
    Tune stops the trials and returns as if the search had finished; the search must say it
    stopped (exit 130, how to resume), close its runs KILLED, and `resume` must finish it."""
    import re
    import signal

    space = dict(SPACE, trials=4, concurrency=2)  # two trials still to start when the first epoch is in
    space["train"] = dict(SPACE["train"], epochs=6)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    proc = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--name", "i"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
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


def test_ctrl_c_in_the_baselines_resumes_into_the_trials(tmp_path):
    """Ctrl-C while the baselines train (before Tune holds any state): exit 130, runs KILLED, and
    `resume` trains the baseline again and starts the trials, as the error line promises."""
    import signal
    import sqlite3

    space = dict(SPACE, baseline={"batch_sizes": [8]})  # small batches: seconds of baseline to interrupt
    space["train"] = dict(SPACE["train"], epochs=12)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    proc = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--name", "ib"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            try:  # the baseline's first epoch is in the store
                with contextlib.closing(sqlite3.connect(tmp_path / "mlruns" / "mlflow.db")) as db:
                    if db.execute("select count(*) from metrics where key = 'val_acc'").fetchone()[0]:
                        break
            except sqlite3.Error:
                pass
            time.sleep(0.05)
        assert proc.poll() is None, "the baseline ended before its first epoch was seen"
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and "Traceback" not in err, out[-2000:] + err[-2000:]
    assert err.strip().splitlines()[-1] == ("triaccel: interrupted: search 'ib' stopped before it finished: "
                                            "`triaccel resume ib` continues it")
    _, all_runs = runs(tmp_path, "ib")
    assert sorted((r.data.tags["triaccel.role"], r.info.status) for r in all_runs) == [
        ("baseline", "KILLED"), ("parent", "KILLED")]

    r = cli("resume", "ib", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    _, all_runs = runs(tmp_path, "ib")
    assert sorted((r.data.tags["triaccel.role"], r.info.status) for r in all_runs) == [
        ("baseline", "FINISHED"), ("baseline", "KILLED"), ("parent", "FINISHED"), ("trial", "FINISHED"),
        ("trial", "FINISHED")]


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
    """Start a 3-trial search and kill -9 its driver once Tune wrote tuner.pkl, before its first
    experiment state (Tune's start-up): the on-disk state of #14 case 2."""
    import signal

    space = dict(SPACE, trials=3)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    tune_dir = tmp_path / "mlruns" / "tune" / name
    proc = subprocess.Popen([sys.executable, "-c", _DIE_ONCE_TUNER_BUILT, "search", "--space", "space.yaml",
                             "--name", name], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(), start_new_session=True)  # its own group: killpg takes only it
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


def test_driver_killed_in_tune_start_up_resumes_the_whole_search(tmp_path):
    """Restoring the directory a driver killed in Tune's start-up leaves made Tune plan one trial,
    and `resume` reported a finished 1-trial search. It must run every trial the space asked for."""
    _kill_in_tune_start_up(tmp_path, "s")
    r = cli("resume", "s", cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "Tune saved no trial yet: starting the trials" in r.stdout
    assert "search 's': 3 finished" in r.stdout and "3 trials in MLflow" in r.stdout, r.stdout[-2000:]
    _, all_runs = runs(tmp_path, "s")
    trials = [x for x in all_runs if x.data.tags["triaccel.role"] == "trial"]
    assert len(trials) == 3 and len({t.data.tags["triaccel.trial_id"] for t in trials}) == 3
    assert all(x.info.status == "FINISHED" for x in all_runs)  # the parent included


def _search(tmp_path, *args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "triaccel.cli", "search", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=timeout, env=env or _env())


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
    port = _closed_port()
    uri, why = uri.format(port=port), why.format(port=port)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    r = _search(tmp_path, "--space", "space.yaml", env=dict(_env(), MLFLOW_TRACKING_URI=uri))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"triaccel: error: MLFLOW_TRACKING_URI: {why}"), lines
    assert not (tmp_path / "mlruns").exists()


@pytest.mark.parametrize("args,space,line", [
    (["--name", ""], {}, "--name '': use 1 to 100 letters, digits, '-' and '_'"),  # was: the space's name, silently
    (["--name", "a/b"], {}, "--name 'a/b': use 1 to 100 letters, digits, '-' and '_'"),
    (["--name", ".."], {}, "--name '..': use 1 to 100 letters, digits, '-' and '_'"),
    ([], {"name": "../x"}, "space.yaml: name '../x': use 1 to 100 letters, digits, '-' and '_'"),
    ([], {"seed": -1}, "space.yaml: seed: must be in [0, 2**32) (the samplers' seed range)"),
    ([], {"cpus_per_trial": 1e9}, "space.yaml: cpus_per_trial: 1e+09 is more than this machine's {cpus} CPUs: "
                                  "no trial could start"),  # Tune waited for it forever
    (["--trials", str(10**30)], {}, "--trials: invalid value 1000000000000000000000000000000 (must be in [1, 10000])"),
    (["--gpus-per-trial", "nan"], {}, "--gpus-per-trial: invalid value nan (must be in (0, 8])"),
])
def test_bad_search_values_are_one_line_and_write_nothing(tmp_path, args, space, line):
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(dict(SPACE, **space)))
    r = _search(tmp_path, "--space", "space.yaml", *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [f"triaccel: error: {line.format(cpus=os.cpu_count())}"]
    assert not (tmp_path / "mlruns").exists()


def test_export_to_a_path_it_cannot_write_is_one_line_and_writes_nothing(tmp_path):
    """--out in a folder that does not exist (it was created), a folder, a path under /proc or a
    device: one line naming --out, exit 2, nothing written; a good path still exports."""
    space = dict(SPACE, trials=1, concurrency=1)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    r = cli("search", "--space", "space.yaml", "--name", "x", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (tmp_path / "adir").mkdir()
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "mlruns" not in p.parts)
    for out, extra, line in [
        ("nodir/tuned.yaml", [], "--out nodir/tuned.yaml: no such folder nodir"),
        ("adir", [], "--out 'adir': names a folder, not a file; give a file path such as adir/tuned.yaml"),
        ("new/", [], "--out 'new/': names a folder, not a file; give a file path such as new/tuned.yaml"),
        ("", [], "--out '': names a folder, not a file; give a file path such as tuned.yaml"),
        ("/proc/tuned.yaml", [], "--out /proc/tuned.yaml: cannot write "),
        ("/dev/null", ["--force"], "--out /dev/null: is not a regular file; export writes a YAML file"),
    ]:
        r = cli("export", "x", "--out", out, *extra, cwd=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (out, r.stderr[-2000:])
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"triaccel: error: {line}"), (out, lines)
    # case 10: an existing file, the search's own space included, is not replaced without --force
    r = cli("export", "x", "--out", "space.yaml", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "triaccel: error: --out space.yaml: exists; choose another path or add --force to replace it"], r.stderr
    assert yaml.safe_load((tmp_path / "space.yaml").read_text()) == space
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "mlruns" not in p.parts) == before
    assert not os.path.exists("/proc/tuned.yaml") and os.path.exists("/dev/null")
    r = cli("export", "x", "--out", "adir/tuned.yaml", cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "adir" / "tuned.yaml").is_file(), r.stderr[-2000:]


    # the store the search recorded has gone (a server that stopped): one line naming it, not the train key
    import json

    state_file = tmp_path / "mlruns" / "tune" / "x" / "triaccel_search.json"
    port = _closed_port()
    state_file.write_text(json.dumps(dict(json.loads(state_file.read_text()), tracking_uri=f"http://127.0.0.1:{port}")))
    for args in (["export", "x", "--out", "again.yaml"], ["resume", "x"]):
        r = cli(*args, cwd=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert r.stderr.strip().splitlines() == [
            f"triaccel: error: the search's MLflow store (recorded when it started): no MLflow server answers at "
            f"http://127.0.0.1:{port} ([Errno 111] Connection refused)"], args
    assert not (tmp_path / "again.yaml").exists()


def test_tune_state_planning_fewer_trials_than_the_space_is_refused_in_one_line(tmp_path):
    """The state the earlier `resume` left after a death in Tune's start-up (Tune restored with no
    experiment state plans one trial): resuming it can never run the rest, so `resume` refuses in
    one line saying what to do, instead of running nothing and promising `resume` again."""
    tune_dir = _kill_in_tune_start_up(tmp_path, "f")
    # what `triaccel resume` did before the fix, run for real: Tune restores tuner.pkl alone
    old_resume = ("import sys\nfrom ray import tune\nfrom triaccel.search.cluster import init_ray\n"
                  "from triaccel.search.state import read_state\nfrom triaccel.search.tuner import trial_trainable\n"
                  "from triaccel.search.space import parse_space\nst = read_state('f')\n"
                  "sp = parse_space(st['space'], source=st['source'], sha256=st['sha256'])\ninit_ray(None)\n"
                  "tune.Tuner.restore(sys.argv[1], trainable=trial_trainable(sp, st['shared'], None), "
                  "resume_unfinished=True).fit()\n")
    r = subprocess.run([sys.executable, "-c", old_resume, str(tune_dir)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=600, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    _, before = runs(tmp_path, "f", role="trial")
    assert len(before) == 1  # Tune planned one of the space's three

    r = cli("resume", "f", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [
        f"triaccel: error: search 'f': its Tune state in {tune_dir} plans 1 of the space's 3 trials and cannot run "
        f"the rest: start the search again under another name (`triaccel search --space space.yaml --name f2`)"]
    _, after = runs(tmp_path, "f", role="trial")
    assert [x.info.run_id for x in after] == [x.info.run_id for x in before]  # nothing ran


def _sigterm_when(tmp_path, name, space, ready):
    """Start a search, send SIGTERM to its process alone (as `kill PID` or a scheduler does) once
    ``ready()`` holds; return (returncode, stdout, stderr)."""
    import signal

    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    proc = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--name", name],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and not ready():
            time.sleep(0.05)
        assert proc.poll() is None, "the search ended before the moment to stop it"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out, err


def test_sigterm_in_the_baselines_closes_the_runs_and_resume_finishes(tmp_path):
    """SIGTERM while a baseline trains: Python died at once (exit -15), the parent and baseline
    runs left RUNNING in MLflow. Now as Ctrl-C: exit 143, the line saying how to resume, runs
    KILLED; `resume` finishes the search."""
    import sqlite3

    def baseline_epoch_in():
        try:
            with contextlib.closing(sqlite3.connect(tmp_path / "mlruns" / "mlflow.db")) as db:
                return bool(db.execute("select count(*) from metrics where key = 'val_acc'").fetchone()[0])
        except sqlite3.Error:
            return False

    space = dict(SPACE, baseline={"batch_sizes": [8]})
    space["train"] = dict(SPACE["train"], epochs=12)
    rc, out, err = _sigterm_when(tmp_path, "tb", space, baseline_epoch_in)
    assert rc == 143 and "Traceback" not in err, (rc, out[-2000:], err[-2000:])
    assert err.strip().splitlines()[-1] == ("triaccel: interrupted: search 'tb' stopped before it finished: "
                                            "`triaccel resume tb` continues it")
    _, all_runs = runs(tmp_path, "tb")
    assert sorted((r.data.tags["triaccel.role"], r.info.status) for r in all_runs) == [
        ("baseline", "KILLED"), ("parent", "KILLED")]
    r = cli("resume", "tb", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    _, all_runs = runs(tmp_path, "tb")
    assert [r.info.status for r in all_runs if r.data.tags["triaccel.role"] == "parent"] == ["FINISHED"]


def test_sigterm_in_the_trials_is_no_abort_and_resume_finishes(tmp_path):
    """SIGTERM once trials report: Ray's handler aborted the driver with a stack dump (exit 134),
    the parent run left RUNNING. Now Tune stops as for Ctrl-C: exit 143, one line, runs KILLED,
    and `resume` runs the trials."""
    space = dict(SPACE)
    space["train"] = dict(SPACE["train"], epochs=4)
    rc, out, err = _sigterm_when(tmp_path, "tt", space, lambda: any(
        f.stat().st_size for f in (tmp_path / "mlruns" / "tune" / "tt").glob("*/result.json")))
    assert rc == 143 and "SIGTERM received" not in err and "Traceback" not in err, (rc, out[-2000:], err[-2000:])
    assert err.strip().splitlines()[-1].startswith("triaccel: interrupted: search 'tt' stopped before it finished (")
    _, all_runs = runs(tmp_path, "tt")
    assert [r.info.status for r in all_runs if r.data.tags["triaccel.role"] == "parent"] == ["KILLED"]
    assert not [r for r in all_runs if r.info.status == "RUNNING"]
    r = cli("resume", "tt", cwd=tmp_path)
    assert r.returncode == 0 and "export the best" in r.stdout, r.stderr[-3000:]


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


def test_search_state_on_a_full_disk_takes_no_name(tmp_path):
    """TRIACCEL_TUNE_DIR on a full disk: the state file was left empty, so the name was taken by a
    search that could neither run nor be resumed. Now nothing is left and the same command works
    once there is room. Needs a tmpfs mount (root in a sandbox that allows it)."""
    full = tmp_path / "full"
    full.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        with contextlib.suppress(OSError), open(full / "fill", "wb", buffering=0) as f:
            while True:
                f.write(b"\0" * 4096)
        (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
        env = dict(_env(), TRIACCEL_TUNE_DIR=str(full / "tune"))
        r = _search(tmp_path, "--space", "space.yaml", "--name", "f", env=env)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert r.stderr.strip().splitlines() == [
            f"triaccel: error: {full / 'tune' / 'f'}: cannot write the search's state there (No space left on "
            f"device; TRIACCEL_TUNE_DIR chooses another folder)"]
        assert not (full / "tune" / "f").exists()
    finally:
        subprocess.run(["umount", str(full)], capture_output=True)


def test_exports_at_once_without_force_replace_nothing(tmp_path):
    """Four `export --out tuned.yaml` at once without --force all passed the exists check and all
    exited 0, each replacing the last; and a user's own tuned.yaml.tmp was overwritten and deleted
    (the fixed temporary name). Now one export writes the file, the others say it exists."""
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(dict(SPACE, trials=1, concurrency=1)))
    r = cli("search", "--space", "space.yaml", "--name", "x", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (tmp_path / "tuned.yaml.tmp").write_text("mine\n")
    procs = [subprocess.Popen([sys.executable, "-m", "triaccel.cli", "export", "x", "--out", "tuned.yaml"],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
             for _ in range(4)]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    assert sorted(rc for rc, _ in results) == [0, 2, 2, 2], results
    for rc, err in results:
        if rc:
            assert "Traceback" not in err and err.strip().splitlines() == [
                "triaccel: error: --out tuned.yaml: exists (written meanwhile by another process); choose another "
                "path or add --force to replace it"], err
    assert (tmp_path / "tuned.yaml.tmp").read_text() == "mine\n"
    assert yaml.safe_load((tmp_path / "tuned.yaml").read_text())["provenance"]["search"] == "x"
    assert sorted(p.name for p in tmp_path.iterdir() if "tuned" in p.name) == ["tuned.yaml", "tuned.yaml.tmp"]
    for out in ("space.yaml/tuned.yaml", "space.yaml/a/tuned.yaml"):  # a parent that is a file: was "no such folder"
        r = cli("export", "x", "--out", out, cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [
            f"triaccel: error: --out {out}: space.yaml is a file, not a folder"], r.stderr[-2000:]


def test_two_searches_of_one_name_at_once_run_one(tmp_path):
    """Two `search --name same` started together both passed the exists check and both ran, into
    one Tune folder and one parent run (4 trials and 2 baselines in a 2-trial search), both exit 0.
    Now the name is claimed exclusively: the second says so in one line and writes nothing."""
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    procs = [subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--name",
                               "same"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_env()) for _ in range(2)]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    assert sorted(rc for rc, _ in results) == [0, 2], [(rc, err[-2000:]) for rc, err in results]
    err = [e for rc, e in results if rc][0]
    assert "Traceback" not in err and err.strip().splitlines() == [
        f"triaccel: error: search 'same' already exists in {tmp_path / 'mlruns' / 'tune' / 'same'} (started "
        f"meanwhile by another process): choose another --name"], err
    _, all_runs = runs(tmp_path, "same")
    assert sorted(r.data.tags["triaccel.role"] for r in all_runs) == ["parent", "trial", "trial"]
    assert not list((tmp_path / "mlruns" / "tune" / "same").glob(".*.tmp"))


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
        space = dict(SPACE)
        space["train"] = dict(SPACE["train"], epochs=6)
        (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
        env = dict(_env(), MLFLOW_TRACKING_URI=f"sqlite:///{full}/mlflow.db")
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


def test_export_from_a_read_only_store(tmp_path):
    """A finished search's store on a read-only disk (an archive, a shared mount): export, which only
    reads it, failed in one line (the store's lock file could not be made) and `searches` showed no
    figures. Now both read it; a resume there (Tune's restore: a pyarrow traceback) is one line.
    Needs a read-only bind mount (root in a sandbox that allows it)."""
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(dict(SPACE, trials=1, concurrency=1)))
    r = cli("search", "--space", "space.yaml", "--name", "x", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    store = tmp_path / "mlruns"
    if subprocess.run(["mount", "--bind", str(store), str(store)], capture_output=True).returncode:
        pytest.skip("cannot bind-mount here")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(store)], capture_output=True).returncode:
            pytest.skip("cannot make a bind mount read-only here")
        r = cli("export", "x", "--out", "tuned.yaml", cwd=tmp_path)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
        assert yaml.safe_load((tmp_path / "tuned.yaml").read_text())["provenance"]["search"] == "x"
        r = cli("searches", cwd=tmp_path)
        assert r.returncode == 0 and " finished " in r.stdout and "cannot" not in r.stdout, r.stdout
        r = cli("resume", "x", cwd=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
        assert r.stderr.strip().splitlines() == [
            f"triaccel: error: {store / 'tune' / 'x'}: cannot write there (a read-only disk or no permission): "
            f"resume continues the search in that folder"]
    finally:
        subprocess.run(["umount", str(store)], capture_output=True)


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
    with pytest.raises(TriAccelError, match=r"search 'w' stopped: not an interrupt; `triaccel resume w`") as e:
        with signals.interruptible("w", uri):
            raise RuntimeError("not an interrupt")
    assert not isinstance(e.value, Interrupted) and c.get_run(run).info.status == "KILLED"


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


@pytest.mark.parametrize("sig,rc", [("SIGINT", 130)])  # SIGTERM reaches the same handler (errors.stop_on_sigterm);
def test_a_signal_in_the_confirm_runs_stops_the_search(tmp_path, sig, rc):  # it passed too, and costs CI a minute
    """Tune leaves its own SIGINT handler installed after fit() returns: Ctrl-C or SIGTERM during the confirm
    runs set an event nobody read, and the search ran on to its summary, a FINISHED parent and exit 0
    (a tester's report). Now: the exit status of a stop, runs closed KILLED, and resume finishes it."""
    import signal

    space = dict(SPACE, trials=2, concurrency=2)
    space["train"] = dict(SPACE["train"], epochs=30)  # a confirm run long enough to be interrupted (~6 s)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    proc = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--name", "c",
                             "--confirm", "1"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(), start_new_session=True)
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


def test_a_lost_tune_state_or_store_is_said_not_merged_or_started_anew(tmp_path):
    """Two of a tester's finds, after one finished search: (1) with mlruns/tune/NAME deleted, a new search of
    that name took the old baseline and parent run and ranked the old trials with its own ('6 finished' of a
    3-trial space); (2) with the store moved away, resume trained into a new, empty store and exited 0."""
    import shutil

    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    r = cli("search", "--space", "space.yaml", "--name", "g", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    state = (tmp_path / "mlruns" / "tune" / "g" / "triaccel_search.json").read_text()
    assert f"sqlite:///{tmp_path}/mlruns/mlflow.db" in state  # recorded absolute, not against the current folder
    shutil.rmtree(tmp_path / "mlruns" / "tune" / "g")
    _, before = runs(tmp_path, "g")
    r = cli("search", "--space", "space.yaml", "--name", "g", cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "already holds runs of a search named 'g'" in lines[0], r.stderr
    _, after = runs(tmp_path, "g")
    assert len(after) == len(before) and not (tmp_path / "mlruns" / "tune" / "g" / "triaccel_search.json").exists()

    (tmp_path / "space.yaml").write_text(yaml.safe_dump(dict(SPACE, train=dict(SPACE["train"], epochs=3))))
    proc = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--name", "m"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
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


def test_an_mlflow_server_that_dies_mid_search_is_one_line_in_seconds(tmp_path):
    """A real `mlflow server` (through `triaccel ui`), killed once a trial has reported: the search hung for
    8.5 minutes in MLflow's retries, then a 260-line traceback (a tester's report). Now it stops within
    seconds with one line saying how to continue."""
    import signal
    import urllib.request

    port = _closed_port()
    env = dict(_env(), MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/srv.db")
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
                                env=dict(_env(), MLFLOW_TRACKING_URI=f"http://127.0.0.1:{port}"),
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
