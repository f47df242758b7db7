"""The Trainer: setup -> epoch -> step -> (control window) -> report, top to bottom.

Modes:
- ``fp32``: no autocast.
- ``amp``: static mixed precision, one autocast region around forward + loss (bf16 or fp16),
  a GradScaler when fp16.
- ``triaccel``: per-layer autocast regions whose dtypes the Tri-Accel control loop (a
  callback, ``triaccel.control.TriAccelLoop``) changes every control window; one GradScaler
  used whenever any layer is fp16 (none with ``triaccel.precision.half: bf16``).

The step follows the guide (seed 001): forward and loss under autocast; scaled backward
outside it; unscale once; clip; step; update the scaler; the lr schedule advances only when
the update was not skipped. Gradient accumulation is exact: the loss of every micro-batch is
summed over its examples and divided by the real example count of the whole window (known
before the window starts, short last window included), so the accumulated gradient is the
window's mean gradient whatever the micro-batch sizes are.

An out-of-memory step loses nothing: the window's gradients are cleared, the exception is
left behind (recovery runs outside the ``except`` block, which holds frames and tensors), the
cache is emptied, and the same examples run again in the micro-batches ``oom_split``
(``triaccel.controllers.batch``) decides: about half, never again above 0.75 of the failed size.

Callbacks (``Callback``) are the hook point: the Tri-Accel controllers, the MLflow logger
and the Ray Tune reporter attach here and never copy the loop.
"""
from __future__ import annotations

import gc
import math
import os
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn

from triaccel.capture import StepGraphs
from triaccel.compiled import CompiledForward, is_compile_error
from triaccel.checkpoint import load_trainer_state, trainer_state
from triaccel.config import TrainConfig, TriAccelConfig, set_triaccel_keys
from triaccel.controllers.batch import oom_split, resolve_buckets
from triaccel.data import ElasticSampler, ResidentData, load_splits
from triaccel.device import check_triton_device, cublas_workspace, cudnn_benchmark_for, resolve_device, seed_everything
from triaccel.errors import TriAccelError, check_stop, stop_done
from triaccel.hooks import Callback, Decisions, StepInfo  # noqa: F401 (names of this module)
from triaccel.userdef import (TensorData, check_loss_reaches_parameters, check_model_takes, check_user_forward,
                              load_user_splits, training_logits)
from triaccel.measure import MemoryMeter, free_device, sync
from triaccel.metrics import correct_count, efficiency_score, example_loss_sum, run_peak, steady_epoch_time
from triaccel.units import mem_text
from triaccel.models import build_model, enable_checkpointing
from triaccel.optim import GradScaler, make_optimizer, param_groups
from triaccel.precision import DTYPES, PrecisionRuntime, first_half
from triaccel.progress import bar as progress_bar
from triaccel.schedule import WarmupCosine


class Diverged(TriAccelError):
    """The training loss became non-finite."""


class OutOfMemoryBeyondRecovery(TriAccelError):
    """Even a micro-batch of one example does not fit."""


@dataclass
class History:
    epochs: list = field(default_factory=list)  # one metrics dict per epoch


ADAPTIVE = frozenset({"batch_size", "micro_batch", "batch_lr_factor", "lr_scales"})


