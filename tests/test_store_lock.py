"""A store locked by another process (triaccel/store_lock.py): a run rides through a short lock and
ends in one line past the bound. Real subprocesses, a real sqlite MLflow store."""
import subprocess
import sys
import time

import pytest
import yaml

from _harness import user_env


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
    env = dict(user_env(), TRIACCEL_STORE_LOCK_WAIT_S=str(wait_s))
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
