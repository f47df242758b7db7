"""The command line (triaccel/cli.py) as users run it: `triaccel train` with a real sqlite MLflow store in real
subprocesses; inputs that once reached a traceback, a silent misreading or a lost run, each one line naming the
key, flag, file or variable, exit status 2, nothing written; `triaccel ui` on a port in use; the help text."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from _harness import child_env
from conftest import ROOT
from triaccel.cli import main
from triaccel.config import load_config
from triaccel.errors import ConfigError


def run_cli(*args, cwd, env_extra=None):
    env = child_env(**(env_extra or {}))
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
    # found while the run is built, not while the file is read: named with the file all the same
    ("model: {name: vgg99}\n", ["--config", "c.yaml"], "c.yaml: model.name: unknown model 'vgg99' (valid: efficientnet_b0, mlp, resnet18, small_cnn)"),
    ("data: {name: mnist}\n", ["--config", "c.yaml"], "c.yaml: data.name: unknown dataset 'mnist'"),
    # the same key given by --set, or its section replaced by --set: the file is not where it is wrong
    ("epochs: 1\n", ["--config", "c.yaml", "--set", "model.name=vgg99"], "triaccel: error: --set model.name: unknown model 'vgg99'"),
    ("epochs: 1\n", ["--config", "c.yaml", "--set", "model={name: vgg99}"], "triaccel: error: --set model: model.name: unknown model"),
    # a factory's argument: the file's where the file wrote it, not where --set added it
    ("model: {class_path: torch.nn.Linear, init_args: {in_features: 64, out_features: 10, bogus: 1}}\n",
     ["--config", "c.yaml"], "triaccel: error: c.yaml: model.class_path: torch.nn.Linear(...) raised TypeError"),
    ("model: {class_path: torch.nn.Linear, init_args: {in_features: 64, out_features: 10}}\n",
     ["--config", "c.yaml", "--set", "model.init_args.bogus=1"],
     "triaccel: error: model.class_path: torch.nn.Linear(...) raised TypeError"),
    # a relative folder named like a section is a path, not the config's `data` key
    ("data: {name: imagefolder, data_dir: data}\n", ["--config", "c.yaml"], "triaccel: error: data: data_dir does not exist"),
    ("data: {name: imagefolder, data_dir: /no/such/dir}\n", ["--config", "c.yaml"], "/no/such/dir: data_dir does not exist"),
    ("batch_size: 0\n", ["--config", "c.yaml"], "c.yaml: batch_size: must be in [1, 16777216]"),
    ("epochs: 1\n", ["--config", "c.yaml", "--set", "optim.lr=-2"], "optim.lr: must be > 0"),
    (b"PK\x03\x04\x14\x00\x08\x08\xb5", ["--config", "c.yaml"], "c.yaml: not a YAML text file (not UTF-8: byte 0xb5 at offset 8)"),
    ("# epochs: 3\n", ["--config", "c.yaml"], "c.yaml: is empty (no settings)"),
    # a search space given as a config: named as one, not as `name: unknown key`
    ("name: s\ntrain: {epochs: 1}\nparams: {}\n", ["--config", "c.yaml"],
     "c.yaml: a search space, not a training config (it has train: and params:): `triaccel search --space c.yaml`"),
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


def test_a_model_handed_to_the_api_by_name_is_not_named_as_the_config_files_fault(tmp_path, monkeypatch):
    import triaccel
    from triaccel.errors import ConfigError

    (tmp_path / "c.yaml").write_text("epochs: 1\ndata: {name: digits}\ntracking: {enabled: false}\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        triaccel.train("c.yaml", model="nopkg_xyz.models.mlp")
    assert str(e.value).startswith("model.class_path: no module named 'nopkg_xyz'"), str(e.value)
    with pytest.raises(ConfigError) as e:  # the same reference written in the file is the file's
        (tmp_path / "d.yaml").write_text("epochs: 1\nmodel: {class_path: nopkg_xyz.models.mlp}\n"
                                         "data: {name: digits}\ntracking: {enabled: false}\n")
        triaccel.train("d.yaml")
    assert str(e.value).startswith("d.yaml: model.class_path: no module named 'nopkg_xyz'"), str(e.value)


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
    import torch

    assert run.data.tags["gpu"] == "cpu" and run.data.tags["torch"] == torch.__version__  # what trained it
    arts = [a.path for a in c.list_artifacts(run.info.run_id)]
    assert "config.yaml" in arts
    assert (tmp_path / "mlruns" / "artifacts").is_dir()
    # the trained model, without --save too: the run's model.pt, which load_model builds for inference
    assert "model.pt" in arts
    from triaccel.saving import load_model

    m = load_model(c.download_artifacts(run.info.run_id, "model.pt", str(tmp_path)))
    assert not m.training and m(torch.zeros(1, 1, 8, 8)).shape == (1, 10)


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


def test_a_triaccel_section_a_static_run_does_not_read_is_said_and_not_recorded_as_its_settings(tmp_path):
    """An exported triaccel config trained with --set mode=amp (or a triaccel section beside mode amp) ran
    static, and its MLflow params said triaccel.precision.tau_low 5.0 as if it had trained that way."""
    r = run_cli("train", "--config", str(ROOT / "configs" / "quickstart_triaccel.yaml"), "--set", "mode=fp32",
                "--set", "epochs=1", "--set", "triaccel.precision.tau_low=1e-5", cwd=tmp_path,
                env_extra={"MLFLOW_TRACKING_URI": ""})
    assert r.returncode == 0, r.stderr
    assert "triaccel: note: mode fp32 reads no triaccel.* key: this config's " in r.stderr, r.stderr
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    (run,) = c.search_runs([c.get_experiment_by_name("triaccel-train").experiment_id])
    assert run.data.params["mode"] == "fp32" and not [k for k in run.data.params if k.startswith("triaccel.")]


def test_reading_the_command_line_imports_no_torch():
    """`triaccel --help` imported torch (through triaccel.profile) and took 2 s, and a Ctrl-C in those
    seconds printed a traceback: the parser is built from light modules only."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", "import sys; from triaccel.cli import build_parser; build_parser(); "
                        "print(sorted(m for m in ('torch', 'ray', 'mlflow', 'optuna') if m in sys.modules))"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout, r.stderr[-2000:])


