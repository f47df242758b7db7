"""`triaccel train` as a user runs it: a real sqlite MLflow store, real subprocesses."""
import subprocess
import sys

import pytest

from conftest import ROOT


def run_cli(*args, cwd, env_extra=None):
    import os

    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "triaccel.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=600)


def _one_clean_line(r, match):
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert lines[0].startswith("triaccel: error: ") and match in lines[0], lines[0]


@pytest.mark.parametrize("setup,args,match", [
    (None, ["--config", "missing.yaml"], "missing.yaml: no such file"),
    ("a: [1,\n", ["--config", "c.yaml"], "c.yaml: not valid YAML"),
    ("model: {name: vgg99}\n", ["--config", "c.yaml"], "model.name: unknown model 'vgg99' (valid: efficientnet_b0, mlp, resnet18, small_cnn)"),
    ("data: {name: mnist}\n", ["--config", "c.yaml"], "data.name: unknown dataset 'mnist'"),
    ("data: {name: imagefolder, data_dir: /no/such/dir}\n", ["--config", "c.yaml"], "/no/such/dir: data_dir does not exist"),
    ("batch_size: 0\n", ["--config", "c.yaml"], "c.yaml: batch_size: must be in [1, 16777216]"),
    ("epochs: 1\n", ["--config", "c.yaml", "--set", "optim.lr=-2"], "optim.lr: must be > 0"),
    (b"PK\x03\x04\x14\x00\x08\x08\xb5", ["--config", "c.yaml"], "c.yaml: not a YAML text file (not UTF-8: byte 0xb5 at offset 8)"),
    ("# epochs: 3\n", ["--config", "c.yaml"], "c.yaml: is empty (no settings)"),
    ("", ["--config", "c.yaml", "--set", "epochs=1"], "c.yaml: is empty (no settings)"),
    # keys the dataset would ignore: trained on digits while the user pointed at a folder
    ("data: {name: digits, data_dir: /tmp}\n", ["--config", "c.yaml"],
     "c.yaml: data.data_dir: digits ships with the install and reads no folder"),
    ("data: {name: imagefolder, data_dir: ., download: true}\n", ["--config", "c.yaml"],
     "c.yaml: data.download: only cifar10 and cifar100 download (through torchvision); imagefolder would ignore it"),
])
def test_bad_input_is_one_line(tmp_path, setup, args, match):
    if isinstance(setup, bytes):
        (tmp_path / "c.yaml").write_bytes(setup)
    elif setup is not None:
        (tmp_path / "c.yaml").write_text(setup)
    r = run_cli("train", *args, cwd=tmp_path)
    _one_clean_line(r, match)
    assert not (tmp_path / "mlruns").exists() or "model" not in str(setup)


