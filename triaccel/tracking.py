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
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from triaccel.config import flatten, to_dict
from triaccel.trainer import Callback

DEFAULT_URI = "sqlite:///mlruns/mlflow.db"
NUMERIC = (int, float)


def tracking_uri(explicit: str | None = None) -> str:
    uri = explicit or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    return uri


def artifact_location(uri: str) -> str | None:
    """Artifacts beside a local sqlite store (mlruns/artifacts); the server decides otherwise."""
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):]).resolve()
        return (db.parent / "artifacts").as_uri()
    return None


def client(uri: str | None = None):
    import logging

    for name in ("alembic", "mlflow.store.db.utils"):
        logging.getLogger(name).setLevel(logging.WARNING)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri(uri))


def ensure_experiment(c, name: str) -> str:
    exp = c.get_experiment_by_name(name)
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


class MLflowLogger(Callback):
    """Logs one training run: params (the resolved config, flattened), per-epoch metrics,
    the resolved config as an artifact, tags (git revision, device, mode), final summary."""

    def __init__(self, cfg, parent_run_id: str | None = None, extra_tags: dict | None = None):
        self.cfg = cfg
        self.parent_run_id = parent_run_id
        self.extra_tags = extra_tags or {}
        self.run_id: str | None = None
        self.client = None

    def on_setup(self, trainer):
        tc = self.cfg.tracking
        self.client = client(tc.tracking_uri)
        exp = ensure_experiment(self.client, tc.experiment)
        tags = {"git_revision": git_revision(), "device": str(trainer.device), "mode": self.cfg.mode,
                "mem_source": trainer.meter.source, **self.extra_tags}
        if self.parent_run_id:
            tags["mlflow.parentRunId"] = self.parent_run_id
        run = self.client.create_run(exp, run_name=tc.run_name, tags=tags)
        self.run_id = run.info.run_id
        cfgd = to_dict(self.cfg)
        log_params(self.client, self.run_id, {k: v for k, v in flatten(cfgd).items() if k != "provenance"})
        log_yaml_artifact(self.client, self.run_id, cfgd, "config.yaml")

    def on_epoch_end(self, trainer, metrics):
        log_metrics(self.client, self.run_id, metrics, step=metrics["epoch"])

    def on_fit_end(self, trainer, summary):
        log_metrics(self.client, self.run_id, {f"final_{k}": v for k, v in summary.items()}, step=trainer.epoch)

    def finish(self, status: str = "FINISHED", reason: str | None = None) -> None:
        if self.client is None or self.run_id is None:
            return
        if reason:
            self.client.set_tag(self.run_id, "failure_reason", reason[:5000])
        self.client.set_terminated(self.run_id, status=status)
