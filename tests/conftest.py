import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import torch  # noqa: E402

# Without a GPU the Triton kernels run under Triton's interpreter (must be set before they are defined).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


# The suite runs in two processes in CI (README: pytest -n 2 --dist loadfile; one search uses about
# one of the CI machine's two cores). A test marked ``exclusive`` runs with no other test beside it:
# `ray stop --force` stops every Ray process on the machine, a neighbour's searches included, and
# `--address auto` would join the cluster it started. Every test holds a shared lock ("room") while
# it runs; an exclusive one holds it alone, and holds the "turnstile" while it waits, so no new
# test slips in ahead of it (flock has no writer preference).
@pytest.fixture(autouse=True)
def _exclusive_tests_run_alone(request, tmp_path_factory):
    import fcntl

    base = tmp_path_factory.getbasetemp()
    folder = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # shared by the workers
    exclusive = request.node.get_closest_marker("exclusive") is not None
    with open(folder / "triaccel-turnstile.lock", "a") as gate, open(folder / "triaccel-room.lock", "a") as room:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(room, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)
            if exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)


@pytest.fixture
def tmp_store(tmp_path, monkeypatch):
    """A real sqlite MLflow store in a temporary folder, via MLFLOW_TRACKING_URI."""
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
