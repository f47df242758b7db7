"""What the end-to-end tests share: the ``triaccel`` command run as a user runs it (a subprocess,
the user's environment), the small search spaces of the digits set, the MLflow store a search
writes in its working folder, Optuna's own trial list, a free port.

Not a test module (no ``test_`` prefix): test files import it (``from _harness import ...``) as
they import conftest, from the tests folder pytest puts on ``sys.path``."""
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from conftest import template_store

# the smallest search: two 1-epoch trials of the digits CNN, no baseline (the search modules' tests)
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

# a search with one baseline and three sampled params (tests/test_build_on.py, tests/test_team.py);
# a wide margin keeps every trial feasible (the margin is tested elsewhere)
DIGITS_SPACE = {
    "name": "b", "objective": "efficiency", "trials": 3, "concurrency": 2, "scheduler": "none",
    "sampler": "random", "seed": 5,
    "baseline": {"batch_sizes": [64], "accuracy_margin": 100.0},
    "train": {"mode": "triaccel", "epochs": 2, "batch_size": 64, "device": "cpu",
              "data": {"name": "digits", "val_fraction": 0.15, "crop_padding": 1},
              "model": {"name": "small_cnn", "width": 8}, "optim": {"lr": 0.05, "warmup_epochs": 1},
              "eval_batch_size": 512,
              "triaccel": {"control_every": 5, "curvature": {"method": "fisher", "every": 10},
                           "batch": {"budget_gb": 0.004, "min_batch": 16}}},
    "params": {
        "triaccel.precision.tau_low": {"distribution": "loguniform", "low": 1e-8, "high": 1e-4},
        "triaccel.precision.tau_high": {"distribution": "loguniform", "low": 1e-6, "high": 1e-1,
                                        "above": "triaccel.precision.tau_low"},
        "triaccel.batch.rho_low": {"distribution": "uniform", "low": 0.3, "high": 0.7},
    },
}


def child_env(*drop, **set_):
    """This process's environment for a child process that runs triaccel as a user does: less the keys
    in ``drop`` and less TRITON_INTERPRET, plus ``set_``. conftest sets TRITON_INTERPRET so that this
    process's tests run the Triton kernels on the CPU; a user's CPU run takes the torch references,
    and a digits search under the interpreter took about 3x the wall time (and Ray's workers inherit
    the variable from the driver)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET" and k not in drop}
    env.update(set_)
    return env


def user_env():
    """A user's environment (``child_env``): no store or Tune folder of the test run's, one intra-op
    thread (on a shared 2-core machine a busy neighbour stalls torch's second thread and the driver's
    in-process baselines slow down a hundredfold; the Ray trials use one already)."""
    return child_env("MLFLOW_TRACKING_URI", "TRIACCEL_TUNE_DIR", OMP_NUM_THREADS="1")


def cli(*args, cwd, timeout=600, env=None):
    """``triaccel ARGS`` in ``cwd``, as a subprocess; its output captured."""
    return subprocess.run([sys.executable, "-m", "triaccel.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env or user_env())


def run_search(cwd, *args, env=None, timeout=600):
    """``triaccel search ARGS`` in ``cwd``."""
    return cli("search", *args, cwd=cwd, timeout=timeout, env=env)


def with_store(folder: Path) -> Path:
    """``folder`` holding the MLflow store a search there writes (mlruns/mlflow.db), a copy of the
    migrated template: MLflow migrates a new sqlite store's schema, seconds on a 2-core machine, and
    a copy is the same store. For tests of what a search does with its store, not of its creation
    (those start from a folder with none)."""
    (folder / "mlruns").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template_store(), folder / "mlruns" / "mlflow.db")
    return folder


def runs(d, name, role=None):
    """(client, runs) of search ``name`` in the store of working folder ``d``; ``role`` one of trial, baseline, parent..."""
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=f"sqlite:///{d}/mlruns/mlflow.db")
    exp = c.get_experiment_by_name("triaccel-search")
    flt = f"tags.`triaccel.search` = '{name}'" + (f" and tags.`triaccel.role` = '{role}'" if role else "")
    return c, c.search_runs([exp.experiment_id], filter_string=flt, max_results=1000)


def free_port() -> int:
    """A loopback port nothing listens on (bound, then closed again when this returns)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def searcher_trials(tune_dir: Path):
    """Optuna's own trial list, from the newest searcher state Tune saved in ``tune_dir`` (the file
    names carry the session's start time; mtimes are equal after Ray's sync)."""
    import pickle

    files = sorted(Path(tune_dir).glob("searcher-state-*.pkl"))
    assert files, "no searcher state"
    with open(files[-1], "rb") as f:
        state = pickle.load(f)

    def find_study(obj, depth=0):
        if depth > 4:
            return None
        if type(obj).__name__ == "Study":
            return obj
        items = obj.items() if isinstance(obj, dict) else getattr(obj, "__dict__", {}).items()
        for _, v in items:
            s = find_study(v, depth + 1)
            if s is not None:
                return s
        return None

    study = find_study(state)
    assert study is not None
    return study.get_trials(deepcopy=False)
