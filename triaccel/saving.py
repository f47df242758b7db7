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

import os
from pathlib import Path

import torch

from triaccel.errors import ConfigError
from triaccel.hooks import Callback

LAST, MODEL = "last.pt", "model.pt"


def write_atomic(obj, path: Path) -> None:
    """``torch.save`` under a temporary name, then renamed: a kill mid-write leaves the previous file whole."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def open_folder(save_dir: str, resume: bool) -> tuple[Path, dict | None]:
    """The folder of ``--save`` and, with ``resume``, the checkpoint in it. A folder holding an earlier run's
    files is refused without ``resume``: its checkpoint and model are never written over."""
    p = Path(save_dir).expanduser()
    if p.exists() and not p.is_dir():
        raise ConfigError(f"--save {save_dir}: is a file, not a folder")
    if resume:
        last = p / LAST
        if not last.is_file():
            raise ConfigError(f"--resume: no checkpoint in {save_dir} ({LAST} is written after every epoch of a "
                              f"run trained with --save {save_dir}); without --resume a run starts there anew")
        try:
            return p, torch.load(last, map_location="cpu", weights_only=False)
        except Exception as e:  # noqa: BLE001 -- a truncated or foreign file: one line naming it
            raise ConfigError(f"--resume: {last} cannot be read as a checkpoint ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
    held = [n for n in (LAST, MODEL) if (p / n).exists()]
    if held:
        raise ConfigError(f"--save {save_dir}: holds an earlier run's {' and '.join(held)}: `--resume` continues "
                          f"that run; another folder starts a new one")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--save {save_dir}: cannot create the folder ({e.strerror or e})") from None
    return p, None


def check_resumable(saved: dict, cfg_dict: dict, save_dir: str) -> None:
    """The run resumed is the run saved: the same config, key for key (its length included: the lr schedule
    was laid out over it)."""
    from triaccel.config import flatten

    a, b = flatten(saved.get("config") or {}), flatten(cfg_dict)
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            raise ConfigError(f"--resume: the checkpoint in {save_dir} was saved by a run with {key} "
                              f"{a.get(key)!r}, this config has {b.get(key)!r}: resume with the config it was "
                              f"started with (a longer run: train anew)")


class Checkpointer(Callback):
    """After every epoch, ``DIR/last.pt``: the training state, the config and the MLflow run logged to."""

    def __init__(self, folder: Path, cfg_dict: dict, logger=None):
        self.folder, self.cfg_dict, self.logger = folder, cfg_dict, logger

    def on_epoch_end(self, trainer, metrics):
        write_atomic({"trainer": trainer.state_dict(), "config": self.cfg_dict,
                      "mlflow_run_id": self.logger.run_id if self.logger is not None else None},
                     self.folder / LAST)


def model_file(trainer, cfg, summary: dict) -> dict:
    """What ``model.pt`` holds: the weights (each in the dtype it trained in), the config that trained them
    (the keys it reads) and what the data gave the model factory, so that load_model builds it again."""
    from triaccel.config import runnable_dict

    sp = trainer.splits
    return {"model": trainer.model.state_dict(), "config": runnable_dict(cfg),
            "build": {"num_classes": sp.num_classes, "in_channels": sp.in_channels, "image_size": sp.image_size,
                      "meta": sp.meta if trainer.user_data else None},
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