QUICK = str(ROOT / "configs" / "quickstart.yaml")
FAST = ["--set", "epochs=1", "--set", "tracking.enabled=false", "--set", "evaluate_test=false"]


def _one_line(capsys, argv, match):
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2, (rc, out[-1000:], err[-1000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("triaccel: error: ") and match in lines[0], lines
    assert "epoch" not in out  # nothing trained
    return lines[0]


@pytest.mark.parametrize("setting,key", [
    ("optim.warmup_epochs=.inf", "optim.warmup_epochs"),  # was OverflowError in the trainer
    ("optim.weight_decay=inf", "optim.weight_decay"),  # trained, then "train loss is nan"
    ("triaccel.curvature.alpha=.inf", "triaccel.curvature.alpha"),
    ("triaccel.curvature.tau_curv=.inf", "triaccel.curvature.tau_curv"),
    ("triaccel.batch.budget_gb=.inf", "triaccel.batch.budget_gb"),
])
def test_non_finite_numbers_are_refused_naming_the_key(capsys, setting, key):
    _one_line(capsys, ["train", "--config", QUICK, *FAST, "--set", setting], f"{key}: must be")
    with pytest.raises(ConfigError, match=key):
        load_config(None, [setting])


@pytest.mark.parametrize("sets,match", [
    # an unset shell variable (`--set model.class_path=$REF`) trained the shipped small_cnn instead of the user's
    (["model.class_path="], "--set model.class_path=: no value (write model.class_path=null to set it to null)"),
    (["data.class_path= "], "--set data.class_path=: no value"),
    # the factory reads its own data: a dataset name beside it was ignored
    (["data.class_path=triaccel.zoo.text.char_corpus", "data.name=cifar10"],
     "data.name: is for the built-in datasets; data.class_path's factory reads its own data"),
])
def test_a_setting_that_would_be_ignored_or_emptied_is_one_line(capsys, sets, match):
    _one_line(capsys, ["train", "--config", QUICK, *FAST, *[a for k in sets for a in ("--set", k)]], match)


def _deleted_experiment(uri, name):
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    c.delete_experiment(c.create_experiment(name))


def test_experiment_deleted_in_the_ui_is_one_line_for_train_and_search(tmp_path, capsys, monkeypatch):
    """Deleting the experiment in the MLflow UI (its trash) made every later `train` and `search` on
    that store an MlflowException traceback ("must be in the 'active' state"), and the search had
    already taken its name (a rerun was told to resume a search that never ran)."""
    uri = f"sqlite:///{tmp_path}/m.db"
    _deleted_experiment(uri, "triaccel-train")
    _deleted_experiment(uri, "triaccel-search")
    capsys.readouterr()  # MLflow's own log of creating the store
    line = _one_line(capsys, ["train", "--config", QUICK, "--set", "epochs=1", "--set", "evaluate_test=false",
                              "--set", f"tracking.tracking_uri={uri}"], "tracking.experiment: MLflow experiment "
                     "'triaccel-train'")
    assert "is deleted" in line and "restore it in the MLflow UI" in line
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("TRIACCEL_TUNE_DIR", str(tmp_path / "tune"))
    _one_line(capsys, ["search", "--space", "quickstart", "--name", "q"], "MLflow experiment 'triaccel-search'")
    assert not (tmp_path / "tune" / "q").exists()  # the name is not taken


def test_a_space_path_in_a_missing_folder_never_runs_a_shipped_space(tmp_path, capsys, monkeypatch):
    """Issue 14 case 4: `--space DIR/quickstart.yaml` with a DIR that does not exist ran the shipped
    quickstart space and recorded the missing path as provenance. A path with a folder names a file;
    only a bare name finds a shipped space."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRIACCEL_TUNE_DIR", str(tmp_path / "tune"))
    for path in ("nodir/quickstart.yaml", "./quickstart.yaml", str(tmp_path / "quickstart.yaml"),
                 "spaces/quickstart.yaml"):  # README's line outside a checkout: the hint names the shipped one
        line = _one_line(capsys, ["search", "--space", path, "--name", "q"], f"{path}: no such space file")
        assert line.endswith(f"{path}: no such space file (the shipped space of that name: --space quickstart)")
    line = _one_line(capsys, ["search", "--space", "spaces/nosuch.yaml", "--name", "q"], "no such space file")
    assert line.endswith("spaces/nosuch.yaml: no such space file")  # no shipped space of that name: no hint
    assert not list(tmp_path.iterdir())  # no store, no search state, no name taken
    from triaccel.search.space import resolve_space_path

    assert resolve_space_path("quickstart").name == "quickstart.yaml"  # the bare name still finds it


def test_paths_the_system_will_not_look_at_and_line_breaks_in_values_are_one_line(tmp_path, capsys, monkeypatch):
    """A tester's finds: a path component over 255 bytes was an OSError traceback (train, profile and
    search: pathlib swallows only 'no such file' and its kin); /dev/null as a space was "no such space
    file"; a value holding a line break was echoed raw, splitting the error over two lines; `ui` with a
    refused --port or --host wrote the default store's mlruns/ before refusing."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRIACCEL_TUNE_DIR", str(tmp_path / "tune"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    long = "a" * 300
    _one_line(capsys, ["train", "--config", long], f"{long}: cannot read it (File name too long)")
    _one_line(capsys, ["profile", "--config", long], "cannot read it (File name too long)")
    for space in (long, f"{long}.yaml", f"{tmp_path}/{long}/x.yaml"):
        _one_line(capsys, ["search", "--space", space], "cannot read it (File name too long)")
    _one_line(capsys, ["search", "--space", "/dev/null"], "/dev/null: not a regular file; a space is read from a file")
    _one_line(capsys, ["train", "--config", "no\nfile"], "no\\nfile: no such file")
    _one_line(capsys, ["train", "--config", str(ROOT / "configs" / "quickstart.yaml"), "--set", "a\nb=1"], "a\\nb")
    for args, line in ((["--port", "99999"], "--port 99999: not a TCP port"),
                       (["--host", "0.0.0.0"], "--host 0.0.0.0 exposes the UI")):
        _one_line(capsys, ["ui", *args], line)
    assert not list(tmp_path.iterdir())  # nothing written: no store, no search state


def test_config_that_is_a_folder_or_a_pipe(tmp_path, capsys):
    """`--config DIR` said "no such file" of a folder that is there (`--space DIR` "no such space
    file"); `--config <(sed ... c.yaml)` (a pipe, /dev/fd/N) said "no such file" and did not train."""
    _one_line(capsys, ["train", "--config", str(tmp_path), *FAST], f"{tmp_path}: is a folder, not a YAML file")
    _one_line(capsys, ["search", "--space", str(tmp_path)], f"{tmp_path}: is a folder, not a space file")
    import os

    r, w = os.pipe()
    os.write(w, (ROOT / "configs" / "quickstart.yaml").read_bytes())
    os.close(w)
    try:
        cfg = load_config(f"/dev/fd/{r}", ["epochs=1"])
    finally:
        os.close(r)
    assert cfg.model.width == 16 and cfg.epochs == 1
    with pytest.raises(ConfigError, match="/dev/zero: more than 16 MiB: not a config file"):
        load_config("/dev/zero")  # read with a bound, not for ever


def test_a_key_given_twice_in_a_yaml_file_is_refused(tmp_path, capsys):
    """PyYAML keeps the last of two equal keys without a word: `epochs: 1` ... `epochs: 50` trained
    50 epochs, and a space listing one param twice searched only the second range."""
    c = tmp_path / "c.yaml"
    c.write_text("epochs: 1\nmodel: {name: mlp}\ntracking: {enabled: false}\nepochs: 50\n")
    _one_line(capsys, ["train", "--config", str(c)], "c.yaml: epochs is given twice in one mapping (lines 1 and 4)")
    text = (ROOT / "spaces" / "quickstart.yaml").read_text()
    s = tmp_path / "s.yaml"
    s.write_text(text + "  triaccel.curvature.alpha:    {distribution: loguniform, low: 1.0, high: 3.0}\n")
    _one_line(capsys, ["search", "--space", str(s)], "s.yaml: triaccel.curvature.alpha is given twice")
    assert not (tmp_path / "mlruns").exists()
    # a merge key's values may still be overridden: that is what merging is for
    c.write_text("base: &b {name: digits, val_fraction: 0.2}\ndata:\n  <<: *b\n  val_fraction: 0.3\n")
    from triaccel.config import read_yaml

    assert read_yaml(c)["data"] == {"name": "digits", "val_fraction": 0.3}


@pytest.mark.parametrize("item", ["=5", ".epochs=1", "optim..lr=0.1", "optim.=0.1", " =1"])
def test_set_with_an_empty_key_part_names_the_flag(capsys, item):
    """`--set =5` or `--set .epochs=1` said ": unknown key (valid: ...)", naming nothing."""
    _one_line(capsys, ["train", "--config", QUICK, *FAST, "--set", item], f"--set {item}: expected key=value")


@pytest.mark.parametrize("value", ["abc", "2s", "-1", "nan"])
def test_unusable_progress_delay_is_one_line_before_anything_runs(capsys, monkeypatch, value):
    """TRIACCEL_PROGRESS_DELAY=abc was a ValueError traceback from the first progress bar, mid-run."""
    monkeypatch.setenv("TRIACCEL_PROGRESS", "1")
    monkeypatch.setenv("TRIACCEL_PROGRESS_DELAY", value)
    _one_line(capsys, ["train", "--config", QUICK, *FAST], f"TRIACCEL_PROGRESS_DELAY: must be a number of "
              f"seconds >= 0, got {value!r}")


@pytest.mark.parametrize("uri", ["sqlite://", "sqlite:///", "sqlite:///:memory:"])
def test_in_memory_store_is_refused_naming_where_it_came_from(tmp_path, capsys, monkeypatch, uri):
    """MLFLOW_TRACKING_URI=sqlite:// trained and printed "MLflow run ... at sqlite://": a store in the
    process's memory, the run gone at exit. An error about a store from the environment named
    tracking.tracking_uri, a key the user never set."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    train = ["train", "--config", QUICK, "--set", "epochs=1", "--set", "evaluate_test=false"]
    _one_line(capsys, train, f"MLFLOW_TRACKING_URI: {uri} is an in-memory sqlite store")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "foo://bar")  # any store error names the variable
    _one_line(capsys, train, "MLFLOW_TRACKING_URI: unknown MLflow store scheme 'foo'")
    # a server's address without http:// was read as a folder: MLflow's "file store ... maintenance mode" line
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "127.0.0.1:5999")
    _one_line(capsys, train, "MLFLOW_TRACKING_URI: 127.0.0.1:5999 has no scheme; an MLflow server is "
                             "http://127.0.0.1:5999")
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    _one_line(capsys, [*train, "--set", f"tracking.tracking_uri='{uri}'"], f"tracking.tracking_uri: {uri} is an in-memory")


def test_int_param_whose_high_is_off_its_step_grid_is_refused(tmp_path, capsys):
    """{distribution: int, low: 8, high: 12, step: 8}: Optuna narrowed it to [8, 8] with a warning
    among Ray's logs; the search ran a range the space does not say."""
    s = tmp_path / "s.yaml"
    s.write_text((ROOT / "spaces" / "quickstart.yaml").read_text().replace(
        "{distribution: int, low: 8, high: 48, step: 8}", "{distribution: int, low: 8, high: 12, step: 8}"))
    _one_line(capsys, ["search", "--space", str(s)], "params.triaccel.batch.delta_down.step: high (12) is not on the "
              "grid low + k * step (low 8, step 8): the largest value drawn would be 8; make high 8 or 16")


def test_crop_padding_beyond_the_image_side_is_refused(capsys):
    """data.crop_padding=100000 padded every batch to 200008 px a side: an allocator traceback asking
    for 2.5 TB at the first batch. Bounded by the image side: checked with the config when
    data.image_size is set, at data set-up (before any run is written) for the dataset's own side."""
    _one_line(capsys, ["train", "--config", QUICK, *FAST, "--set", "data.crop_padding=100000"],
              "data.crop_padding: must be < the image side (8 px) for the random crop, got 100000")
    with pytest.raises(ConfigError, match=r"data.crop_padding: must be < the image side \(16 px\)"):
        load_config(QUICK, ["data.image_size=16", "data.crop_padding=16"])
    assert load_config(QUICK, ["data.image_size=16", "data.crop_padding=15"]).data.crop_padding == 15
    assert load_config(QUICK, ["data.crop_padding=100000", "data.augment=false"])  # no crop: padding unused


def test_model_width_has_an_upper_bound(capsys):
    """model.width=100000000 was an allocator traceback building small_cnn (4096: OOM-killed on a
    23 GiB machine). small_cnn's and mlp's width stop at 1024 (small_cnn's last conv: 4096 channels)."""
    _one_line(capsys, ["train", "--config", QUICK, *FAST, "--set", "model.width=100000000"],
              "model.width: must be in [1, 1024]")
    assert load_config(QUICK, ["model.width=1024"]).model.width == 1024


def test_image_size_below_what_the_model_takes_is_refused(capsys):
    """data.image_size=1 with small_cnn (it max-pools by 2) was torch's "Output size is too small"
    traceback in the first forward. The line names the smallest size that works for the model."""
    _one_line(capsys, ["train", "--config", QUICK, *FAST, "--set", "data.image_size=1"],
              "data.image_size: small_cnn needs images of at least 2 px, got 1")
    assert load_config(QUICK, ["data.image_size=2", "data.crop_padding=1"]).data.image_size == 2
    # resnet18 pads every strided conv and pools adaptively: 1 px runs (as does efficientnet_b0 resizing inside)
    assert load_config(QUICK, ["model.name=resnet18", "data.image_size=1", "data.crop_padding=0"])
    assert load_config(QUICK, ["model.name=efficientnet_b0", "model.resize=32", "data.image_size=1",
                               "data.crop_padding=0"])


def test_curvature_top_k_has_an_upper_bound(capsys):
    """triaccel.curvature.top_k=1000000000: the probe's model-sized k-column blocks (k capped at each
    layer's size) got the process killed for memory. A handful is normal (paper: 5); at most 64."""
    triaccel = str(ROOT / "configs" / "quickstart_triaccel.yaml")
    _one_line(capsys, ["train", "--config", triaccel, *FAST, "--set", "triaccel.curvature.top_k=1000000000"],
              "triaccel.curvature.top_k: must be in [1, 64]")
    assert load_config(triaccel, ["triaccel.curvature.top_k=64"]).triaccel.curvature.top_k == 64


def test_warmup_longer_than_the_run_is_refused(tmp_path, capsys):
    """optim.warmup_epochs=5 with epochs=1 trained without a word, the lr still rising when the run
    ended: optim.lr never reached. warmup_epochs == epochs stays allowed (the quickstart's
    `--set epochs=1` smoke runs use it). A space whose train.epochs is shorter than its warm-up is
    refused when the space is read; trials stopped early by ASHA are not concerned."""
    _one_line(capsys, ["train", "--config", QUICK, *FAST, "--set", "optim.warmup_epochs=5"],
              "optim.warmup_epochs: must be <= epochs (1), got 5.0")
    assert load_config(QUICK, ["epochs=1"]).optim.warmup_epochs == 1.0
    # unset: 5 epochs, or the whole run when shorter (an exported 2-epoch config must load again)
    assert load_config(None, ["epochs=2"]).warmup_epochs() == 2.0
    assert load_config(None, ["epochs=8"]).warmup_epochs() == 5.0
    s = tmp_path / "s.yaml"
    s.write_text((ROOT / "spaces" / "quickstart.yaml").read_text().replace("warmup_epochs: 1}", "warmup_epochs: 6}"))
    _one_line(capsys, ["search", "--space", str(s)], "s.yaml: train.optim.warmup_epochs: must be <= epochs (4)")
    assert not (tmp_path / "mlruns").exists()


@pytest.mark.parametrize("value", ["99999999999999999999999", "-1"])
def test_split_seed_out_of_range_is_refused(capsys, value):
    """data.split_seed=99999999999999999999999 loaded, then was torch.Generator's "Overflow when
    unpacking long long" traceback at data set-up. Same range as `seed`: [0, 2**32)."""
    _one_line(capsys, ["train", "--config", QUICK, *FAST, "--set", f"data.split_seed={value}"],
              f"data.split_seed: must be in [0, 2**32), got {value}")
    assert load_config(QUICK, [f"data.split_seed={2**32 - 1}"]).data.split_seed == 2**32 - 1


@pytest.mark.parametrize("flags,match", [
    (["--steps", "0"], "--steps 0: must be in [1, 100000]"),
    (["--steps", "-1"], "--steps -1: must be in [1, 100000]"),
    (["--warmup", "-1"], "--warmup -1: must be in [0, 100000]"),
    (["--warmup", "100000000000000000000"], "--warmup 100000000000000000000: must be in [0, 100000]"),  # ran until killed
])
def test_profile_step_counts_are_checked_first(capsys, flags, match):
    """`triaccel profile --steps 0` profiled every variant's warm-up, then was statistics' "no median
    for empty data" traceback; --warmup -1 ran as 0 without a word."""
    _one_line(capsys, ["profile", "--config", QUICK, *FAST, *flags], match)


def test_profile_out_that_is_a_file(tmp_path, capsys):
    """`triaccel profile --out FILE` was a FileExistsError traceback (FILE/sub: NotADirectoryError)."""
    f = tmp_path / "report.txt"
    f.write_text("keep me")
    _one_line(capsys, ["profile", "--config", QUICK, *FAST, "--out", str(f)], f"--out {f}: is a file, not a folder")
    _one_line(capsys, ["profile", "--config", QUICK, *FAST, "--out", str(f / "sub")], f"--out {f / 'sub'}: cannot "
              "create the folder")
    assert f.read_text() == "keep me"


@pytest.mark.parametrize("old,new,match", [
    ("{distribution: uniform, low: 1.25, high: 2.0}", "{distribution: uniform, low: 1.25, high: 2.0, step: 0.25}",
     "params.triaccel.batch.grow_factor.step: uniform does not use step (it takes above, high, low); a grid is "
     "`distribution: int` with a step, or categorical choices"),
    ("{distribution: loguniform, low: 1.0, high: 1000.0}", "{distribution: loguniform, low: 1.0, high: 1000.0, "
     "choices: [1.0, 1000.0]}", "params.triaccel.curvature.tau_curv.choices: loguniform does not use choices"),
])
def test_a_param_key_its_distribution_ignores_is_refused(tmp_path, capsys, old, new, match):
    """{distribution: uniform, low: 1.25, high: 2.0, step: 0.25} searched the continuous range without a
    word (only int reads `step`; uniform/loguniform ignored `choices`, categorical `low`/`high`)."""
    s = tmp_path / "s.yaml"
    text = (ROOT / "spaces" / "quickstart.yaml").read_text()
    assert old in text
    s.write_text(text.replace(old, new))
    _one_line(capsys, ["search", "--space", str(s)], f"s.yaml: {match}")
    assert not (tmp_path / "mlruns").exists()


@pytest.mark.parametrize("value", ["[a, b]", "[null, 0.9]", "[[0.9], [0.99]]", "[false, 0.9]"])
def test_betas_that_are_not_numbers_name_the_key(capsys, value):
    """`--set optim.betas=[a, b]` said "optim: '<=' not supported between instances of 'int' and 'str'"
    (Python's words, no key); [false, 0.9] trained with beta1 = 0."""
    _one_line(capsys, ["train", "--config", QUICK, *FAST, "--set", f"optim.betas={value}"],
              "optim.betas: two numbers in [0, 1), got [")
    assert load_config(QUICK, ["optim.betas=[0, 0.99]"]).optim.betas == (0.0, 0.99)


@pytest.mark.parametrize("value,match", [("FILE", "is a file, not a folder"), ("", "set but empty")])
def test_tune_dir_that_is_a_file_or_empty_is_one_line(capsys, monkeypatch, tmp_path, value, match):
    """TRIACCEL_TUNE_DIR at a file listed 'no searches under FILE' (exit 0), and an empty value
    meant the current folder: a misset variable read as an empty store."""
    f = tmp_path / "tune.txt"
    f.write_text("not a folder\n")
    monkeypatch.setenv("TRIACCEL_TUNE_DIR", str(f) if value == "FILE" else value)
    for argv in (["searches"], ["export", "x", "--out", str(tmp_path / "t.yaml")]):
        rc = main(argv)
        out, err = capsys.readouterr()
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "TRIACCEL_TUNE_DIR" in err and match in err, \
            (argv, rc, out, err)
    assert f.read_text() == "not a folder\n" and not (tmp_path / "t.yaml").exists()


@pytest.mark.parametrize("setting,key", [("model.resize=99999999", "model.resize"),
                                         ("model.resize=0", "model.resize")])
def test_resize_past_any_model_is_refused_naming_the_key(capsys, setting, key):
    """model.resize=99999999 was accepted and failed allocating later (helper's report)."""
    _one_line(capsys, ["train", "--config", QUICK, *FAST, "--set", setting], f"{key}: must be in [1, 2048]")
    assert load_config(None, ["model.name=efficientnet_b0", f"{key}=2048"]) is not None  # the bound is a valid side


# ---------------------------------------------------------------- settings that were ignored or reached a traceback
@pytest.mark.parametrize("settings,match", [
    # torch's "Nesterov momentum requires a momentum" traceback at the first step
    (["optim.nesterov=true", "optim.momentum=0"], "optim.nesterov: needs optim.momentum > 0"),
    # ignored by small_cnn, and it waived the model's least image size (then max_pool2d's traceback)
    (["model.resize=64"], "model.resize: only efficientnet_b0 resizes its input; small_cnn would ignore it"),
    # trained at 96 below min_batch 200; with max_batch 16, 64 became 16 without a word
    (["mode=triaccel", "batch_size=96", "triaccel.batch.min_batch=200", "triaccel.batch.max_batch=400"],
     "batch_size: 96 is outside the batch controller's bounds"),
    (["mode=triaccel", "batch_size=64", "triaccel.batch.max_batch=16", "triaccel.batch.min_batch=8"],
     "batch_size: 64 is outside the batch controller's bounds"),
])
def test_settings_that_were_ignored_or_a_traceback_are_refused(capsys, settings, match):
    _one_line(capsys, ["train", "--config", QUICK, *FAST, *[a for s in settings for a in ("--set", s)]], match)


def test_the_batch_bounds_bind_only_where_the_batch_controller_runs():
    assert load_config(QUICK, ["mode=amp", "amp_dtype=bf16", "batch_size=4", "triaccel.batch.min_batch=8"])
    assert load_config(QUICK, ["mode=triaccel", "batch_size=4", "triaccel.batch.min_batch=8",
                               "triaccel.batch.enabled=false"])


def test_yaml_nested_past_any_config_is_one_line(tmp_path, capsys):
    """900 nested lists (a 2 KiB file) were a RecursionError traceback, in a file and in --set."""
    deep = tmp_path / "deep.yaml"
    deep.write_text("epochs: 1\nprovenance: " + "[" * 900 + "]" * 900 + "\n")
    _one_line(capsys, ["train", "--config", str(deep)], "nested more than 64 levels deep")
    _one_line(capsys, ["train", "--config", QUICK, *FAST, "--set", "provenance=" + "[" * 3000 + "]" * 3000],
              "--set provenance: value nested more than 64 levels deep")
    ok = tmp_path / "ok.yaml"  # a provenance as export writes it nests a few levels: still read
    ok.write_text("epochs: 1\nprovenance: " + "{a: " * 10 + "1" + "}" * 10 + "\n")
    assert load_config(ok).provenance


def test_a_file_where_the_store_folder_goes_is_one_line(tmp_path, capsys, monkeypatch):
    """A file named mlruns in the working folder was a FileExistsError traceback from train, profile and ui."""
    import subprocess
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "mlruns").write_text("x")
    _one_line(capsys, ["train", "--config", QUICK, "--set", "epochs=1"],
              "the default MLflow store: cannot use the MLflow store sqlite:///mlruns/mlflow.db (mlruns is a file")
    _one_line(capsys, ["train", "--config", QUICK, "--set", "epochs=1", "--set",
                       "tracking.tracking_uri=sqlite:///mlruns/x.db"], "tracking.tracking_uri: cannot use")
    line = _one_line(capsys, ["profile", "--config", QUICK, "--steps", "1", "--warmup", "0", "--out", "p"],
                     "the default MLflow store: cannot use")
    assert not (tmp_path / "p").exists(), line  # said before the profile ran, not after it had written p/
    assert (tmp_path / "mlruns").read_text() == "x"
    # ui replaces its process with MLflow's server: run it as its own process
    r = subprocess.run([sys.executable, "-m", "triaccel.cli", "ui", "--port", "1"], capture_output=True, text=True,
                       timeout=600, env={**__import__("os").environ, "MLFLOW_TRACKING_URI": "sqlite:///mlruns/x.db"})
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "triaccel: error: MLFLOW_TRACKING_URI: cannot use the MLflow store sqlite:///mlruns/x.db "
        "(mlruns is a file, not a folder)"], r.stderr


