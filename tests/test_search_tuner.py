"""The trials Tune runs (search/tuner.py): a killed trial worker is a failed trial and the search
finishes. Real subprocesses, real local Ray, a real sqlite MLflow store."""
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from _harness import SPACE, runs, user_env, with_store


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
def test_a_killed_trial_worker_runs_again_from_its_checkpoint_and_the_search_finishes(tmp_path):
    """kill -9 of one trial's worker mid-search (a node leaving a cluster is the same loss) failed that trial for
    good, and resume had nothing left to run. Tune now runs it again from its last checkpoint: every trial
    FINISHED, each epoch logged once, the loss said and tagged; the search finishes (exit 0, parent FINISHED)
    and, nobody having stopped it, is never 'interrupted' (130)."""
    with_store(tmp_path)  # a copy of the migrated template (the store's creation: elsewhere)
    space = dict(SPACE, trials=3, concurrency=1)
    space["train"] = dict(SPACE["train"], epochs=6)  # a trial trains for seconds: time to find and kill it
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    proc = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--name", "k"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=user_env(),
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
    c, trials = runs(tmp_path, "k", role="trial")
    assert sorted(t.info.status for t in trials) == ["FINISHED"] * 3, [t.info.status for t in trials]
    (lost,) = [t for t in trials if "triaccel.worker_lost" in t.data.tags]
    assert f"  trial {lost.data.tags['triaccel.trial_id']} lost its worker (" in out, out[-2000:]
    assert sorted(m.step for m in c.get_metric_history(lost.info.run_id, "efficiency")) == list(range(1, 7))
    _, parents = runs(tmp_path, "k", role="parent")
    assert [p.info.status for p in parents] == ["FINISHED"]


SYNC_FAILS = r'''
import logging, pathlib, shutil, sys
import ray
ray.init(num_cpus=1, include_dashboard=False, logging_level=logging.ERROR, configure_logging=True)
from ray.train._internal.storage import StorageContext
from ray.tune.execution.experiment_state import _ExperimentCheckpointManager
from triaccel.search.tuner import quiet_tune_failures
root = pathlib.Path(sys.argv[1])
storage = StorageContext(storage_path=str(root / "store"), experiment_dir_name="exp")
shutil.rmtree(root / "store" / "exp", ignore_errors=True)
(root / "store" / "exp").write_text("a file where Tune's folder should be: every copy fails")
manager = _ExperimentCheckpointManager(storage=storage, checkpoint_period=0)
def save():
    p = pathlib.Path(storage.experiment_driver_staging_path)
    p.mkdir(parents=True, exist_ok=True)
    (p / "experiment_state.json").write_text("{}")
manager.sync_up_experiment_state(save_fn=save, force=True, wait=True)
print("QUIET FROM HERE", file=sys.stderr, flush=True)
quiet_tune_failures()
manager.sync_up_experiment_state(save_fn=save, force=True, wait=True)
manager.sync_up_experiment_state(save_fn=save, force=True, wait=True)
'''


def test_a_failed_copy_of_tunes_state_is_one_line_not_a_traceback(tmp_path):
    """Tune copies its experiment state from a staging folder to the search's Tune folder after every
    event, in a thread; a copy that fails (on a loaded machine, a file replaced while it is read) is
    logged by Ray with its whole traceback. Here every copy fails, through Ray's own classes."""
    p = subprocess.run([sys.executable, "-c", SYNC_FAILS, str(tmp_path)], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120, env=user_env())
    assert p.returncode == 0, p.stdout[-3000:]
    loud, quiet = p.stdout.split("QUIET FROM HERE")
    assert "Traceback (most recent call last)" in loud  # what Ray prints unfiltered
    assert "Traceback (most recent call last)" not in quiet, quiet
    lines = [ln for ln in quiet.splitlines() if "Saving experiment state" in ln]
    assert len(lines) >= 2 and all("NotADirectoryError" in ln and "saves it again" in ln for ln in lines), quiet
