"""triaccel.saving: a production run keeps its trained model, and with --save continues after a kill."""
import signal
import subprocess
import sys

import pytest
import torch

from _harness import user_env
from conftest import ROOT

QUICK = str(ROOT / "configs" / "quickstart.yaml")


def train(*args, cwd):
    return subprocess.run([sys.executable, "-m", "triaccel.cli", "train", "--config", QUICK, *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600, env=user_env())


def killed_at(prefix, *args, cwd):
    """`triaccel train --config QUICK ARGS`, SIGKILLed as it prints a line starting with ``prefix``: its exit status."""
    proc = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "train", "--config", QUICK, *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=user_env(),
                            start_new_session=True)
    try:
        for line in proc.stdout:
            if line.startswith(prefix):
                proc.send_signal(signal.SIGKILL)
                break
        proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode


def runs(d):
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=f"sqlite:///{d}/mlruns/mlflow.db")
    exp = c.get_experiment_by_name("triaccel-train")
    return c, c.search_runs([exp.experiment_id])


@pytest.mark.slow
def test_a_run_killed_mid_training_resumes_into_its_run_and_ends_as_an_unkilled_one(tmp_path):
    """`triaccel train` kept no model and no checkpoint: a run killed at epoch 3 of 4 was lost, its MLflow run
    RUNNING for good. With --save DIR, DIR/last.pt after every epoch; --resume continues the same MLflow run
    from it and ends with the weights and accuracy of a run never killed (fp32 on one CPU thread: exact)."""
    whole = tmp_path / "whole"
    whole.mkdir()
    r = train("--set", "epochs=4", "--save", "ck", cwd=whole)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "trained model: ck/model.pt" in r.stdout
    killed = tmp_path / "killed"
    killed.mkdir()
    assert killed_at("epoch   2/4", "--set", "epochs=4", "--save", "ck", cwd=killed) == -signal.SIGKILL
    assert (killed / "ck" / "last.pt").is_file()
    c, (run,) = runs(killed)
    assert run.info.status == "RUNNING"  # what a SIGKILL leaves
    # a folder holding a run is never started over, and a changed config is not resumed into it
    r = train("--set", "epochs=4", "--save", "ck", cwd=killed)
    assert r.returncode == 2 and r.stderr.strip() == (
        "triaccel: error: --save ck: holds an earlier run's last.pt: `--resume` continues that run; another "
        "folder starts a new one"), r.stderr
    r = train("--set", "epochs=5", "--save", "ck", "--resume", cwd=killed)
    assert r.returncode == 2 and "with epochs 4, this config has 5" in r.stderr, r.stderr
    # elsewhere than its MLflow store the run would fork, its own left RUNNING; a folder another training
    # holds is refused (two resumes at once logged every epoch twice)
    env = dict(user_env(), MLFLOW_TRACKING_URI=f"sqlite:///{killed}/other.db")
    r = subprocess.run([sys.executable, "-m", "triaccel.cli", "train", "--config", QUICK, "--set", "epochs=4",
                        "--save", "ck", "--resume"], cwd=killed, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 2 and "resume with MLFLOW_TRACKING_URI=sqlite:///mlruns/mlflow.db" in r.stderr, r.stderr
    import fcntl

    with open(killed / "ck" / "train.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        r = train("--set", "epochs=4", "--save", "ck", "--resume", cwd=killed)
    assert r.returncode == 2 and r.stderr.strip() == ("triaccel: error: --save ck: another training is using this "
                                                      "folder now; wait for it to end, or save elsewhere"), r.stderr
    r = train("--set", "epochs=4", "--save", "ck", "--resume", cwd=killed)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "triaccel train: resumed from ck/last.pt after epoch " in r.stdout, r.stdout
    c, (again,) = runs(killed)
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    assert sorted(m.step for m in c.get_metric_history(run.info.run_id, "epoch")) == [1, 2, 3, 4]  # each once
    _, (w,) = runs(whole)
    assert again.data.metrics["val_acc"] == w.data.metrics["val_acc"]
    a, b = (torch.load(d / "ck" / "model.pt", weights_only=False) for d in (whole, killed))
    assert a["model"].keys() == b["model"].keys() and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    # the model for inference, as trained, also in the MLflow run's artifacts
    import triaccel

    m = triaccel.load_model(killed / "ck" / "model.pt")
    assert not m.training and all(torch.equal(v, b["model"][k]) for k, v in m.state_dict().items())
    assert m(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    assert "model.pt" in [f.path for f in c.list_artifacts(run.info.run_id)]
    # a finished run is not resumed (its final metrics were logged a second time)
    r = train("--set", "epochs=4", "--save", "ck", "--resume", cwd=killed)
    assert r.returncode == 2 and "has finished (its model is ck/model.pt): nothing is left to train" in r.stderr


@pytest.mark.slow
def test_a_run_killed_in_its_first_epoch_resumes_into_its_run(tmp_path):
    """A SIGKILL before the first epoch ended left no checkpoint, and its MLflow run RUNNING for good: the
    checkpoint is written when the run starts too."""
    # the line said once set up, as its first epoch trains
    assert killed_at("triaccel train: ", "--set", "epochs=2", "--save", "ck", cwd=tmp_path) == -signal.SIGKILL
    assert (tmp_path / "ck" / "last.pt").is_file()
    r = train("--set", "epochs=2", "--save", "ck", "--resume", cwd=tmp_path)
    assert r.returncode == 0 and "resumed from ck/last.pt after epoch " in r.stdout, r.stderr[-2000:]
    c, (run,) = runs(tmp_path)
    assert run.info.status == "FINISHED" and "failure_reason" not in run.data.tags
    assert sorted(m.step for m in c.get_metric_history(run.info.run_id, "epoch")) == [1, 2]
    assert [m.step for m in c.get_metric_history(run.info.run_id, "final_val_acc")] == [2]
    assert not list((tmp_path / "ck").glob(".*.tmp"))


def test_load_model_of_a_file_that_is_not_one_is_one_line(tmp_path):
    from triaccel.errors import ConfigError
    from triaccel.saving import load_model

    with pytest.raises(ConfigError, match=r"nope.pt: no such file$"):
        load_model(tmp_path / "nope.pt")
    torch.save({"weights": 1}, tmp_path / "other.pt")
    with pytest.raises(ConfigError, match=r"other.pt: not a model.pt of triaccel train \(no model, config, build\)$"):
        load_model(tmp_path / "other.pt")
    (tmp_path / "text.pt").write_text("hello")
    with pytest.raises(ConfigError, match=r"text.pt: not a model.pt of triaccel train \(UnpicklingError\)$"):
        load_model(tmp_path / "text.pt")
