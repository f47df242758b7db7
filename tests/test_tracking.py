"""Values that used to reach torch, the OS or MLflow unchecked (#14, "the next ten"): each is one
line naming the key, exit status 2, no traceback, and nothing trained or written."""
import socket
import subprocess
import sys

import pytest

from conftest import ROOT
from triaccel.errors import ConfigError


def _train(tmp_path, *sets):
    cmd = [sys.executable, "-m", "triaccel.cli", "train", "--config", str(ROOT / "configs" / "quickstart.yaml"),
           "--set", "epochs=1", "--set", "evaluate_test=false",
           "--set", f"tracking.tracking_uri=sqlite:///{tmp_path}/m.db"]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("setting,match", [
    ("seed=-1", "seed: must be in [0, 2**32), got -1"),
    ("batch_size=1000000000000000000000000000000", "batch_size: must be in [1, 16777216]"),
    ("seed=99999999999999", "seed: must be in [0, 2**32)"),
    ("device=cuda:abc", "device: must be auto, cpu or cuda[:N], got 'cuda:abc'"),
    ("optim.lr=.inf", "optim.lr: must be > 0 and finite, got inf"),
    ("data.image_size=100000", "data.image_size: 100000 px needs"),
    ("tracking.experiment=''", "tracking.experiment: must be a non-empty name"),
    ("tracking.tracking_uri=foo://bar", "tracking.tracking_uri: unknown MLflow store scheme 'foo'"),
    ("tracking.tracking_uri=sqlite:////proc/no/such.db", "tracking.tracking_uri: cannot use the MLflow store"),
    ("tracking.tracking_uri=http://127.0.0.1:{port}", "tracking.tracking_uri: no MLflow server answers at"),
])
def test_bad_value_is_one_line_and_nothing_is_written(tmp_path, setting, match):
    r = _train(tmp_path, setting.format(port=_closed_port()))
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and match in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "epoch" not in r.stdout  # nothing trained


def test_a_server_that_refuses_the_host_it_is_reached_by_is_one_line_naming_the_flag(tmp_path):
    """docs/team.md's `mlflow server --host 0.0.0.0` refuses (403) a teammate who reaches it by a name it was not
    started for (MLflow 3 serves localhost and private addresses unless given --allowed-hosts); its /health
    answers all the same, and a search ended in a traceback from its first write. A real server here, started
    for another host name than the address the run reaches it by."""
    import os
    import time
    import urllib.request

    port = _closed_port()
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                               f"sqlite:///{tmp_path}/server.db", "--host", "127.0.0.1", "--port", str(port),
                               "--workers", "1", "--allowed-hosts", f"mlflow.team.example:{port}"],
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                              env={**{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")},
                                   "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    try:
        deadline = time.monotonic() + 300  # a start-up wait, not a timing check
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
                time.sleep(0.5)
        r = _train(tmp_path, f"tracking.tracking_uri=http://127.0.0.1:{port}")
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=60)
        log.close()
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"triaccel: error: tracking.tracking_uri: the MLflow server at http://127.0.0.1:{port} "
                           f"refused the request") and "403" in line, line
    assert line.endswith("start the server with --allowed-hosts naming the host and port you reach it by"), line
    assert "epoch" not in r.stdout  # nothing trained


def test_a_password_in_the_store_uri_is_never_printed(tmp_path):
    """A team pointing runs at its database directly (postgresql+psycopg2://USER:PASSWORD@HOST/DB) had the
    password printed in every header, `browse:` line and error, into terminals and CI logs."""
    from triaccel.tracking import shown

    assert shown("postgresql+psycopg2://mlflow:s3cret@db.team:5432/mlflow") == \
        "postgresql+psycopg2://mlflow:***@db.team:5432/mlflow"
    assert shown("https://me:tok%40en@mlflow.team/") == "https://me:***@mlflow.team/"
    for plain in ("sqlite:///mlruns/mlflow.db", "http://127.0.0.1:5000", "postgresql://mlflow@db/mlflow"):
        assert shown(plain) == plain
    # a real connection attempt to a database nobody serves: psycopg2 refused, said in one line without it
    r = _train(tmp_path, f"tracking.tracking_uri=postgresql+psycopg2://mlflow:s3cret@127.0.0.1:{_closed_port()}/m")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "s3cret" not in r.stdout + r.stderr and "mlflow:***@127.0.0.1" in r.stderr, r.stderr[-2000:]


def test_a_bad_value_is_named_where_it_was_typed(tmp_path):
    """A value from --set is named as --set KEY (it was named as the config file's, which does not
    hold it); one from the file, by the file."""
    r = _train(tmp_path, "seed=5", "seed=-1")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "triaccel: error: --set seed: must be in [0, 2**32), got -1"], r.stderr[-2000:]
    r = _train(tmp_path, "optim={lr: x}")
    assert r.stderr.strip().splitlines() == ["triaccel: error: --set optim: optim.lr: must be a number, got 'x'"]
    r = _train(tmp_path, "seed.x=1")
    assert r.stderr.strip().splitlines() == ["triaccel: error: --set seed.x: seed is not a section"]
    cfg = tmp_path / "c.yaml"
    cfg.write_text((ROOT / "configs" / "quickstart.yaml").read_text().replace("seed: 0", "seed: -1", 1))
    r = subprocess.run([sys.executable, "-m", "triaccel.cli", "train", "--config", str(cfg), "--set", "epochs=1"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"triaccel: error: {cfg}: seed: must be in [0, 2**32), got -1"], r.stderr[-2000:]


@pytest.mark.slow
def test_two_processes_open_a_fresh_store_together(tmp_path):
    """#14 case 8: two searches started together on a new sqlite store raced in MLflow's schema
    migrations and one died; the store is created under a file lock now."""
    uri = f"sqlite:///{tmp_path}/fresh/mlflow.db"
    code = f"from triaccel import tracking; tracking.check_store({uri!r}); print('ok')"
    ps = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for _ in range(3)]
    outs = [p.communicate(timeout=600) for p in ps]
    assert [p.returncode for p in ps] == [0, 0, 0], [e[-1500:] for _, e in outs]
    assert all(o.strip() == "ok" for o, _ in outs)


