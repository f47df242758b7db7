import functools
import os
import shutil
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


@pytest.fixture
def tmp_store(tmp_path, monkeypatch):
    """A real sqlite MLflow store in a temporary folder, via MLFLOW_TRACKING_URI (a copy of the template)."""
    shutil.copyfile(template_store(), tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def small_cfg(**over):
    """A TrainConfig for fast CPU tests on the digits set."""
    from triaccel.config import load_config

    base = {"epochs": 2, "batch_size": 64, "device": "cpu", "eval_batch_size": 512, "evaluate_test": False,
            "data": {"name": "digits", "crop_padding": 1}, "model": {"name": "small_cnn", "width": 8},
            "optim": {"lr": 0.05, "warmup_epochs": 0.5}, "tracking": {"enabled": False}}
    sets = [f"{k}={v}" for k, v in over.items()]
    return load_config(None, sets, base=base)