class Trainer:
    def __setattr__(self, name, value):
        # After setup, the adaptive state changes only through apply(): one point, between steps.
        if name in ADAPTIVE and self.__dict__.get("_sealed") and not self.__dict__.get("_applying"):
            raise AttributeError(f"Trainer.{name} changes only through Trainer.apply (return Decisions from a hook)")
        object.__setattr__(self, name, value)

    def __init__(self, cfg: TrainConfig, callbacks: list[Callback] | None = None, log: Callable = print,
                 oom_probe: Callable[[int], None] | None = None):
        self.cfg = cfg
        self.callbacks = list(callbacks or [])
        self.log = log
        # Called with each micro-batch size before its forward; may raise torch.OutOfMemoryError.
        # Tests inject a memory budget through it; on a GPU real OOMs arrive the same way.
        self.oom_probe = oom_probe
        self.stop = False  # a callback (ASHA through Tune, say) may ask the loop to end
        self.loop = None  # the Tri-Accel control loop, when build_trainer wired one
        self.weights_version = 0  # times the weights were stored anew (bf16 master weights: store_as_levels)

    # ================================================================== setup
    def setup(self) -> "Trainer":
        """Device, data, model, optimizer, the knobs the control loop turns, then the callbacks' own set-up."""
        self._setup_device()
        held_before, data_bytes = self._setup_data()
        self._setup_model()
        self._setup_optimizer()
        self._setup_knobs(held_before, data_bytes)
        self._setup_counters()
        self._sealed = True  # from here on, apply() is the one writer of the adaptive state
        for cb in self.callbacks:
            cb.on_setup(self)
        return self

    def _setup_device(self) -> None:
        cfg = self.cfg
        seed_everything(cfg.seed)
        self.device = resolve_device(cfg.device)
        check_triton_device(cfg, self.device)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = cudnn_benchmark_for(cfg)
            if cfg.memory_limit_fraction:
                torch.cuda.set_per_process_memory_fraction(cfg.memory_limit_fraction, self.device)

    def _setup_data(self) -> tuple[int, int]:
        """The held-out validation split (test touched only by the final evaluation) and the sampler;
        returns (bytes the process held before, bytes the data sets took on the device)."""
        cfg = self.cfg
        # the user's data (data.class_path: triaccel.userdef.UserSplits, batched as it is by TensorData) or a
        # built-in dataset (Splits, augmented and normalised on the device by ResidentData)
        self.user_data = cfg.data.class_path is not None
        self.splits = load_user_splits(cfg.data) if self.user_data else load_splits(cfg.data)
        sp, dc = self.splits, cfg.data
        if self.device.type == "cuda":
            gc.collect()  # an earlier run's garbage goes now, not mid-run under this run's meter baseline
        before = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else 0
        if self.user_data:
            mk = lambda s, aug, seed: None if s is None else TensorData(s, self.device, resident=dc.device_resident,
                                                                        seed=seed)
        else:
            mk = lambda s, aug, seed: ResidentData(s, self.device, sp.mean, sp.std, augment=aug and dc.augment,
                                                   padding=dc.crop_padding, resident=dc.device_resident, seed=seed,
                                                   kernel=dc.kernel)
        self.train_data = mk(sp.train, True, cfg.seed)
        self.val_data = mk(sp.val, False, 0)
        self.test_data = mk(sp.test, False, 0)
        data_bytes = (torch.cuda.memory_allocated(self.device) - before) if self.device.type == "cuda" else 0
        self.sampler = ElasticSampler(len(self.train_data), seed=cfg.seed,
                                      device=self.device if dc.device_resident else None)
        # ``before`` is not this run's: tensors the process held before it (an earlier run in the same process
        # not yet collected: a search's baselines run one after another in its driver, and counting the previous
        # one's tensors would charge a baseline for memory it does not use)
        return before, data_bytes

    def _setup_model(self) -> None:
        """The model on the device (layout, checkpointing) and, in triaccel mode, its per-layer precision."""
        cfg, sp = self.cfg, self.splits
        check_model_takes(cfg.model, sp)
        self.model = build_model(cfg.model, sp.num_classes, sp.in_channels, sp.image_size,
                                 meta=sp.meta if self.user_data else None).to(self.device)
        if cfg.model.class_path is not None or "/" in cfg.model.name:  # the user's or a hub's: checked before it trains
            x, y = self.train_data.batch(torch.arange(min(2, len(self.train_data))), train=False)
            check_user_forward(self.model, x, y, sp.num_classes, cfg.model.label(), half=first_half(cfg, self.device),
                               mode=cfg.mode, key="model.class_path" if cfg.model.class_path else "model.name")
        self.channels_last = cfg.channels_last
        if self.channels_last is None:  # auto: NHWC for conv models on CUDA (NCHW batch-norm kernels are slow there)
            self.channels_last = self.device.type == "cuda" and any(
                isinstance(m, nn.Conv2d) for m in self.model.modules())
        if self.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
            for d in (self.train_data, self.val_data, self.test_data):
                if d is not None:
                    d.channels_last = True
        if cfg.checkpointing:
            enable_checkpointing(self.model, cfg.checkpoint_blocks, log=self.log)
        self.precision: PrecisionRuntime | None = None
        if cfg.mode == "triaccel":
            self.precision = PrecisionRuntime(self.model, self.device, initial=cfg.amp_dtype, log=self.log,
                                              uniform_fast_path=cfg.triaccel.uniform_fast_path,
                                              cpu_fp16=cfg.triaccel.precision.cpu_fp16,
                                              half=cfg.triaccel.precision.half)
            if cfg.triaccel.precision.master_weights == "bf16":
                if self.precision.fallback["bf16"] == "bf16":
                    self.precision.keep_bf16_masters()
                    moved, freed = self.precision.store_as_levels()
                    if moved:
                        self.weights_stored_anew()
                    self.log(f"[precision] master weights in bf16 where a layer computes in 16 bits, updates "
                             f"rounded {cfg.triaccel.precision.rounding} ({freed / 2**20:.2f} MiB of weights freed)")
                else:
                    self.log(f"[precision] master_weights: bf16 is not supported on {self.device}: kept in fp32")
        if cfg.mode != "triaccel" and cfg.triaccel != TriAccelConfig():
            # an exported config switched to mode amp keeps its triaccel section: say it is not read
            # (its optimizer_state: bf16, say, would otherwise seem to apply to the static run)
            self.log(f"[config] mode {cfg.mode}: the triaccel section is not used "
                     f"({', '.join(set_triaccel_keys(cfg.triaccel))} set); it applies in mode: triaccel")

    def _setup_optimizer(self) -> None:
        """Optimizer (one group per layer in triaccel mode), lr schedule and GradScaler."""
        cfg = self.cfg
        groups = param_groups(self.model, per_layer=cfg.mode == "triaccel")
        self.optimizer = make_optimizer(cfg, groups, self.device)
        self.group_names = [g["name"] for g in self.optimizer.param_groups]
        self.lr_scales = (1.0,) * len(groups)  # per-group multipliers (curvature controller)
        self.batch_lr_factor = 1.0  # memory-elastic batch (paper mode) lr rule
        n_train = len(self.train_data)
        self.schedule = WarmupCosine(cfg.epochs * n_train, int(cfg.warmup_epochs() * n_train))
        self.scaler = GradScaler(self.device.type, enabled=self._may_use_fp16())

    def _setup_knobs(self, held_before: int, data_bytes: int) -> None:
        """The knobs the control loop turns, the memory meter, and the captured or compiled step."""
        cfg = self.cfg
        self.batch_size = cfg.batch_size
        self.micro_batch = math.ceil(cfg.batch_size / cfg.accum_steps)
        self.buckets = resolve_buckets(cfg)  # what the elastic batch and OOM splits move between
        self.meter = MemoryMeter(self.device, baseline_bytes=held_before + data_bytes)
        self.held_before_bytes, self.data_bytes = held_before, data_bytes  # what the meter leaves out
        self.graphs: StepGraphs | None = None  # captured micro-batches (triaccel.capture)
        if cfg.capture:
            if self.device.type == "cuda":
                # fresh gradients (triaccel.capture) except under checkpointing: there the gradients, kept
                # live in the pool, fragment it between the recomputed blocks' activations (an H200, the
                # exported ResNet-18 config at B=96: 3 % faster, +10 % peak memory, score -6 %; without
                # checkpointing: 7.7 % faster and 6 % less memory; bench/results/step_gap/h200_step_gap_fresh.json,
                # bench/results/archive/export_vs_static/h200_exported_vs_static_fresh_ckpt.json)
                fresh = not cfg.checkpointing
                self.graphs = StepGraphs(self.device, cap=cfg.capture_cap, log=self.log, meter=self.meter,
                                         params=list(self.model.parameters()) if fresh else None,
                                         zero=self._zero_grads if fresh else None, compiled=cfg.compile is not None)
            else:
                self.log(f"[capture] CUDA graphs need a CUDA device: this run on {self.device} is eager")
        # the training forward through torch.compile (triaccel.compiled); evaluation and probes call self.model
        self.compiled = CompiledForward(self.model, cfg.compile, log=self.log) if cfg.compile else None

    def _setup_counters(self) -> None:
        self.step_count = 0
        self.epoch = 0
        self.history = History()
        self.oom_events = 0
        self.skipped_steps = 0  # optimizer updates the GradScaler skipped, whole run
        self.epoch_t0: float | None = None  # perf_counter at the start of the epoch now training
        self._pending_skip = None  # deferred_skip: (event, examples) of the step whose flag is in flight
        self._skip_flag = None

    def apply(self, d: Decisions | None) -> None:
        """The one point where the adaptive state changes (controllers' decisions, OOM splits,
        restored checkpoints). Called between steps; the next step uses the new values."""
        if d is None:
            return
        shapes_before = (self.batch_size, self.micro_batch, torch.backends.cudnn.benchmark)
        self._applying = True
        try:
            if d.batch_size is not None:
                self.batch_size = int(d.batch_size)
            if d.micro_batch is not None:
                self.micro_batch = int(d.micro_batch)
            if d.batch_lr_factor is not None:
                self.batch_lr_factor = float(d.batch_lr_factor)
            if d.lr_scales is not None:
                k = len(d.lr_scales)
                self.lr_scales = tuple(float(x) for x in d.lr_scales) + tuple(self.lr_scales[k:])
        finally:
            self._applying = False
        if d.levels and self.precision is not None:
            for name, lvl in d.levels.items():
                self.precision.set(name, lvl)
            if self.precision.store_as_levels(self.optimizer)[0]:  # bf16 master weights moved
                self.weights_stored_anew()
        if d.loss_scale is not None and self.scaler.is_enabled():
            self.scaler.update(new_scale=float(d.loss_scale))  # between steps: no step's state is pending
        if d.cudnn_benchmark is not None and self.device.type == "cuda":
            torch.backends.cudnn.benchmark = d.cudnn_benchmark
        if self.graphs is not None and (self.batch_size, self.micro_batch,
                                        torch.backends.cudnn.benchmark) != shapes_before:
            self.graphs.reset()  # new shapes (or algorithms): the old graphs' pool would only add to the peak

    def weights_stored_anew(self) -> None:
        """Weights moved to new storage (bf16 master weights): what captured the old storage drops
        it, the step's graphs now and the curvature probe's graph by ``weights_version``."""
        self.weights_version += 1
        if getattr(self, "graphs", None) is not None:
            self.graphs.reset()

    def _may_use_fp16(self) -> bool:
        if self.cfg.mode == "amp":
            return self.cfg.amp_dtype == "fp16"
        if self.cfg.mode != "triaccel":
            return False
        # half: bf16 runs no level in fp16 where the device has bf16: no scaler at all
        return self.cfg.triaccel.precision.half == "fp16" or self.precision is None or self.precision.may_use_fp16()

    def scaler_active(self) -> bool:
        if self.cfg.mode == "amp":
            return self.cfg.amp_dtype == "fp16"
        return self.precision is not None and self.precision.any_fp16()

    def autocast(self):
        if self.cfg.mode == "amp":
            return torch.autocast(self.device.type, dtype=DTYPES[self.cfg.amp_dtype])
        if self.precision is not None:
            return self.precision.region()  # one region while levels agree, per-layer regions otherwise
        return nullcontext()

    # ================================================================== fit
    @contextmanager
    def cublas_scope(self):
        """Training steps inside run on the config's cuBLAS workspace (``cublas_workspace``);
        the graphs recorded on it are released when it ends, so none replays on freed workspaces."""
        with cublas_workspace(self.cfg.cublas_workspace_mib if self.device.type == "cuda" else None,
                              log=self.log) as sized:
            try:
                yield
            finally:
                if sized and self.graphs is not None:
                    self.graphs.release()

    def fit(self) -> dict:
        """Train the remaining epochs. A stop request (errors.check_stop) ends it at the next step or
        epoch as KeyboardInterrupt, also one whose own exception Python dropped mid-step."""
        try:
            with self.cublas_scope():
                while self.epoch < self.cfg.epochs and not self.stop:
                    check_stop()
                    metrics = self.train_epoch()
                    self.history.epochs.append(metrics)
                    self.epoch += 1
                    for cb in self.callbacks:
                        self.apply(cb.on_epoch_end(self, metrics))
        except KeyboardInterrupt:
            stop_done()  # this run ends here: the next one in this process starts unstopped
            raise
        summary = self.summary()
        if self.cfg.evaluate_test and self.test_data is not None:  # user data may come without a test split
            summary["test_acc"], summary["test_loss"] = self.evaluate(self.test_data)
        for cb in self.callbacks:
            cb.on_fit_end(self, summary)
        return summary

    # ================================================================== epoch
    def train_epoch(self) -> dict:
        self.model.train()
        self.sampler.start_epoch(self.epoch)
        self.meter.start_epoch()
        self.meter.set_persistent(self.model, self.optimizer)
        loss_sum = torch.zeros((), device=self.device)
        n_seen, steps, skipped0 = 0, 0, self.skipped_steps
        pb = progress_bar(self.sampler.remaining, f"epoch {self.epoch + 1}/{self.cfg.epochs}", "img")
        sync(self.device)
        t0 = self.epoch_t0 = time.perf_counter()  # the loop reads the run's first step against it
        while self.sampler.remaining and not self.stop:
            check_stop()
            idx = self.sampler.take(self.batch_size)
            loss, info = self.train_step(idx)
            loss_sum += loss
            n_seen += info.n_examples
            steps += 1
            pb.update(info.n_examples)
            if self.step_count % self.cfg.triaccel.control_every == 0:
                self._check_finite(loss_sum)
        sync(self.device)
        epoch_time = time.perf_counter() - t0
        pb.close()
        self._settle_skip()
        skipped = self.skipped_steps - skipped0
        mem = self.meter.epoch_peaks()  # before evaluation: its larger batches are not training memory

        train_loss = float(loss_sum) / max(1, n_seen)
        if not math.isfinite(train_loss):
            raise Diverged(f"train loss is {train_loss} in epoch {self.epoch + 1}")
        val_acc, val_loss = self.evaluate(self.val_data)
        lm = self.positions_per_example > 1  # sequence targets: accuracy and loss are per next token
        m = {"epoch": self.epoch + 1, "train_loss": train_loss, "val_acc": val_acc, "val_loss": val_loss,
             "epoch_time_s": epoch_time, "images_per_s": n_seen / epoch_time, "steps": steps,
             "skipped_steps": skipped, "examples": n_seen, "batch_size": self.batch_size,
             "micro_batch": self.micro_batch, "lr": self.optimizer.param_groups[0]["lr"],
             "loss_scale": self.scaler.get_scale() if self.scaler.is_enabled() else 1.0,
             "oom_events": self.oom_events}
        m.update(mem)
        if lm:  # a language model's usual figure: exp(mean next-token loss in nats)
            m["val_ppl"] = math.exp(min(val_loss, 700.0))
        if self.graphs is not None:  # counts so far; capture_s is inside epoch_time_s, reported apart too
            m.update(self.graphs.stats())
        if self.compiled is not None:  # likewise compile_s
            m.update(self.compiled.stats())
        times = [e["epoch_time_s"] for e in self.history.epochs] + [epoch_time]
        peak = run_peak([e["peak_mem_gib"] for e in self.history.epochs] + [m["peak_mem_gib"]])
        m["epoch_time_last5_s"] = steady_epoch_time(times)
        m["efficiency"] = efficiency_score(val_acc, m["epoch_time_last5_s"], max(peak, 1e-6))
        self.log(f"epoch {m['epoch']:>3}/{self.cfg.epochs}  loss {train_loss:.4f}  val {val_acc:6.2f}%  "
                 f"{m['images_per_s']:8.0f} {self._rate_unit()}  {epoch_time:6.2f}s  mem {mem_text(m['peak_mem_gib'])}  "
                 f"B {self.batch_size}  eff {m['efficiency']:.2f}")
        return m

    def _rate_unit(self) -> str:
        """The examples the epoch line counts (metric images_per_s, whatever they are): images, sequences
        (a language model's windows) or other examples."""
        if not self.user_data or self.splits.images:
            return "img/s"
        return "seq/s" if self.splits.sequence else "ex/s"

    def _check_finite(self, loss_sum: torch.Tensor) -> None:
        if bool(torch.isfinite(loss_sum)):
            return
        why = ""
        if self.scaler_active():  # under fp16 the count tells an overflowing forward from a diverging one
            self._settle_skip()
            why = (f" ({self.skipped_steps} of its {self.step_count} updates skipped by the GradScaler"
                   + (": fp16 overflows; amp_dtype: bf16 keeps fp32's range)"
                      if self.cfg.mode == "amp" and self.skipped_steps * 2 > self.step_count else ")"))
        raise Diverged(f"train loss became non-finite at step {self.step_count}{why}")

    # ================================================================== step
    def train_step(self, idx: torch.Tensor) -> tuple[torch.Tensor, StepInfo]:
        n = len(idx)
        use_scaler = self.scaler_active()
        deferred = use_scaler and self.cfg.deferred_skip
        if not deferred:
            self._settle_skip()
            self._set_lr(n)

        while True:  # re-run the same examples after an OOM, in smaller micro-batches
            loss = self._accumulate(idx, n, use_scaler)
            if loss is not None:
                break
            self._recover_from_oom()

        if deferred:
            # The previous step's skip flag travelled to the host without a sync while this
            # step's forward and backward were queued; the lr (needed only now) follows it.
            self._settle_skip()
            self._set_lr(n)
        if use_scaler:
            self.scaler.unscale_(self.optimizer)  # once, before clipping and statistics
        for cb in self.callbacks:
            cb.on_grads_ready(self, n)
        if self.cfg.optim.clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.clip_grad_norm)
        skipped: bool | None = False
        if deferred:
            found = sum(self.scaler._found_inf_per_device(self.optimizer).values())  # on the device
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self._defer_skip(found, n)
            skipped = None  # known at the next step (or the epoch's end)
        elif use_scaler:
            old_scale = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            skipped = self.scaler.get_scale() < old_scale  # the scale drops only on a skipped step
        else:
            self.optimizer.step()
        if skipped is False:
            self.schedule.step(n)
        self.skipped_steps += bool(skipped)
        self.step_count += 1
        if self.step_count == 1:  # optimizer state exists now: count it (CPU memory accounting)
            self.meter.set_persistent(self.model, self.optimizer)
        info = StepInfo(self.step_count, n, skipped, use_scaler)
        for cb in self.callbacks:
            self.apply(cb.on_step_end(self, info))
        return loss, info

    def _set_lr(self, n: int) -> None:
        factor = self.schedule.factor(n) * self.batch_lr_factor
        for g, s in zip(self.optimizer.param_groups, self.lr_scales):
            g["lr"] = self.cfg.optim.lr * factor * s

    def _defer_skip(self, found: torch.Tensor, n: int) -> None:
        """Queue a non-blocking copy of this step's found-inf flag to the host (deferred_skip)."""
        if self._skip_flag is None:
            self._skip_flag = torch.zeros((), pin_memory=self.device.type == "cuda")
        self._skip_flag.copy_(found.reshape(()), non_blocking=True)
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        self._pending_skip = (event, n)

    def _settle_skip(self) -> None:
        """The deferred step's outcome: the schedule advances by its examples unless it was skipped."""
        if self._pending_skip is None:
            return
        event, n = self._pending_skip
        self._pending_skip = None
        if event is not None:
            event.synchronize()  # the flag's copy only: later queued work goes on
        if float(self._skip_flag) > 0:
            self.skipped_steps += 1
        else:
            self.schedule.step(n)

    def _zero_grads(self) -> None:
        # Captured graphs add into the gradient buffers they were recorded with: keep them.
        self.optimizer.zero_grad(set_to_none=self.graphs is None)

    def _accumulate(self, idx: torch.Tensor, n: int, use_scaler: bool) -> torch.Tensor | None:
        """Forward/backward over the window in micro-batches; the loss sum, or None after an OOM.

        The gradients start from zero: zeroed here, or, when a captured window starts with a full
        micro-batch, overwritten by its graph (``fresh``: triaccel.capture)."""
        total = torch.zeros((), device=self.device)
        chunks = idx.split(self.micro_batch)
        fresh = self.graphs is not None and self.graphs.fresh_grads and len(chunks[0]) == self.micro_batch
        if not fresh:
            self._zero_grads()

        forward = self.compiled or self.model
        window = None
        if self.compiled is not None:  # (shapes, plan): a window not yet run compiled may fail to compile
            window = (tuple(len(c) for c in chunks), use_scaler, self._plan())
        saved = self.compiled.before_window(window) if self.compiled is not None else None

        def body(x, y, n_):  # one micro-batch; ``n_`` is the window's size (a device scalar when captured)
            with self.meter.track_forward(), self.autocast():
                out = training_logits(forward(x), self.cfg.model)
                loss = example_loss_sum(out.float(), y)
            check_loss_reaches_parameters(loss, self.cfg.model)
            scaled = loss / n_  # the window's real example count: exact accumulation
            (self.scaler.scale(scaled) if use_scaler else scaled).backward()
            return loss.detach()

        try:
            for i, chunk in enumerate(chunks):
                if self.oom_probe is not None:
                    self.oom_probe(len(chunk))
                x, y = self.train_data.batch(chunk, train=True)
                if self.graphs is None:
                    total += body(x, y, n)
                else:
                    total += self.graphs.run(self._graph_key(x, use_scaler), x, y, n, body, fresh=fresh and i == 0)
        except torch.OutOfMemoryError:
            return None  # handled outside the except block, so its frames and tensors are freed
        except Exception as e:  # noqa: BLE001 -- torch's compile errors (forward, or backward at the first backward)
            if self.compiled is None or self.compiled.disabled is not None or not is_compile_error(e):
                raise
            self.compiled.fail(e, saved)  # buffers back as they were before the window
            return self._accumulate(idx, n, use_scaler)  # the same examples, eager, from zeroed gradients
        if self.compiled is not None:
            self.compiled.after_window(window)
        return total

    def _plan(self):
        """The precision plan a captured or compiled graph was made for."""
        return tuple(self.precision.levels()) if self.precision is not None else self.cfg.amp_dtype

    def _graph_key(self, x: torch.Tensor, use_scaler: bool) -> tuple:
        return tuple(x.shape), x.stride(), use_scaler, self._plan()

    def _recover_from_oom(self) -> None:
        """Executes the split of an out-of-memory window: ``oom_split`` decides it, through the batch
        controller's ``on_oom`` where a callback returns a micro-batch, as it is otherwise (no controller:
        no size grows back, so the retry's size holds for the run)."""
        self._zero_grads()
        free_device(self.device)
        failed = self.micro_batch
        if failed <= 1:
            raise OutOfMemoryBeyondRecovery(f"out of memory with a micro-batch of 1 at step {self.step_count}")
        self.oom_events += 1
        d = Decisions()
        for cb in self.callbacks:
            d = d.merged(cb.on_oom(self, failed))
        if d.micro_batch is None:
            d.micro_batch = oom_split(failed, self.batch_size, self.buckets).micro_batch
        self.apply(d)
        self.log(f"[memory] out of memory at micro-batch {failed}: retrying the same examples in "
                 f"micro-batches of {self.micro_batch}")

    # ================================================================== evaluation
    @torch.no_grad()
    def evaluate(self, data: ResidentData, pad: bool | None = None) -> tuple[float, float]:
        """(accuracy %, mean loss) on a split, in the training precision, model in eval mode.

        ``pad`` (default: while cuDNN autotunes, on CUDA) fills a short last batch up to the eval
        batch size with copies of its first example, whose outputs are dropped: every eval batch of
        every split has one shape, so autotuning tunes eval once instead of once per split's
        remainder (val 5,000 and test 10,000 at 1,024 give three shapes; at 224 px each new shape
        is tuned for seconds). Eval-mode outputs are per example, so the padding changes nothing."""
        was_training = self.model.training
        self.model.eval()
        correct = torch.zeros((), device=self.device, dtype=torch.long)
        loss = torch.zeros((), device=self.device)
        positions = 0  # target positions scored: one per image, T per language-model window
        bs = self.cfg.eval_batch_size
        if pad is None:
            pad = self.device.type == "cuda" and torch.backends.cudnn.benchmark
        idx_all = torch.arange(len(data), device=data.y.device)
        for idx in idx_all.split(bs):
            k = len(idx)
            if pad and k < bs < len(data):
                idx = torch.cat([idx, idx[:1].expand(bs - k)])
            x, y = data.batch(idx, train=False)
            with self.autocast():
                out = self.model(x).float()[:k]
            y = y[:k]
            loss += example_loss_sum(out, y)
            correct += correct_count(out, y)
            positions += y.numel()
        self.model.train(was_training)
        n = max(1, len(data))
        self.positions_per_example = positions / n if positions else 1
        return 100.0 * float(correct) / max(1, positions), float(loss) / n

    # ================================================================== results
    def summary(self) -> dict:
        eps = self.history.epochs
        if not eps:
            return {}
        last = eps[-1]
        peak = run_peak([e["peak_mem_gib"] for e in eps])
        t5 = steady_epoch_time([e["epoch_time_s"] for e in eps])
        return {"val_acc": last["val_acc"], "epoch_time_last5_s": t5, "peak_mem_gib": peak,
                "efficiency": efficiency_score(last["val_acc"], t5, max(peak, 1e-6)),
                "peak_mem_first_epoch_gib": eps[0]["peak_mem_gib"],
                "epochs": len(eps), "mem_source": last["mem_source"], "device": str(self.device),
                "images_per_s_last": last["images_per_s"]}

    # ================================================================== checkpoints
    def state_dict(self) -> dict:
        return trainer_state(self)

    def load_state_dict(self, s: dict) -> None:
        load_trainer_state(self, s)

    def save(self, path) -> None:
        tmp = f"{path}.tmp"
        torch.save(self.state_dict(), tmp)
        os.replace(tmp, path)  # atomic: a kill mid-write leaves the previous checkpoint intact

    def load(self, path) -> None:
        self.load_state_dict(torch.load(path, weights_only=False, map_location=self.device))