def test_check_store_accepts_a_driver_in_the_scheme():
    from triaccel.tracking import check_store

    with pytest.raises(ConfigError, match="cannot use the MLflow store") as e:
        check_store("postgresql+psycopg2://127.0.0.1:1/none")
    assert "unknown MLflow store scheme" not in str(e.value)


def test_sigterm_during_train_closes_its_run_killed(tmp_path):
    """SIGTERM to `triaccel train` (a scheduler's stop, `kill`): Python died at once and the MLflow run
    stayed RUNNING forever. Now as Ctrl-C: the run is closed KILLED, one line, exit 143."""
    import signal

    from mlflow.tracking import MlflowClient

    cmd = [sys.executable, "-m", "triaccel.cli", "train", "--config", str(ROOT / "configs" / "quickstart.yaml"),
           "--set", "epochs=500", "--set", "evaluate_test=false", "--set", "tracking.enabled=true",
           "--set", f"tracking.tracking_uri=sqlite:///{tmp_path}/m.db"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:  # the first epoch is in
            if line.startswith("epoch"):
                break
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143 and "Traceback" not in err, (proc.returncode, err[-2000:])
    assert err.strip().splitlines()[-1] == "triaccel: interrupted"
    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/m.db")
    exp = c.get_experiment_by_name("triaccel-train")
    assert [r.info.status for r in c.search_runs([exp.experiment_id])] == ["KILLED"]


def test_store_filling_mid_train_is_one_line(tmp_path):
    """The MLflow store's disk fills while `triaccel train` runs: MLflow's tracebacks (the failure
    status could not be written either), exit 1. Now one line saying the disk is full, exit 2."""
    import contextlib

    full = tmp_path / "full"
    full.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(full)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        cmd = [sys.executable, "-m", "triaccel.cli", "train", "--config", str(ROOT / "configs" / "quickstart.yaml"),
               "--set", "epochs=500", "--set", "evaluate_test=false", "--set", "tracking.enabled=true",
               "--set", f"tracking.tracking_uri=sqlite:///{full}/m.db"]
        proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            for line in proc.stdout:  # the first epoch is in the store
                if line.startswith("epoch"):
                    break
            with contextlib.suppress(OSError), open(full / "fill", "wb", buffering=0) as f:
                while True:
                    f.write(b"\0" * 4096)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 2 and "Traceback" not in err, (proc.returncode, err[-3000:])
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            "triaccel: error: a disk this run writes is full (database or disk is full): training stopped after "
            "epoch ") and lines[0].endswith("; free space and train again"), lines
    finally:
        subprocess.run(["umount", str(full)], capture_output=True)


def test_a_disk_that_fills_as_the_finished_run_writes_its_artifacts_is_one_line(tmp_path):
    """The artifacts folder has room for the config the run logs first and none for the trajectory it
    logs at the end: a traceback from shutil (exit 1) and the run left RUNNING. Now one line, exit 2,
    the run FAILED."""
    art = tmp_path / "store" / "artifacts"  # beside the sqlite store (tracking.artifact_location)
    art.mkdir(parents=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(art)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here")
    try:  # one 4 KiB page: config.yaml fits, trajectory.csv does not
        uri = f"sqlite:///{tmp_path}/store/m.db"
        r = subprocess.run([sys.executable, "-m", "triaccel.cli", "train", "--config",
                            str(ROOT / "configs" / "quickstart.yaml"), "--set", "epochs=1", "--set", "mode=triaccel",
                            "--set", "evaluate_test=false", "--set", "tracking.enabled=true",
                            "--set", f"tracking.tracking_uri={uri}"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
    finally:
        subprocess.run(["umount", str(art)], capture_output=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-3000:])
    assert r.stderr.strip().splitlines() == [
        "triaccel: error: a disk this run writes is full ([Errno 28] No space left on device): training finished "
        "its 1 epochs, but not its record; free space and train again"]
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    assert [x.info.status for x in c.search_runs([c.get_experiment_by_name("triaccel-train").experiment_id])] == [
        "FAILED"]


def test_runs_of_one_seed_get_names_of_their_own_and_the_seeded_stream_is_untouched():
    """MLflow drew every run's name from the random module the trainer had seeded: all runs of seed 0
    were 'overjoyed-slug-911' in the UI."""
    import random

    from triaccel.tracking import fresh_run_name

    names = set()
    for _ in range(5):
        random.seed(0)
        names.add(fresh_run_name())
        assert random.random() == random.Random(0).random()  # the run's own draws as without the name
    assert len(names) >= 4 and all("-" in n for n in names), names