def test_ui_on_a_file_that_is_no_store_is_one_line_and_starts_no_server(tmp_path):
    """It printed its URL, then 68 lines of the server's traceback."""
    import socket
    import subprocess
    import sys

    (tmp_path / "n.db").write_text("not a db")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([sys.executable, "-m", "triaccel.cli", "ui", "--port", str(port)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600,
                       env=child_env(MLFLOW_TRACKING_URI="sqlite:///n.db"))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "MLFLOW_TRACKING_URI: cannot use the MLflow store" in lines[0] \
        and "MLflow UI" not in r.stdout, (r.stdout, r.stderr[-2000:])
    assert (tmp_path / "n.db").read_text() == "not a db"


def test_stdout_closed_by_its_reader_stops_quietly_and_closes_the_run_killed(tmp_path):
    """`triaccel train ... | head -1` was a BrokenPipeError traceback and a FAILED run."""
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    p = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "train", "--config", QUICK, "--set", "epochs=3"],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=child_env("MLFLOW_TRACKING_URI"))
    first = p.stdout.readline()
    p.stdout.close()  # what head does after its line
    err = p.stderr.read().decode()
    assert p.wait(timeout=600) == 141 and first.startswith(b"triaccel train:") and "Traceback" not in err, err
    c = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    (run,) = c.search_runs([c.get_experiment_by_name("triaccel-train").experiment_id])
    assert run.info.status == "KILLED" and "BrokenPipeError" in run.data.tags["failure_reason"]


