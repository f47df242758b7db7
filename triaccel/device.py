"""The device a run trains on, and its process-wide settings: device resolution, the Triton
check, the seed, cuDNN autotuning and cuBLAS's workspace."""
from __future__ import annotations

import os
import random
from contextlib import contextmanager

import numpy as np
import torch

from triaccel.config import TrainConfig
from triaccel.errors import TriAccelError


def resolve_device(spec: str) -> torch.device:
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(spec)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise TriAccelError(f"device: {spec} requested but CUDA is not available")
        if dev.index is None:  # an explicit index: some CUDA APIs (memory fraction) refuse a bare "cuda"
            dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def check_triton_device(cfg: TrainConfig, device: torch.device) -> None:
    """Triton kernels run on CUDA, or on the CPU under TRITON_INTERPRET=1 (how CI tests them);
    asked for explicitly anywhere else, the run stops with one line instead of a kernel launch
    error mid-epoch ('auto' picks the torch references there)."""
    if device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return
    for key, val in (("triaccel.kernels", cfg.triaccel.kernels if cfg.mode == "triaccel" else None),
                     ("data.kernel", cfg.data.kernel)):
        if val == "triton":
            raise TriAccelError(f"{key}: triton needs a CUDA device (or TRITON_INTERPRET=1 on the CPU); "
                                f"this run is on {device}: use auto or torch")


_CUBLAS_ENV = "CUBLAS_WORKSPACE_CONFIG"


def _drop_cublas_workspaces() -> None:
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch._C._cuda_clearCublasWorkspaces()


@contextmanager
def cublas_workspace(mib: int | None, log=print):
    """cuBLAS's per-(handle, stream) workspaces sized ``mib`` MiB inside the block, as they were
    after it. torch reads CUBLAS_WORKSPACE_CONFIG whenever it makes a workspace and keeps the
    ones it made, so both edges drop them: the caller must not replay a CUDA graph recorded
    inside the block after it (Trainer.fit releases its graphs first). A CUBLAS_WORKSPACE_CONFIG
    the user set wins (``torch.use_deterministic_algorithms`` needs :4096:8 or :16:8), with a line."""
    prev = os.environ.get(_CUBLAS_ENV)
    if mib is None:
        yield False
        return
    if prev is not None:
        log(f"cublas_workspace_mib: {mib} not applied: CUBLAS_WORKSPACE_CONFIG={prev} is set in the environment")
        yield False
        return
    os.environ[_CUBLAS_ENV] = f":{int(mib) * 1024}:1"
    _drop_cublas_workspaces()
    try:
        yield True
    finally:
        del os.environ[_CUBLAS_ENV]
        _drop_cublas_workspaces()


def cudnn_benchmark_for(cfg: TrainConfig) -> bool:
    """cudnn_benchmark at the start, resolved. null autotunes from the first step, as static AMP does,
    unless the batch controller follows the paper's rule (its size moves every window, and each new
    size would be tuned): there it is off at the start and the control loop turns it on once the
    precision plan settles (or after the first epoch), tuning the batch sizes met after that.

    From the first step because turning it on later tunes nothing already met: torch's cuDNN plan
    cache keys a convolution by shape, dtype, layout, deterministic and allow_tf32, not by
    benchmark, and keeps the untuned choice of every shape run before (bench/results/effnet224/
    cudnn_retune/). A run that met its shapes untuned kept heuristic kernels for good, while the
    static run it is judged against was tuned (EfficientNet-B0 at 32 px on an H100: 2.19 s epochs
    untuned against 1.36-1.63 s tuned; bench/results/effnet_b0/h100_start3_16ep.json). Each new
    batch size or layer dtype is tuned once: a new size's cost is in what the batch controller
    measures before it explores further; a new precision plan's is in its first window, which no
    budget counts (triaccel.precision.plan_budget counts compile seconds)."""
    if cfg.cudnn_benchmark is not None:
        return cfg.cudnn_benchmark
    b = cfg.triaccel.batch
    return not (cfg.mode == "triaccel" and b.enabled and b.policy == "paper")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
