"""A Trainer's checkpoint: everything a resumed run needs to continue exactly (model, optimizer,
scaler, schedule, sampler, adaptive state, callbacks, random generators)."""
from __future__ import annotations

import random
from typing import TYPE_CHECKING

import numpy as np
import torch

from triaccel.errors import TriAccelError
from triaccel.hooks import Decisions
from triaccel.precision import store_weight

if TYPE_CHECKING:
    from triaccel.trainer import Trainer


def trainer_state(tr: "Trainer") -> dict:
    tr._settle_skip()  # the schedule saved is exact
    return {"model": tr.model.state_dict(), "optimizer": tr.optimizer.state_dict(),
            "optimizer_kind": type(tr.optimizer).__name__,
            "scaler": tr.scaler.state_dict(), "schedule": tr.schedule.state_dict(),
            "sampler": tr.sampler.state_dict(), "epoch": tr.epoch, "step_count": tr.step_count,
            "history": tr.history.epochs, "batch_size": tr.batch_size, "micro_batch": tr.micro_batch,
            "lr_scales": list(tr.lr_scales), "batch_lr_factor": tr.batch_lr_factor,
            "precision": tr.precision.levels() if tr.precision else None,
            "callbacks": [cb.state_dict() for cb in tr.callbacks],
            "cudnn_benchmark": torch.backends.cudnn.benchmark,  # the paper's batch rule turns it on mid-run
            "rng": {"torch": torch.get_rng_state(), "data": tr.train_data.gen.get_state(),
                    "cuda": torch.cuda.get_rng_state(tr.device) if tr.device.type == "cuda" else None,
                    "python": random.getstate(), "numpy": np.random.get_state()}}

def load_trainer_state(tr: "Trainer", s: dict) -> None:
    kind = s.get("optimizer_kind")
    if kind is not None and kind != type(tr.optimizer).__name__:  # their states do not read each other
        raise TriAccelError(f"checkpoint: its optimizer is {kind}, this run's is {type(tr.optimizer).__name__} "
                            f"(mode or triaccel.precision.optimizer_state differ): resume with the settings it "
                            f"was saved with")
    if tr.precision is not None and tr.precision.bf16_masters:  # weights stored as saved: loaded without rounding
        params = dict(tr.model.named_parameters())
        moved = [(params[k], v.dtype) for k, v in s["model"].items()
                 if k in params and torch.is_tensor(v) and params[k].dtype != v.dtype]
        for p, dt in moved:
            store_weight(p, dt, tr.optimizer)  # its optimizer state is loaded below
        if moved:
            tr.weights_stored_anew()
    tr.model.load_state_dict(s["model"])
    tr.optimizer.load_state_dict(s["optimizer"])
    tr.scaler.load_state_dict(s["scaler"])
    tr.schedule.load_state_dict(s["schedule"])
    tr.sampler.load_state_dict(s["sampler"])
    tr.epoch, tr.step_count = s["epoch"], s["step_count"]
    tr.history.epochs = list(s["history"])
    tr.apply(Decisions(batch_size=s["batch_size"], micro_batch=s["micro_batch"],
                         batch_lr_factor=s["batch_lr_factor"], lr_scales=tuple(s["lr_scales"]),
                         levels=dict(zip(tr.precision.names, s["precision"]))
                         if tr.precision and s["precision"] else None,
                         cudnn_benchmark=s.get("cudnn_benchmark")))
    for cb, st in zip(tr.callbacks, s["callbacks"]):
        cb.load_state_dict(st)
    # generator states are CPU byte tensors; load() maps the whole checkpoint to the device, and
    # set_state refuses a CUDA tensor (every resumed trial on a GPU would fail here)
    torch.set_rng_state(s["rng"]["torch"].cpu())
    tr.train_data.gen.set_state(s["rng"]["data"].cpu())
    if s["rng"].get("cuda") is not None and tr.device.type == "cuda":
        torch.cuda.set_rng_state(s["rng"]["cuda"].cpu(), tr.device)
    if s["rng"].get("python") is not None:
        random.setstate(s["rng"]["python"])
        np.random.set_state(s["rng"]["numpy"])