@pytest.mark.parametrize("args,match", [
    (["train"], "train: the following arguments are required: --config (`triaccel train --help`"),
    (["search", "--trials", "many", "--space", "s.yaml"], "search: argument --trials: invalid int value: 'many'"),
    (["export", "x", "--pick"], "export: argument --pick: expected one argument"),
    (["frob"], "invalid choice: 'frob'"),
    (["train", "--config", "c.yaml", "x\ny"], "train: unrecognized arguments: x\\ny"),  # the break escaped
    (["train", "--config", "c.yaml", "--bogus"], "train: unrecognized arguments: --bogus (`triaccel train --help`"),
    # argparse kept the last --config without a word, and read '' as the current folder ("is a folder")
    (["train", "--config", "a.yaml", "--config", "b.yaml"], "train: --config given twice ('a.yaml' and 'b.yaml')"),
    (["profile", "--config=a.yaml", "--config", "b.yaml"], "profile: --config given twice ('a.yaml' and 'b.yaml')"),
    (["train", "--config", ""], "train: --config '': an empty path; give a YAML file"),
    (["train", "--config", " "], "train: --config ' ': an empty path; give a YAML file"),
    # the same for the search commands' one-value options (argparse kept the last)
    (["search", "--space", "a.yaml", "--space", "b.yaml"], "search: --space given twice ('a.yaml' and 'b.yaml')"),
    (["search", "--space", "s.yaml", "--name", "a", "--name", "b"], "search: --name given twice ('a' and 'b')"),
    (["search", "--space", "s.yaml", "--address", "auto", "--address=x:1"], "search: --address given twice"),
    (["resume", "x", "--address", "auto", "--address", "auto"], "resume: --address given twice"),
    (["export", "x", "--out", "a.yaml", "--out", "b.yaml"], "export: --out given twice ('a.yaml' and 'b.yaml')"),
    # an empty --address ran a local search (`--address "$UNSET"`), an empty --space read the folder
    (["search", "--space", "s.yaml", "--address", ""], "search: --address '': an empty address; give HOST:PORT"),
    (["resume", "x", "--address="], "resume: --address '': an empty address"),
    (["search", "--space="], "search: --space '': an empty path; give a space YAML or a shipped space's name"),
])
def test_a_bad_command_line_is_one_line_not_a_usage_block(tmp_path, args, match):
    """argparse printed its usage block (up to six lines for `search`) above the error; the error
    is one line in the project's format, naming the command and the option."""
    from triaccel.cli import main

    r = subprocess.run([sys.executable, "-c", "import sys; from triaccel.cli import main; sys.exit(main())", *args],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    _one_clean_line(r, match)
    assert "usage:" not in r.stderr and not list(tmp_path.iterdir())
    with pytest.raises(SystemExit) as e:  # in-process too (a caller of main() gets SystemExit(2), as from argparse)
        main(["train"])
    assert e.value.code == 2


def test_train_logs_run_to_sqlite_store(tmp_path):
    r = run_cli("train", "--config", str(ROOT / "configs" / "quickstart.yaml"), "--set", "epochs=3", cwd=tmp_path,
                env_extra={"MLFLOW_TRACKING_URI": ""})
    assert r.returncode == 0, r.stderr
    assert "epoch   3/3" in r.stdout and "MLflow run" in r.stdout
    assert (tmp_path / "mlruns" / "mlflow.db").is_file()
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    exp = c.get_experiment_by_name("triaccel-train")
    runs = c.search_runs([exp.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["model.name"] == "small_cnn"
    assert len(c.get_metric_history(run.info.run_id, "val_acc")) == 3
    assert run.data.metrics["final_test_acc"] > 50
    assert "git_revision" in run.data.tags
    arts = [a.path for a in c.list_artifacts(run.info.run_id)]
    assert "config.yaml" in arts
    assert (tmp_path / "mlruns" / "artifacts").is_dir()


def test_triaccel_train_logs_the_control_trajectory(tmp_path):
    """The CLI wires its run through build_trainer: the Tri-Accel loop's trajectory (JSON, CSV,
    plots) lands as artifacts of the MLflow run."""
    r = run_cli("train", "--config", str(ROOT / "configs" / "quickstart_triaccel.yaml"), "--set", "epochs=1",
                "--set", "evaluate_test=false", cwd=tmp_path, env_extra={"MLFLOW_TRACKING_URI": ""})
    assert r.returncode == 0, r.stderr
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    run = c.search_runs([c.get_experiment_by_name("triaccel-train").experiment_id])[0]
    assert run.data.params["mode"] == "triaccel"
    arts = [a.path for a in c.list_artifacts(run.info.run_id, "triaccel")]
    assert any(a.endswith(".json") for a in arts) and any(a.endswith(".csv") for a in arts), arts


def test_reading_the_command_line_imports_no_torch():
    """`triaccel --help` imported torch (through triaccel.profile) and took 2 s, and a Ctrl-C in those
    seconds printed a traceback: the parser is built from light modules only."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", "import sys; from triaccel.cli import build_parser; build_parser(); "
                        "print(sorted(m for m in ('torch', 'ray', 'mlflow', 'optuna') if m in sys.modules))"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout, r.stderr[-2000:])
