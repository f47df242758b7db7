"""MLflow: where runs land and how they are written.

Default store ``sqlite:///mlruns/mlflow.db`` with artifacts in ``mlruns/artifacts`` (always an
explicit URI: MLflow's own default moved between releases); ``MLFLOW_TRACKING_URI`` wins
when set. Everything goes through ``MlflowClient`` with explicit run ids: no global active
run, so the search driver can hold a parent run and many child runs at once.
Anything that changes during a run (batch size, dtypes, lr scales) is a metric or an
artifact, never a param (MLflow refuses to change a logged param).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import yaml

from triaccel.config import flatten, runnable_dict
from triaccel.errors import ConfigError
from triaccel.hooks import Callback

DEFAULT_URI = "sqlite:///mlruns/mlflow.db"
# Against an MLflow server, MLflow prints two link lines (run, experiment) each time a run ends: a search's
# console is one line per trial, and the summary names the runs. Your own setting wins.
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
NUMERIC = (int, float)


def first_line(e: BaseException) -> str:
    """An error's first line, at most 200 characters (its type where it has no message): one line's worth."""
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:200]


def shown(uri: str) -> str:
    """``uri`` as printed: a password in it (``postgresql+psycopg2://USER:PASSWORD@HOST/DB``) as ``***``, so that
    a terminal, a CI log or a teammate's screen does not carry it; the URI itself is used as given."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    if parts.password is None:
        return uri
    user, _, host = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{user.split(':', 1)[0]}:***@{host}"))


def tracking_uri(explicit: str | None = None, key: str = "tracking.tracking_uri", write: bool = True) -> str:
    """The store's URI; for a relative sqlite store about to be written, its folder made (a read makes none)."""
    uri = explicit or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    if write and uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        folder = Path(uri[len("sqlite:///"):]).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # e.g. a file named mlruns here: one line naming it, not a FileExistsError traceback
            where = key if explicit else ("MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI")
                                          else "the default MLflow store")
            what = "is a file, not a folder" if folder.exists() and not folder.is_dir() else (e.strerror or str(e))
            raise ConfigError(f"{where}: cannot use the MLflow store {shown(uri)} ({folder} {what})") from None
    return uri


def artifact_location(uri: str) -> str | None:
    """Artifacts beside a local sqlite store (mlruns/artifacts); the server decides otherwise."""
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):]).resolve()
        return (db.parent / "artifacts").as_uri()
    return None


_USABLE: set = set()  # stores checked in this process


def client(uri: str | None = None, key: str = "tracking.tracking_uri", write: bool = True):
    """An MlflowClient on the store, checked once per process (``check_store``); ``write=False``: the
    process only reads it (export, searches), which a store on a read-only disk allows."""
    import logging

    logging.getLogger("alembic").setLevel(logging.WARNING)
    # MLflow logs each SQL error with a traceback before raising it; the error itself reaches the CLI's one line
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    from mlflow.tracking import MlflowClient

    if uri is None and key == "tracking.tracking_uri" and os.environ.get("MLFLOW_TRACKING_URI"):
        key = "MLFLOW_TRACKING_URI"  # the store came from the environment: name that, not the unset config key
    u = tracking_uri(uri, key, write)
    if u not in _USABLE:
        check_store(u, key, write)
        _USABLE.add(u)
    from triaccel.store_lock import RetryingClient

    return RetryingClient(MlflowClient(tracking_uri=u), u)


STORE_SCHEMES = {"", "file", "sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks"}


# the key of the PostgreSQL advisory lock that first clients of one database take (any fixed 64-bit number)
PG_LOCK_KEY = 0x7472696163636C


