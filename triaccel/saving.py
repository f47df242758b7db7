"""What a production run keeps: its trained model, and with a folder to save in, its checkpoint.

``triaccel train`` logs the trained model (``model.pt``: the weights, the config that trained them and
what the data gave the model factory) to the run's MLflow artifacts. With ``--save DIR`` it also writes
``DIR/last.pt`` after every epoch, the whole training state (triaccel.checkpoint: model, optimizer,
scaler, schedule, sampler, the controllers' state and every random generator) with the MLflow run it logs
to, and ``DIR/model.pt`` at the end. ``--resume`` continues from ``DIR/last.pt`` exactly where the last
finished epoch left it, logging on into the same MLflow run (a run killed by SIGKILL, left RUNNING, is
closed by the resumed run's end). ``load_model`` builds the model from a ``model.pt`` for inference.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

from triaccel.errors import ConfigError, TriAccelError
from triaccel.hooks import Callback

LAST, MODEL, LOCK = "last.pt", "model.pt", "train.lock"


def write_atomic(obj, path: Path) -> None:
    """``torch.save`` under a temporary name, then renamed: a kill mid-write leaves the previous file whole."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):  # a folder gone read-only: the write's own error is the one to say
            tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def save_folder(save_dir: str, resume: bool):
    """The folder of ``--save``, held by this run alone (an exclusive lock on ``DIR/train.lock``: a second
    training on it, resumed or new, is refused), and with ``resume`` the checkpoint in it: yields (folder,
    checkpoint or None). Without ``resume`` a folder holding an earlier run's files is refused: its
    checkpoint and model are never written over. Temporary files a killed write left are removed."""
    import fcntl

    p = Path(save_dir).expanduser()
    if p.exists() and not p.is_dir():
        raise ConfigError(f"--save {save_dir}: is a file, not a folder")
    if resume and not (p / LAST).is_file():
        raise ConfigError(f"--resume: no checkpoint in {save_dir} ({LAST} is written when a run trained with "
                          f"--save {save_dir} starts and after every epoch); without --resume a run starts there anew")
    try:
        p.mkdir(parents=True, exist_ok=True)
        lock = open(p / LOCK, "a")
    except OSError as e:
        raise ConfigError(f"--save {save_dir}: cannot write there ({e.strerror or e})") from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ConfigError(f"--save {save_dir}: another training is using this folder now; wait for it to "
                              f"end, or save elsewhere") from None
        for stale in p.glob(".*.pt.*.tmp"):  # a write a kill cut short (ours is the only writer now)
            with contextlib.suppress(OSError):
                stale.unlink()
        saved = None
        if resume:
            saved = _read_checkpoint(p / LAST)
            if (p / MODEL).exists():
                raise ConfigError(f"--resume: the run in {save_dir} has finished (its model is {p / MODEL}): "
                                  f"nothing is left to train")
        else:
            held = [n for n in (LAST, MODEL) if (p / n).exists()]
            if held:
                raise ConfigError(f"--save {save_dir}: holds an earlier run's {' and '.join(held)}: `--resume` "
                                  f"continues that run; another folder starts a new one")
        yield p, saved


def _read_checkpoint(last: Path) -> dict:
    try:
        saved = torch.load(last, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 -- a truncated or foreign file: one line naming it
        from triaccel.tracking import first_line

        raise ConfigError(f"--resume: {last} cannot be read as a checkpoint ({type(e).__name__}: "
                          f"{first_line(e)})") from None
    if not isinstance(saved, dict) or not {"trainer", "config"} <= saved.keys():
        raise ConfigError(f"--resume: {last} is not a checkpoint of triaccel train --save")
    return saved


def check_resumable(saved: dict, cfg_dict: dict, save_dir: str, uri: str | None) -> None:
    """The run resumed is the run saved: the same config, key for key (its length included: the lr schedule
    was laid out over it), logging to the same MLflow store (elsewhere the run would fork, the original left
    RUNNING)."""
    from triaccel.config import flatten
    from triaccel.tracking import shown

    a, b = flatten(saved.get("config") or {}), flatten(cfg_dict)
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            longer = " (a longer run: train anew)" if key == "epochs" else ""
            raise ConfigError(f"--resume: the checkpoint in {save_dir} was saved by a run with {key} "
                              f"{a.get(key)!r}, this config has {b.get(key)!r}: resume with the config it was "
                              f"started with{longer}")
    was = saved.get("tracking_uri")
    if was is not None and uri is not None and was != uri:
        raise ConfigError(f"--resume: the run logged to the MLflow store {shown(was)}, this one would log to "
                          f"{shown(uri)}: resume with MLFLOW_TRACKING_URI={shown(was)} (its run is continued there)")


class Checkpointer(Callback):
    """``DIR/last.pt`` when the run starts and after every epoch: the training state, the config and the
    MLflow run and store logged to."""

    def __init__(self, folder: Path, cfg_dict: dict, logger=None, uri: str | None = None):
        self.folder, self.cfg_dict, self.logger, self.uri = folder, cfg_dict, logger, uri

    def save(self, trainer) -> None:
        try:
            write_atomic({"trainer": trainer.state_dict(), "config": self.cfg_dict, "tracking_uri": self.uri,
                          "mlflow_run_id": self.logger.run_id if self.logger is not None else None},
                         self.folder / LAST)
        except OSError as e:
            from triaccel.errors import disk_full

            if disk_full(e):
                raise
            raise TriAccelError(f"--save {self.folder}: cannot write {LAST} ({e.strerror or e}); the run stopped "
                                f"after epoch {trainer.epoch}") from None

    def on_epoch_end(self, trainer, metrics):
        self.save(trainer)


def model_file(trainer, cfg, summary: dict) -> dict:
    """What ``model.pt`` holds: the weights (each in the dtype it trained in), the config that trained them
    (the keys it reads) and what the data gave the model factory, so that load_model builds it again."""
    from triaccel.config import runnable_dict

    sp = trainer.splits
    # the built-in image sets' inputs: uint8 pixels / 255, less mean, over std, per channel (the user's data
    # reaches the model as the factory returned it)
    norm = {} if trainer.user_data else {"mean": list(sp.mean), "std": list(sp.std)}
    return {"model": trainer.model.state_dict(), "config": runnable_dict(cfg),
            "build": {"num_classes": sp.num_classes, "in_channels": sp.in_channels, "image_size": sp.image_size,
                      "meta": sp.meta if trainer.user_data else None},
            "inputs": norm,
            "summary": {k: v for k, v in summary.items() if isinstance(v, (int, float, str))}}


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu") -> torch.nn.Module:
    """The trained model in ``path`` (a ``model.pt`` of ``triaccel train``), built from its config and in
    eval mode: the user's model factory is imported as the config names it."""
    from triaccel.config import TrainConfig, from_dict
    from triaccel.models import build_model

    try:
        saved = torch.load(path, map_location=device, weights_only=False)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except Exception as e:  # noqa: BLE001 -- a text file, a truncated one: one line naming it
        raise ConfigError(f"{path}: not a model.pt of triaccel train ({type(e).__name__})") from None
    missing = [k for k in ("model", "config", "build") if not isinstance(saved, dict) or k not in saved]
    if missing:
        raise ConfigError(f"{path}: not a model.pt of triaccel train (no {', '.join(missing)})")
    cfg, build = from_dict(TrainConfig, saved["config"]), saved["build"]
    model = build_model(cfg.model, build["num_classes"], build["in_channels"], build["image_size"],
                        meta=build["meta"])
    model.load_state_dict(saved["model"])
    return model.to(device).eval()
