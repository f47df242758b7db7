import functools
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

# Ctrl-C as a terminal delivers it, in every process the tests start: a shell that runs pytest as a
# background job without job control (`pytest &` in a script, a CI runner) starts it with SIGINT
# ignored, and an ignored signal stays ignored in every child (Python keeps SIG_IGN). The searches
# the tests interrupt then ignore the test's SIGINT wherever Tune's own handler is not installed
# (the baselines, the confirm runs, before fit()) and run on to exit 0: three tests failed so.
import signal  # noqa: E402

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import torch  # noqa: E402

# Without a GPU the Triton kernels run under Triton's interpreter (must be set before they are defined).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


# The suite runs in several processes (pytest-xdist, `-n` in pyproject's addopts): an end-to-end
# search spends much of its wall time waiting (Ray's start-up and shut-down, subprocess start), so
# three searches side by side keep the CI machine's two cores busy where one leaves them half idle.
XDIST = bool(os.environ.get("PYTEST_XDIST_WORKER"))
if XDIST:
    # one intra-op thread per process: three test processes with torch's default of one thread per
    # core oversubscribe two cores, and a stalled second thread slows a step a hundredfold; the
    # subprocesses a test starts inherit it (Ray's trials use one thread already)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)

# tests that a module-scoped fixture serves (one search read back by many tests) run in one
# worker, which builds the fixture once; the longest kinds of test are handed out first
_ORDER = {"ray_cluster": 0, "ray_free": 1, "group": 2, "slow": 3}

# Test modules that start no Ray, neither in this process nor in any process they start (unit tests,
# `triaccel train` and `triaccel profile`, which never import Ray): their tests take no lock and run
# beside a `ray_cluster` test, whose `ray stop --force` and `--address auto` concern Ray processes
# alone. The `ray_cluster` tests are one group (one worker runs them, one after another, first);
# these are handed out next, so the other workers train beside them instead of waiting.
RAY_FREE = frozenset({
    "test_callbacks.py", "test_capture.py", "test_cli.py", "test_compiled.py", "test_config.py", "test_conftest.py",
    "test_control.py", "test_controllers.py", "test_curvature.py", "test_data.py", "test_docs.py",
    "test_errors.py", "test_kernels.py", "test_metrics.py", "test_packaging.py", "test_profile.py",
    "test_progress.py", "test_results.py", "test_run_gpu_script.py", "test_scaler.py", "test_schedulers.py",
    "test_search_alone.py", "test_search_sampler.py", "test_space.py", "test_store_lock.py", "test_tracking.py",
    "test_trainer.py",
})


def ray_free(item) -> bool:
    return item.path.name in RAY_FREE


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items):
    def rank(item):
        if item.get_closest_marker("ray_cluster"):
            return _ORDER["ray_cluster"]
        if ray_free(item):
            return _ORDER["ray_free"]
        if any(m.name == "xdist_group" for m in item.iter_markers()):
            return _ORDER["group"]
        return _ORDER["slow"] if item.get_closest_marker("slow") else len(_ORDER)

    for item in items:
        defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        if any(d.scope == "module" for fds in defs.values() for d in fds):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
        if item.get_closest_marker("ray_cluster"):
            item.add_marker(pytest.mark.xdist_group("ray_cluster"))
    items.sort(key=rank)  # stable: each kind keeps its files' order


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")  # after xdist's own hook
def pytest_collection_modifyitems_group_suffix(config, items):
    """The "@group" suffix of each grouped test's nodeid, which ``--dist loadgroup`` schedules by.

    pytest-xdist's worker appends it in its own collection hook by setting ``item._nodeid``; since
    pytest 9.2 a node's id lives in ``item._id`` (a NodeId) and that assignment changes nothing, so
    every worker that drew a test of a module fixture built the fixture again (the build-on
    fixture's three searches three times over). Here the suffix is set as xdist means it, in this
    pytest's attribute; a nodeid that already carries it (xdist on an older pytest) is left as it is."""
    if not getattr(config.option, "loadgroup", False):  # set on xdist's workers under --dist loadgroup
        return
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if not names:
            continue
        if item.nodeid.endswith("@" + "_".join(names)):  # xdist's own, where it takes
            continue
        suffixed = f"{item.nodeid}@{'_'.join(names)}"
        if hasattr(item, "_id"):  # pytest >= 9.2
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(suffixed)
        else:
            item._nodeid = suffixed


_ALONE: list = []  # the lock files a run of ray_cluster tests holds, from the first's set-up to the last's tear-down


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A ``ray_cluster`` test runs with no other test beside it (its `ray start` cluster, `ray stop
    --force`, `--address auto` finding any running Ray): every test holds a shared lock ("room")
    from its set-up to its tear-down, module fixtures included; a ``ray_cluster`` test holds it alone,
    and holds the "turnstile" while it waits so no new test slips in ahead of it (flock has no
    writer preference). The ``ray_cluster`` tests are one group, run one after another by one worker:
    it keeps both locks from the first one's set-up to the last one's tear-down, since between two of
    them the other workers would start tests that the next one then waits for while they run. A test
    of a ``RAY_FREE`` module takes no lock. One process: no locks."""
    if not XDIST or ray_free(item):
        yield
        return
    import fcntl

    folder = Path(item.config._tmp_path_factory.getbasetemp()).parent  # shared by the workers of one run
    if item.get_closest_marker("ray_cluster") is not None:
        if not _ALONE:
            gate, room = open(folder / "triaccel-turnstile.lock", "a"), open(folder / "triaccel-room.lock", "a")
            try:
                fcntl.flock(gate, fcntl.LOCK_EX)
                fcntl.flock(room, fcntl.LOCK_EX)
            except BaseException:
                room.close()
                gate.close()
                raise
            _ALONE[:] = [gate, room]
        try:
            yield
        finally:
            if nextitem is None or nextitem.get_closest_marker("ray_cluster") is None:
                gate, room = _ALONE
                _ALONE.clear()
                room.close()  # closing a file releases its flock
                gate.close()
        return
    with open(folder / "triaccel-turnstile.lock", "a") as gate, open(folder / "triaccel-room.lock", "a") as room:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(room, fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)


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