@contextmanager
def _pg_lock(uri: str, key: str):
    """A PostgreSQL store's first client holds a session advisory lock while MLflow creates and migrates its
    tables: two searches started at once on a new database otherwise both create them, and one fails
    (duplicate key in pg_type). Released when the block ends, or by the server if the process dies."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    try:
        engine = create_engine(uri, poolclass=NullPool)
        conn = engine.connect()
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": PG_LOCK_KEY})
    except Exception as e:  # noqa: BLE001 -- no driver, no server, bad credentials: all mean "not usable"
        raise ConfigError(f"{key}: cannot use the MLflow store {shown(uri)} ({first_line(e)})") from None
    try:
        yield
    finally:
        try:
            conn.close()  # ends the session, and with it the lock
        finally:
            engine.dispose()


@contextmanager
def _store_lock(uri: str, key: str = "tracking.tracking_uri", write: bool = True):
    if uri.split(":", 1)[0].split("+", 1)[0] == "postgresql":
        with _pg_lock(uri, key):
            yield
        return
    if not uri.startswith("sqlite:///"):
        yield
        return
    import fcntl

    db = Path(uri[len("sqlite:///"):])
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(f"{db}.lock", os.O_CREAT | os.O_RDWR, 0o644)
    except OSError as e:
        if not write and db.is_file() and db.stat().st_size:
            # a store that exists on a read-only disk or folder: reading it (export, searches) needs no lock,
            # which only keeps two first clients from creating a new store together; a write says so itself
            yield
            return
        raise ConfigError(f"{key}: cannot use the MLflow store {shown(uri)} "
                          f"({db.parent}: {e.strerror or e})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def check_store(uri: str, key: str = "tracking.tracking_uri", write: bool = True) -> None:
    """One line naming ``key`` when the store cannot be used, before anything is trained: an
    unknown scheme, a path that cannot hold a store, or a server that does not answer (MLflow's
    own client retries an unreachable server for minutes)."""
    import urllib.error
    import urllib.request
    from urllib.parse import urlparse

    from mlflow.tracking import MlflowClient

    if re.fullmatch(r"[\w.-]+:\d+/?", uri):  # HOST:PORT, a server's address without its scheme (read as a path)
        raise ConfigError(f"{key}: {uri} has no scheme; an MLflow server is http://{uri.rstrip('/')}")
    scheme = urlparse(uri).scheme
    if scheme.split("+")[0] not in STORE_SCHEMES:  # postgresql+psycopg2: a driver after the +
        raise ConfigError(f"{key}: unknown MLflow store scheme {scheme!r} in {uri} "
                          f"(use sqlite:///PATH, http(s)://HOST:PORT or a database URI)")
    if scheme == "sqlite" and urlparse(uri).path.strip("/") in ("", ":memory:"):
        # sqlite:// (or sqlite:///, :memory:) is a store in this process's memory: a run logged there
        # is gone when the process exits
        raise ConfigError(f"{key}: {uri} is an in-memory sqlite store: every run would be lost when the process "
                          f"ends; give a file, e.g. sqlite:///mlruns/mlflow.db")
    if scheme in ("http", "https"):
        try:
            urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5).close()
        except urllib.error.HTTPError:
            pass  # a server answered (a proxy may not route /health): MLflow's own calls will tell
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ConfigError(f"{key}: no MLflow server answers at {shown(uri)} ({reason})") from None
        # /health answers whoever asks; the API refuses a host name it was not started for (MLflow 3 serves
        # localhost and private addresses unless given --allowed-hosts) or a client without credentials:
        # one call says so here, not as a traceback from the search's first write
        try:
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
        except Exception as e:  # noqa: BLE001 -- MLflow's REST errors: all mean "not usable" here
            msg = first_line(e)
            hint = (": start the server with --allowed-hosts naming the host and port you reach it by"
                    if "Invalid Host header" in str(e) else "")
            raise ConfigError(f"{key}: the MLflow server at {shown(uri)} refused the request ({msg}){hint}") from None
        return
    if scheme == "sqlite" and not write:
        db = Path(uri[len("sqlite:///"):].split("?", 1)[0])  # sqlite:///x.db?timeout=30: the file is x.db
        if not db.is_file():  # a read (export, searches) would create an empty store there and find nothing
            raise ConfigError(f"{key}: no MLflow store at {db}")
    try:
        # A fresh sqlite store is created (schema migrations) by the first client: under a file lock,
        # so two searches started together on a new store do not race in the migrations.
        from triaccel.store_lock import RetryingClient, StoreLocked

        with _store_lock(uri, key, write):
            RetryingClient(MlflowClient(tracking_uri=uri), uri).search_experiments(max_results=1)
    except (ConfigError, StoreLocked):
        raise
    except Exception as e:  # noqa: BLE001 -- MLflow raises many kinds here; all mean "not usable"
        raise ConfigError(f"{key}: cannot use the MLflow store {shown(uri)} ({first_line(e)})") from None


def ensure_experiment(c, name: str, key: str | None = None) -> str:
    exp = c.get_experiment_by_name(name)
    if exp is not None and exp.lifecycle_stage == "deleted":
        # deleted in the MLflow UI: still in the store (its trash), and MLflow refuses new runs in it with a
        # traceback; restoring it silently would undo the user's deletion
        raise ConfigError(f"{key + ': ' if key else ''}MLflow experiment '{name}' in {shown(c.tracking_uri)} is deleted "
                          f"(in the UI's trash): restore it in the MLflow UI, or remove it for good with "
                          f"`mlflow gc --backend-store-uri {c.tracking_uri}`")
    if exp is not None:
        return exp.experiment_id
    try:
        # "custom_model_development": the MLflow UI opens the runs table, not its GenAI overview
        return c.create_experiment(name, artifact_location=artifact_location(c.tracking_uri),
                                   tags={"mlflow.experimentKind": "custom_model_development"})
    except Exception:  # created meanwhile by another process
        return c.get_experiment_by_name(name).experiment_id


def git_revision() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        rev = out.stdout.strip()
        if rev:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                   text=True, timeout=5, cwd=Path(__file__).resolve().parent).stdout.strip()
            return rev + ("-dirty" if dirty else "")
    except Exception:
        pass
    from triaccel import __version__

    return f"release-{__version__}"


def log_metrics(c, run_id: str, metrics: dict, step: int) -> None:
    from mlflow.entities import Metric

    ts = int(time.time() * 1000)
    ms = [Metric(k, float(v), ts, step) for k, v in metrics.items()
          if isinstance(v, NUMERIC) and not isinstance(v, bool)]
    if ms:
        c.log_batch(run_id, metrics=ms)


def log_params(c, run_id: str, params: dict) -> None:
    from mlflow.entities import Param

    items = [Param(k, str(v)[:6000]) for k, v in params.items()]
    for i in range(0, len(items), 100):
        c.log_batch(run_id, params=items[i:i + 100])


def log_yaml_artifact(c, run_id: str, data: dict, name: str, artifact_path: str | None = None) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / name
        p.write_text(yaml.safe_dump(data, sort_keys=False))
        c.log_artifact(run_id, str(p), artifact_path)


def machine_tags(device) -> dict:
    """What trained a run, beside its git revision: the GPU's name (``gpu``, "cpu" on a CPU) and torch's
    version, so that a figure read back from the store says which machine it is from."""
    import torch

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"gpu": gpu, "torch": torch.__version__}


def fresh_run_name() -> str:
    """A run name of MLflow's own kind, drawn from fresh entropy. MLflow draws it from the random module,
    which the trainer has seeded by then: every run of one seed got the same name. The module's state
    is left as it was, so the run stays reproducible."""
    import random

    from mlflow.utils.name_utils import _generate_random_name

    state = random.getstate()
    try:
        random.seed()
        return _generate_random_name()
    finally:
        random.setstate(state)


class MLflowLogger(Callback):
    """Logs one training run: params (the resolved config, flattened), per-epoch metrics,
    the resolved config as an artifact, tags (git revision, device, mode), final summary."""

    def __init__(self, cfg, parent_run_id: str | None = None, extra_tags: dict | None = None,
                 resume_run_id: str | None = None):
        self.cfg = cfg
        self.parent_run_id = parent_run_id
        self.extra_tags = extra_tags or {}
        self.resume_run_id = resume_run_id  # a resumed training's run (triaccel.saving): logged on into
        self.logged: set = set()  # the metrics a resumed run already holds
        self.run_id: str | None = None
        self.client = None

    def on_setup(self, trainer):
        tc = self.cfg.tracking
        self.client = client(tc.tracking_uri)
        if self.resume_run_id is not None and self._reopen():
            return
        exp = ensure_experiment(self.client, tc.experiment, key="tracking.experiment")
        tags = {"git_revision": git_revision(), "device": str(trainer.device), "mode": self.cfg.mode,
                "mem_source": trainer.meter.source, **machine_tags(trainer.device), **self.extra_tags}
        if self.parent_run_id:
            tags["mlflow.parentRunId"] = self.parent_run_id
        run = self.client.create_run(exp, run_name=tc.run_name or fresh_run_name(), tags=tags)
        self.run_id = run.info.run_id
        # the keys the run reads (runnable_dict): a triaccel section under mode amp was recorded as params as if
        # it had trained that way. The provenance of an exported config is free text (keys MLflow refuses as
        # param names, 36 params such as provenance.metrics.efficiency beside the run's own): in config.yaml only
        cfgd = runnable_dict(self.cfg)
        log_params(self.client, self.run_id, flatten({k: v for k, v in cfgd.items() if k != "provenance"}))
        # config.yaml: the run as a file to train again, without the keys it never reads (as an export)
        log_yaml_artifact(self.client, self.run_id, cfgd, "config.yaml")

    def _reopen(self) -> bool:
        """The resumed run's MLflow run, RUNNING again (a SIGKILL left it RUNNING; Ctrl-C closed it KILLED);
        False where this store does not hold it (the resumed training then logs to a new run)."""
        try:
            run = self.client.get_run(self.resume_run_id)
        except Exception:  # noqa: BLE001 -- the run deleted for good: a new run, tagged with the old id
            run = None
        if run is None or run.info.lifecycle_stage != "active":
            self.extra_tags = {**self.extra_tags, "triaccel.resumed_from": self.resume_run_id}
            print(f"triaccel: note: the MLflow run {self.resume_run_id} this training logged to is deleted: the "
                  f"resumed run logs to a new one (tag triaccel.resumed_from)", file=sys.stderr, flush=True)
            return False
        self.run_id = run.info.run_id
        self.logged = set(run.data.metrics)  # a kill in the final evaluation: its final_* not logged twice
        self.client.update_run(self.run_id, status="RUNNING")
        self.client.set_tag(self.run_id, "triaccel.resumed", "true")
        if "failure_reason" in run.data.tags:  # the stop that ended it: not why the run ends now
            self.client.delete_tag(self.run_id, "failure_reason")
        return True

    def catch_up(self, trainer) -> None:
        """Log the restored epochs the run does not hold yet: a kill between the checkpoint and the log."""
        have = {int(m.step) for m in self.client.get_metric_history(self.run_id, "epoch")}
        for metrics in trainer.history.epochs:
            if int(metrics["epoch"]) not in have:
                log_metrics(self.client, self.run_id, metrics, step=metrics["epoch"])

    def on_epoch_end(self, trainer, metrics):
        log_metrics(self.client, self.run_id, metrics, step=metrics["epoch"])

    def on_fit_end(self, trainer, summary):
        final = {f"final_{k}": v for k, v in summary.items()}
        log_metrics(self.client, self.run_id, {k: v for k, v in final.items() if k not in self.logged},
                    step=trainer.epoch)

    def finish(self, status: str = "FINISHED", reason: str | None = None) -> None:
        if self.client is None or self.run_id is None:
            return
        if reason:
            self.client.set_tag(self.run_id, "failure_reason", reason[:5000])
        self.client.set_terminated(self.run_id, status=status)
