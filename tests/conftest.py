import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import torch  # noqa: E402

# Without a GPU the Triton kernels run under Triton's interpreter (must be set before they are defined).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@functools.lru_cache(maxsize=None)
def template_store() -> Path:
    """An empty MLflow sqlite store, created and migrated once per test process.

    A new sqlite store runs MLflow's schema migrations, seconds on a 2-core machine, and the
    suite makes dozens of stores; a copy of this file is the same store (MLflow creates tables
    only where none exist and checks the schema version of an existing one)."""
    folder = Path(tempfile.mkdtemp(prefix="triaccel-mlflow-template-"))
    db = folder / "mlflow.db"
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    import atexit

    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return db


def seed_store(folder) -> Path | None:
    """Copy the template store to ``folder/mlruns/mlflow.db``, the store a ``triaccel`` run from
    ``folder`` uses by default; nothing happens where a store (or anything else) is already there."""
    mlruns = Path(folder) / "mlruns"
    db = mlruns / "mlflow.db"
    if db.exists() or (mlruns.exists() and not mlruns.is_dir()):
        return None
    mlruns.mkdir(exist_ok=True)
    shutil.copyfile(template_store(), db)
    return db


@pytest.fixture
def tmp_store(tmp_path, monkeypatch):
    """A real sqlite MLflow store in a temporary folder, via MLFLOW_TRACKING_URI (a copy of the template)."""
    shutil.copyfile(template_store(), tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def _is_default_store_search(args, kw) -> bool:
    """A ``python -m triaccel.cli search`` subprocess that will use the default store of its cwd."""
    if isinstance(args, (str, bytes)) or len(args) < 4 or list(args[1:4]) != ["-m", "triaccel.cli", "search"]:
        return False
    env = kw.get("env")
    return "MLFLOW_TRACKING_URI" not in (os.environ if env is None else env) and kw.get("cwd") is not None


_seeding = {"on": True}


@pytest.fixture(scope="session", autouse=True)
def _searches_start_from_the_template_store():
    """End-to-end searches run ``triaccel search`` as a subprocess in a fresh folder, where the
    search would create and migrate its default store: they find the template's copy there
    instead (session-wide, so module-scoped fixtures that search get it too). Tests marked
    ``real_store_creation`` (README's main job) create theirs as a user does."""
    real = subprocess.Popen.__init__

    def init(self, args, *a, **kw):
        if _seeding["on"] and _is_default_store_search(args, kw):
            seed_store(kw["cwd"])
        real(self, args, *a, **kw)

    subprocess.Popen.__init__ = init
    yield
    subprocess.Popen.__init__ = real


@pytest.fixture(autouse=True)
def _real_store_creation(request):
    if request.node.get_closest_marker("real_store_creation"):
        _seeding["on"] = False
        yield
        _seeding["on"] = True
    else:
        yield


def small_cfg(**over):
    """A TrainConfig for fast CPU tests on the digits set."""
    from triaccel.config import load_config

    base = {"epochs": 2, "batch_size": 64, "device": "cpu", "eval_batch_size": 512, "evaluate_test": False,
            "data": {"name": "digits", "crop_padding": 1}, "model": {"name": "small_cnn", "width": 8},
            "optim": {"lr": 0.05, "warmup_epochs": 0.5}, "tracking": {"enabled": False}}
    sets = [f"{k}={v}" for k, v in over.items()]
    return load_config(None, sets, base=base)