def test_provenance_is_an_artifact_never_params(tmp_path, monkeypatch):
    """An exported config's provenance was logged as params after flattening (the filter looked for the
    bare key): 36 provenance.* params, and a key MLflow refuses as a param name failed the run."""
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = tmp_path / "c.yaml"
    cfg.write_text('epochs: 1\nevaluate_test: false\nprovenance: {"what?*|": 1, metrics: {efficiency: 5}}\n')
    assert main(["train", "--config", str(cfg)]) == 0
    c = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    (run,) = c.search_runs([c.get_experiment_by_name("triaccel-train").experiment_id])
    assert run.info.status == "FINISHED" and "epochs" in run.data.params
    assert not [k for k in run.data.params if k.startswith("provenance")]


def test_a_relative_store_is_recorded_absolute_and_reading_a_missing_store_creates_none(tmp_path, monkeypatch):
    """The search state kept sqlite:///mlruns/mlflow.db, read against the current folder: `searches` and
    `export` run elsewhere (TRIACCEL_TUNE_DIR) reported 0 trials, and created an empty store there."""
    from triaccel.search.state import absolute_store
    from triaccel.tracking import client

    monkeypatch.chdir(tmp_path)
    assert absolute_store("sqlite:///mlruns/mlflow.db") == f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    assert absolute_store("sqlite:////abs/x.db") == "sqlite:////abs/x.db"
    assert absolute_store("http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    with pytest.raises(ConfigError, match="k: no MLflow store at"):
        client(f"sqlite:///{tmp_path}/elsewhere/mlflow.db", key="k", write=False)
    assert not (tmp_path / "elsewhere" / "mlflow.db").exists()


def test_betas_in_yaml_exponent_form_are_numbers():
    """YAML 1.1 reads 9e-1 (no dot) as a string: optim.lr=5e-2 was taken, optim.betas=[9e-1, 0.999] refused."""
    assert load_config(None, ["optim.name=adamw", "optim.betas=[9e-1, 0.999]"]).optim.betas == (0.9, 0.999)
    with pytest.raises(ConfigError, match="optim.betas: two numbers in"):
        load_config(None, ["optim.betas=[nan, 0.999]"])


@pytest.mark.parametrize("value", ["abc", "0", "-2", "1.5"])
def test_trial_threads_variable_is_checked_by_the_driver(monkeypatch, value):
    """TRIACCEL_TRIAL_THREADS=abc failed inside every trial; the driver says it once, before the search starts."""
    from triaccel.search.cluster import check_resources
    from triaccel.search.space import load_space

    monkeypatch.setenv("TRIACCEL_TRIAL_THREADS", value)
    with pytest.raises(ConfigError, match=f"TRIACCEL_TRIAL_THREADS='{value}': must be a whole number"):
        check_resources(load_space(str(ROOT / "spaces" / "quickstart.yaml")), None)
    monkeypatch.setenv("TRIACCEL_TRIAL_THREADS", "2")
    check_resources(load_space(str(ROOT / "spaces" / "quickstart.yaml")), None)


def test_profile_does_not_replace_an_earlier_profile_without_force(tmp_path, capsys):
    """An earlier profile's report.txt in --out was replaced without a word (export refuses without --force)."""
    out = tmp_path / "p"
    out.mkdir()
    (out / "report.txt").write_text("mine")
    _one_line(capsys, ["profile", "--config", QUICK, "--steps", "1", "--warmup", "0", "--out", str(out),
                       "--set", "tracking.enabled=false"], f"--out {out}: holds an earlier profile (report.txt)")
    assert (out / "report.txt").read_text() == "mine"
    assert main(["profile", "--config", QUICK, "--steps", "1", "--warmup", "0", "--out", str(out), "--force",
                 "--set", "tracking.enabled=false"]) == 0
    assert (out / "report.txt").read_text().startswith("variant")


def test_more_start_points_than_trials_is_said(capsys, monkeypatch, tmp_path):
    """`--trials 1` on a space with two start points ran only the first, without a word (a tester's report)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "foo://x")  # stops the search right after its checks
    space = str(ROOT / "spaces" / "cifar10_resnet18.yaml")
    n = len(yaml.safe_load(Path(space).read_text())["start"])
    assert n >= 2
    assert main(["search", "--space", space, "--trials", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == f"triaccel: note: {space} has {n} start points and the search runs 1 trials: only the first 1 run"
    assert err[1].startswith("triaccel: error: MLFLOW_TRACKING_URI: unknown MLflow store scheme")
    assert main(["search", "--space", space, "--trials", str(n)]) == 2
    assert "note" not in capsys.readouterr().err


def test_a_model_name_typo_with_resize_is_said_as_unknown_model(capsys):
    """model.name=efficientnet-b0 model.resize=224 said 'efficientnet-b0 would ignore it' (a reviewer's find)."""
    from triaccel.config import KNOWN_MODELS
    from triaccel.models import MODELS

    assert KNOWN_MODELS == set(MODELS)  # the config's list follows the models'
    _one_line(capsys, ["train", "--config", QUICK, *FAST, "--set", "model.name=efficientnet-b0", "--set",
                       "model.resize=224"], "model.name: unknown model 'efficientnet-b0'")


def test_a_saved_relative_store_is_read_beside_its_tune_folder_and_reads_make_no_folder(tmp_path, monkeypatch):
    """A search saved before stores were recorded absolute holds sqlite:///mlruns/mlflow.db: read from another
    folder (TRIACCEL_TUNE_DIR) it was another, empty store, and export made an empty mlruns/ here."""
    from triaccel.search.state import state_store
    from triaccel.tracking import client

    monkeypatch.setenv("TRIACCEL_TUNE_DIR", str(tmp_path / "proj" / "mlruns" / "tune"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert state_store({"tracking_uri": "sqlite:///mlruns/mlflow.db"}) == \
        f"sqlite:///{tmp_path}/proj/mlruns/mlflow.db"
    assert state_store({"tracking_uri": "http://h:5000"}) == "http://h:5000"
    # a path no other test checked: client() remembers the stores this process found usable
    with pytest.raises(ConfigError, match="no MLflow store at nostore/mlflow.db"):
        client("sqlite:///nostore/mlflow.db", key="k", write=False)
    assert not (elsewhere / "nostore").exists()
    with pytest.raises(ConfigError, match=f"no MLflow store at {tmp_path}/x.db"):  # the query is not the file
        client(f"sqlite:///{tmp_path}/x.db?timeout=30", key="k", write=False)


@pytest.mark.parametrize("setting,match", [
    # an integer of 400 digits was an OverflowError traceback; 1e300 a torch traceback at the first step
    ("optim.lr=" + "1" * 400, "optim.lr: must be a number within float32's range (|x| <= 3.4e+38), got an integer "
                              "of about 400 digits"),
    ("optim.lr=1e300", "optim.lr: must be a number within float32's range"),
    ("optim.weight_decay=1e300", "optim.weight_decay: must be a number within float32's range"),
    ("optim.warmup_epochs=" + "9" * 400, "optim.warmup_epochs: must be a number within float32's range"),
    # MLflow's 500-character limit was a traceback once the store was open; a line break split the closing line
    ("tracking.experiment=" + "x" * 600, "tracking.experiment: must be at most 500 characters (MLflow's limit), got 600"),
    ('tracking.experiment="a\\nb"', "tracking.experiment: must be one line without control characters"),
    ('tracking.run_name="a\\tb"', "tracking.run_name: must be one line without control characters"),
])
def test_numbers_past_float32_and_unusable_names_are_one_line(capsys, setting, match):
    _one_line(capsys, ["train", "--config", QUICK, *FAST, "--set", setting], match)


def test_a_billion_laughs_config_is_refused_at_once(tmp_path, capsys):
    """Nine anchors of nine aliases each (387 million values once expanded): the depth walk visited every
    one for minutes, then the run trained and exited 0. Now refused at the first 100,000 values."""
    import time

    lines = ["seed: 0", "provenance:", "  a: &a [" + ", ".join(['"x"'] * 9) + "]"]
    for prev, cur in zip("abcdefgh", "bcdefghi"):
        lines.append(f"  {cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]")
    f = tmp_path / "laughs.yaml"
    f.write_text("\n".join(lines) + "\n")
    t0 = time.perf_counter()
    _one_line(capsys, ["train", "--config", str(f)], f"{f}: expands to more than 100,000 values")
    assert time.perf_counter() - t0 < 30
    ok = tmp_path / "ok.yaml"  # anchors a config uses for real stay fine
    ok.write_text("epochs: 1\nprovenance:\n  a: &a [1, 2, 3]\n  b: [*a, *a]\n")
    assert load_config(ok).provenance["b"] == [[1, 2, 3], [1, 2, 3]]


def test_profile_out_holding_a_folder_named_as_a_report_file(tmp_path, capsys):
    """--force onto an --out whose report.json is a folder ran the whole profile, then was an
    IsADirectoryError traceback with trace.json half written."""
    (tmp_path / "o" / "report.json").mkdir(parents=True)
    _one_line(capsys, ["profile", "--config", QUICK, *FAST, "--steps", "1", "--out", str(tmp_path / "o"), "--force"],
              f"--out {tmp_path / 'o'}: report.json there is a folder")
    assert [p.name for p in (tmp_path / "o").iterdir()] == ["report.json"]


def test_damaged_search_states_are_listed_and_refused_in_one_line(capsys, monkeypatch, tmp_path):
    """A state without `created` was a KeyError traceback of `triaccel searches` (every search hidden);
    a number as the store's URI an AttributeError traceback of `export`."""
    import json

    monkeypatch.setenv("TRIACCEL_TUNE_DIR", str(tmp_path / "tune"))
    good = {"space": {"name": "s", "trials": 2}, "source": "s.yaml", "sha256": "0" * 64,
            "tracking_uri": f"sqlite:///{tmp_path}/none.db"}
    for name, st in (("nocreated", good), ("numuri", dict(good, tracking_uri=5, created="2026-12-01")),
                     ("numspace", dict(good, space=5, source=1))):
        (tmp_path / "tune" / name).mkdir(parents=True)
        (tmp_path / "tune" / name / "triaccel_search.json").write_text(json.dumps(st))
    rc = main(["searches"])
    out, err = capsys.readouterr()
    assert rc == 0 and "Traceback" not in err, (out, err)
    assert all(n in out for n in ("nocreated", "numuri", "numspace"))
    assert "numuri': its state" in out and "tracking_uri of the wrong kind" in out
    assert "space, source of the wrong kind" in out
    for name in ("numuri", "numspace"):
        _one_line(capsys, ["export", name, "--out", str(tmp_path / "t.yaml")], "of the wrong kind")
    assert not (tmp_path / "t.yaml").exists()


def test_a_config_link_that_leads_nowhere_says_so(tmp_path, capsys):
    """A symlink loop (or a dangling link) was "no such file" of a link that is there."""
    (tmp_path / "a.yaml").symlink_to(tmp_path / "b.yaml")
    (tmp_path / "b.yaml").symlink_to(tmp_path / "a.yaml")
    (tmp_path / "gone.yaml").symlink_to(tmp_path / "missing.yaml")
    for f in ("a.yaml", "gone.yaml"):
        _one_line(capsys, ["train", "--config", str(tmp_path / f)], "a symbolic link that leads to no file")


# --------------------------------------------------------------------------- `triaccel ui` on a port in use
def _ui(tmp_path, *args):
    env = child_env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    try:
        return subprocess.run([sys.executable, "-m", "triaccel.cli", "ui", *args], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("`triaccel ui` started a server instead of refusing")


def test_ui_on_a_port_in_use_is_one_line_and_exit_2(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = _ui(tmp_path, "--port", str(port))
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-500:])
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"triaccel: error: --port {port}: 127.0.0.1:{port} is already in use (")
    assert "MLflow UI" not in r.stdout  # refused before announcing a server


def test_ui_against_an_mlflow_server_points_at_the_servers_own_ui(tmp_path):
    """A team's store is an MLflow server, which serves its own UI: `triaccel ui` says so, where it only said
    that it needs a database store."""
    env = child_env(MLFLOW_TRACKING_URI="http://127.0.0.1:5999")
    r = subprocess.run([sys.executable, "-m", "triaccel.cli", "ui"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 2 and r.stderr == ("triaccel: error: the UI needs a database store; MLFLOW_TRACKING_URI is "
                                              "http://127.0.0.1:5999: an MLflow server, whose own UI is at that "
                                              "address\n"), r.stderr


def test_ui_rejects_a_port_out_of_range(tmp_path):
    r = _ui(tmp_path, "--port", "70000")
    assert r.returncode == 2
    assert r.stderr == "triaccel: error: --port 70000: not a TCP port (1-65535)\n"


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
    assert "efficiency score" in text and "peak GPU memory (GiB)" in text


@pytest.mark.parametrize("args, code", [(["searches"], 0), (["export", "nosuch", "--out", "x.yaml"], 2)])
def test_the_command_exits_with_mains_code_after_atexit_and_every_buffered_byte(tmp_path, args, code):
    """``triaccel`` (cli.entry) skips the interpreter's finalization with os._exit: the atexit handlers
    (Ray's shutdown, logging's flush) still run, block-buffered output still reaches a pipe in full,
    and the exit status is main's."""
    script = ("import atexit, sys\n"
              "from triaccel import cli\n"
              "atexit.register(lambda: sys.stdout.write('atexit ran'))\n"  # buffered, after main's last flush
              "sys.stdout.write('x' * 200000)\n"  # more than a pipe's buffer, still in Python's
              f"sys.argv = ['triaccel', *{args!r}]\n"
              "cli.entry()\n"
              "sys.stderr.write('entry returned\\n')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout block-buffered, as a pipe's is
    r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == code, r.stderr[-2000:]
    assert r.stdout.count("x") >= 200000 and r.stdout.endswith("atexit ran")
    assert "entry returned" not in r.stderr  # it exited there, whatever main returned


def test_the_command_under_cprofile_still_writes_its_profile(tmp_path):
    """Under a profiler the command exits the ordinary way: cProfile writes its file after the program returns."""
    prof = tmp_path / "cli.prof"
    r = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "triaccel.cli", "searches"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert prof.is_file() and prof.stat().st_size > 0


POOL_MODEL = '''
import concurrent.futures
import torch.nn as nn

POOL = concurrent.futures.ThreadPoolExecutor(2)  # as Inductor's compile workers: idle threads, not daemons
POOL.submit(int).result()


def net(num_classes, in_channels, image_size):
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size ** 2, num_classes))
'''


def test_a_command_ends_with_a_thread_pool_left_idle_in_its_process(tmp_path):
    """A compiled run (`--set compile=default`, an empty Inductor cache) printed its result and then never
    exited: the exit joined Inductor's idle thread-pool workers, which only the interpreter's own exit
    tells to end, and SIGTERM could not stop it. A user's model holding an executor is the same case."""
    (tmp_path / "poolmodel.py").write_text(POOL_MODEL)
    r = subprocess.run([sys.executable, "-m", "triaccel.cli", "train", "--config", str(ROOT / "configs" / "quickstart.yaml"),
                        "--set", "epochs=1", "--set", "evaluate_test=false", "--set", "tracking.enabled=false",
                        "--set", "model.class_path=poolmodel.net"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120, env=child_env())
    assert r.returncode == 0 and "val acc" in r.stdout, (r.returncode, r.stderr[-2000:])


def test_ui_in_a_folder_without_a_store_says_so_and_creates_none(tmp_path):
    """It created mlruns/mlflow.db and served an empty UI, with no word that the runs are elsewhere."""
    env = {k: v for k, v in child_env().items() if k != "MLFLOW_TRACKING_URI"}
    r = subprocess.run([sys.executable, "-m", "triaccel.cli", "ui", "--port", "1"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"triaccel: error: no MLflow store in this folder ({tmp_path / 'mlruns' / 'mlflow.db'}): run `triaccel ui` in "
        f"the folder where you ran train or search, or set MLFLOW_TRACKING_URI to the store"], r.stderr
    assert not list(tmp_path.iterdir())
