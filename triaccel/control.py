"""§3.4 the unified control loop, attached to the Trainer as a callback.

Every step (after unscale, before the update): one launch of the gradient-statistics kernel
gives each layer's sum, sum of squares and non-finite count; the variance EMA
v_l <- beta v_l + (1 - beta) Var[grad_l] is updated on the device. Nothing is read back.

Every ``every`` steps (T_curv): curvature refresh -> per-layer lr scales eta_l / eta_0.

Every ``control_every`` steps (T_ctrl), one host read, then in the paper's order:
  1. statistics: variance EMA, overflow flags, the window's memory peak, built once into one
     frozen ``WindowStats`` that every controller's ``decide`` reads;
  2. precision per layer (variance thresholds, curvature and overflow promotion);
  3. per-layer lr (from the latest curvature decision);
  4. batch size from memory feedback.
Each decision is logged as one row of the trajectory (saved as JSON + CSV + plots).
Each controller can be switched off alone (the paper's Table 2 ablation).

The loop never writes into the trainer: each hook returns its ``Decisions`` (batch,
micro-batch, lr multipliers, precision levels), which ``Trainer.apply`` puts into effect
between steps, the one writer of that state.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F

from triaccel.config import TriAccelConfig
from triaccel.controllers import BatchController, CurvatureController, PlanBudget, PrecisionController, WindowStats
from triaccel.curvature import HessianProbe
from triaccel.kernels import grad_stats, variance_ema
from triaccel.measure import GiB, device_used_fraction, free_device, sync
from triaccel.precision import DTYPES
from triaccel.trainer import Callback, Decisions, Trainer


EXACT_PROBE_MAX_LAYERS = 32  # probe: auto picks exact up to this many layers, batched above


@contextmanager
def no_autotune():
    prev = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = prev


class TriAccelLoop(Callback):
    def __init__(self, cfg: TriAccelConfig, log=print, shared_trials: int = 1):
        self.cfg = cfg
        self.log = log
        self.shared_trials = shared_trials  # >1: trials share the GPU, so NVML pressure matters
        self.trajectory: list[dict] = []
        self.window = 0
        # host seconds spent in each part of the loop, whole run (``summary``: ctrl_*_s): the statistics
        # launches, the curvature refreshes, the control and batch windows (their one host read included,
        # which waits for the device's queued work)
        self.timing = {"stats_s": 0.0, "curvature_s": 0.0, "window_s": 0.0}
        self.pending = Decisions()  # what the hook now running will return to Trainer.apply
        self.probe_ooms = 0
        self.t_start: float | None = None  # this process's first step end: trajectory rows' t_s counts from it

    # ------------------------------------------------------------------ setup
    def on_setup(self, tr):
        c = self.cfg
        rt = tr.precision
        if rt is None:
            raise RuntimeError("TriAccelLoop needs the trainer in mode 'triaccel'")
        dev = tr.device
        self.names = list(rt.names)
        self.L = len(self.names)
        groups = tr.optimizer.param_groups  # one per layer, in the same order, then "_other"
        assert [g["name"] for g in groups[:self.L]] == self.names
        self.tensors = [p for g in groups for p in g["params"]]
        self.tensor_group = [gi for gi, g in enumerate(groups) for _ in g["params"]]  # each tensor's layer row
        self.n_groups = len(groups)
        self.group_numel = torch.tensor([float(sum(p.numel() for p in g["params"])) for g in groups], device=dev)
        self.ema = torch.zeros(self.n_groups, device=dev)
        self.ema_ready = False
        self.nonfinite = torch.zeros(self.n_groups, device=dev)
        self.fisher_acc = torch.zeros(self.n_groups, device=dev)
        self.fisher_n = 0
        self.kernel_backend = "torch" if c.kernels == "torch" else ("triton" if c.kernels == "triton" else "auto")
        # The trainer sets gradients to None between steps, as static AMP does: zeroed in place,
        # autograd would add each new gradient into the old buffer (62 extra kernels a ResNet-18
        # step). The kernels' block tables are cached by address instead.

        self.prec = PrecisionController(c.precision, self.L, initial=tr.cfg.amp_dtype) \
            if c.precision.enabled else None
        # what new plans may cost once: their compiles (none on an eager or captured run)
        self.plan_budget = PlanBudget(c.precision.plan_budget, tr.cfg.epochs * len(tr.train_data)) \
            if self.prec is not None else None
        self.plan_t, self.plan_n, self.plan_held_said = 0.0, 0, False
        self.curv = CurvatureController(c.curvature, self.L) if c.curvature.enabled else None
        self.probe = None
        self.probe_weights = 0  # the trainer's weights_version the probe's graph was captured on
        if self.curv is not None and c.curvature.method == "power":
            probe_mode = c.curvature.probe
            if probe_mode == "auto":
                probe_mode = "exact" if self.L <= EXACT_PROBE_MAX_LAYERS else "batched"
                if probe_mode == "batched":
                    self.log(f"[curvature] probe auto: batched for {self.L} layers (exact costs one Hessian-vector "
                             f"product per layer; set triaccel.curvature.probe: exact to insist)")
            self.probe = HessianProbe(tr.model, [list(ps) for ps in rt.layer_params],
                                      top_k=c.curvature.top_k, max_iters=c.curvature.max_iters, tol=c.curvature.tol,
                                      mode=probe_mode, seed=tr.cfg.seed, graphs=c.curvature.graphs,
                                      log=self.log)
            self.probe_batch: tuple[torch.Tensor, torch.Tensor] | None = None  # fixed buffers: graph-capturable
            self.probe_bs = c.curvature.batch  # halved after an out-of-memory probe
            self.probe_gen = torch.Generator().manual_seed(tr.cfg.seed + 17)
        self.promote = [False] * self.L
        self.lam = [0.0] * self.L
        self.last_var = [0.0] * self.L
        self.needs_stats = self.prec is not None or (self.curv is not None and c.curvature.method == "fisher")

        self.batch = None
        self.budget_bytes = None
        if c.batch.enabled:
            self.budget_bytes = self._budget(tr)
            if self.budget_bytes is None:
                self.log("[batch] no memory budget on this device (set triaccel.batch.budget_gb): "
                         "memory-elastic batch is off")
            else:
                self.batch = BatchController(c.batch, tr.batch_size, tr.micro_batch, self.budget_bytes,
                                             buckets=tr.buckets, run_examples=tr.cfg.epochs * len(tr.train_data))
                inside = [b for b in tr.buckets.sizes if c.batch.min_batch <= b <= c.batch.max_batch] \
                    if tr.buckets is not None else []
                self.log(f"[batch] budget {self.budget_bytes / GiB:.3f} GiB ({tr.meter.source}), "
                         f"policy {c.batch.policy}, mode {c.batch.mode}, B0 {tr.batch_size}"
                         + (f", buckets {', '.join(map(str, inside))}" if inside else ""))
        self.initial_batch = tr.batch_size
        # the batch controller's own window (time and examples since its last decision)
        self.win_t: float | None = None
        self.win_n, self.win_peak, self.win_excluded = 0, 0.0, 0.0
        # a window in which a new precision plan took effect is not measured (its first steps carry the
        # plan's new kernels and, into fp16, the GradScaler's skipped steps)
        self.win_disturbed = False
        # cudnn_benchmark: null is on from the first step (triaccel.device.cudnn_benchmark_for) except
        # under the paper's batch rule, whose size moves every window: there it is off until the plan
        # settles (or the first epoch ends). Switching it on then tunes only shapes met afterwards (the short last
        # batch, evaluation): torch's cuDNN plan cache keeps the untuned choice of every shape already met
        self.autotune_due = tr.device.type == "cuda" and tr.cfg.cudnn_benchmark is None \
            and not torch.backends.cudnn.benchmark
        self.plan_stable = self.prec is None
        self.first_step_s: float | None = None  # this process's first training step, from its epoch's start

    def _budget(self, tr) -> float | None:
        b = self.cfg.batch
        if b.budget_gb is not None:
            return b.budget_gb * GiB
        cap = tr.meter.capacity_bytes()
        if cap is None:
            return None
        if tr.cfg.memory_limit_fraction:
            cap *= tr.cfg.memory_limit_fraction
        return cap * b.budget_fraction

    # ------------------------------------------------------------------ every step
    def on_grads_ready(self, tr, n_examples):
        if not self.needs_stats:
            return  # neither the precision controller nor the Fisher proxy reads them: no launch
        if (tr.step_count + 1) % self.cfg.stats_every:
            return  # sampled every stats_every steps (<= control_every: every window has a sample)
        t0 = time.perf_counter()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.tensors]
        # two launches on CUDA: per-layer sums straight into one row per group, then the EMA update
        per = grad_stats(grads, backend=self.kernel_backend, segments=self.tensor_group,
                         n_segments=self.n_groups)
        beta = self.cfg.precision.beta if self.ema_ready else 0.0  # the first window starts the average
        variance_ema(per, self.group_numel, self.ema, self.nonfinite, self.fisher_acc, beta, n_examples,
                     backend=self.kernel_backend)
        self.ema_ready = True
        if self.curv is not None and self.cfg.curvature.method == "fisher":
            self.fisher_n += 1
        self.timing["stats_s"] += time.perf_counter() - t0

    def on_step_end(self, tr, info) -> Decisions | None:
        self.pending = Decisions()
        self._step_end(tr, info)
        return self._take()

    def _take(self) -> Decisions | None:
        d, self.pending = self.pending, Decisions()
        return None if d == Decisions() else d

    def _now(self, tr, name):
        """A knob's value as this hook leaves it: the pending decision, else the trainer's."""
        v = getattr(self.pending, name)
        return getattr(tr, name) if v is None else v

    def _levels_now(self, tr) -> list[str]:
        lv = self.pending.levels or {}
        return [lv.get(n, cur) for n, cur in zip(self.names, tr.precision.levels())]

    def _lr_scale_now(self, tr) -> list[float]:
        return list((self.pending.lr_scales or tr.lr_scales)[:self.L])

    def _step_end(self, tr, info):
        step = info.step
        if self.t_start is None:
            sync(tr.device)
            self.t_start = time.perf_counter()
            self.first_step_s = self.t_start - tr.epoch_t0 if tr.epoch_t0 is not None else None
            if self.plan_budget is not None:
                self.plan_budget.start(self._compile_s(tr))
        elif self.plan_budget is not None:
            self.plan_n += info.n_examples
        if self.batch is not None:
            if self.win_t is None:  # a window starts after this step (the first step's set-up is not timed)
                sync(tr.device)
                self.win_t, self.win_n, self.win_excluded = time.perf_counter(), 0, 0.0
            else:
                self.win_n += info.n_examples
        if self.curv is not None and self.curv.due(step):
            t0 = time.perf_counter()
            if self.batch is not None and self.batch.exploring:
                sync(tr.device)
                t0 = time.perf_counter()
                self._refresh_curvature(tr)
                sync(tr.device)
                self.win_excluded += time.perf_counter() - t0
            else:
                self._refresh_curvature(tr)
            self.timing["curvature_s"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        if step % self.cfg.control_every == 0:
            self._control_window(tr, step)
        elif self.batch is not None and self.batch.exploring and step % self.cfg.batch.explore_steps == 0:
            self._batch_window(tr, step)
        else:
            return
        self.timing["window_s"] += time.perf_counter() - t0

    def on_epoch_end(self, tr, metrics) -> Decisions | None:
        self.pending = Decisions()
        if self.batch is not None and self.batch.exploring:
            # the score counts the peak of every epoch after the first: exploring ends with it
            bd = self.batch.settle_now()
            self._apply_batch(tr, bd)
        if self.autotune_due:  # a plan still moving after a whole epoch: autotuning waits no longer
            self.plan_stable = True
            self._autotune_if_settled(tr, None)
        metrics.update(self.summary())
        self.win_t = None  # evaluation ran in between: the next batch window starts afresh
        return self._take()

    def on_oom(self, tr, micro_batch) -> Decisions | None:
        """With a batch controller, its ``on_oom`` (``oom_split``) decides the retry's micro-batch and the
        limit on every later size; without one the trainer executes ``oom_split`` itself."""
        if self.batch is None:
            return None
        split = self.batch.on_oom(micro_batch)
        self.log(f"[batch] out of memory at {micro_batch}: no size above {split.limit} from now on")
        d = Decisions(micro_batch=split.micro_batch)
        if self.cfg.batch.mode == "paper":
            d = d.merged(Decisions(batch_size=self.batch.batch,
                                   batch_lr_factor=self.batch.lr_factor(self.initial_batch)))
        return d

    # ------------------------------------------------------------------ curvature
    def _refresh_curvature(self, tr):
        c = self.cfg.curvature
        if c.method == "fisher":
            if self.fisher_n == 0:
                return
            lam = (self.fisher_acc / self.fisher_n).tolist()[:self.L]
            self.fisher_acc.zero_()
            self.fisher_n = 0
            eigs = [[x] for x in lam]
        else:
            if self.probe_bs == 0:
                return  # switched off after running out of memory at a probe batch of one
            n = len(tr.train_data)
            idx = torch.randperm(n, generator=self.probe_gen)[:self.probe_bs]  # never the sampler's examples
            x, y = tr.train_data.batch(idx, train=False)
            if tr.weights_version != self.probe_weights:  # weights stored anew: a graph of the probe
                self.probe.drop_graph()  # captured on the old storage would read freed memory
                self.probe_weights = tr.weights_version
            if self.probe_batch is None or self.probe_batch[0].shape != x.shape:
                self.probe_batch = (x.clone(), y.clone())
                self.probe.drop_graph()  # captured on other tensors
            else:  # same tensors, new values: a CUDA graph of the probe's gradient stays valid
                self.probe_batch[0].copy_(x)
                self.probe_batch[1].copy_(y)
            px, py = self.probe_batch

            def loss_fn():
                out = tr.model(px).float()  # [B, C], or [B, T, V] for a language model: mean over positions
                return F.cross_entropy(out.reshape(-1, out.shape[-1]), py.reshape(-1))

            # every layer at probe_dtype (bf16: tensor-core products; where bf16 is unsupported, the
            # precision runtime's stated fallback)
            eigs = None
            try:  # cuDNN autotuning off: the probe's shapes and dtype would each be tuned once more
                with tr.precision.force(DTYPES[tr.precision.fallback[c.probe_dtype]]), no_autotune():
                    eigs = self.probe.estimate(loss_fn, static_inputs=True)
            except torch.OutOfMemoryError:
                pass  # handled below, outside the except block that holds the probe's tensors
            if eigs is None:
                self._probe_out_of_memory(tr)
                return
        dec = self.curv.decide(WindowStats(self.window, tr.step_count, topk=tuple(tuple(e) for e in eigs)))
        self.lam = list(dec.lam)
        self.promote = list(dec.promote)
        self.pending.lr_scales = tuple(dec.lr_scale)

    def _probe_out_of_memory(self, tr):
        """The Hessian probe ran out of memory: this refresh is skipped (the per-layer lr keeps its
        last values), the probe batch halves, and at a batch of one the refreshes stop. Said once
        per event; the run goes on."""
        free_device(tr.device)
        self.probe.drop_graph()
        self.probe_batch = None
        failed, self.probe_bs = self.probe_bs, self.probe_bs // 2
        self.probe_ooms += 1
        if self.probe_bs:
            self.log(f"[curvature] out of memory in the Hessian probe at batch {failed}: refresh skipped, "
                     f"probe batch now {self.probe_bs}")
        else:
            self.log("[curvature] out of memory in the Hessian probe at batch 1: curvature refreshes are off, "
                     "the per-layer lr keeps its last values")

    # ------------------------------------------------------------------ control window
    def _control_window(self, tr, step):
        self.window += 1
        var = self.ema.tolist()  # the one host read of the window
        self.last_var = var[:self.L]
        overflow = (self.nonfinite > 0).tolist()
        self.nonfinite.zero_()
        # the scale says whether an overflow is the scaler's own search (triaccel.precision.overflow_scale):
        # a second host read, in a window with an overflow only
        loss_scale = tr.scaler.get_scale() if tr.scaler.is_enabled() and any(overflow) else None
        peak = tr.meter.window_peak_bytes()
        new_plan = self._observe_plan_cost(tr)
        batch_decides = self.batch is not None and not (self.batch.exploring and step % self.cfg.batch.explore_steps)
        if self.batch is not None and not batch_decides:
            self.win_peak = max(self.win_peak, peak)  # mid-window: the batch window decides at its own end
        stats = WindowStats(self.window, step, variance=tuple(var[:self.L]), overflow=tuple(overflow[:self.L]),
                            loss_scale=loss_scale,
                            promote=tuple(self.promote) if self.curv is not None else None, new_plan=new_plan,
                            **(self._batch_measures(tr, peak) if batch_decides else {}))
        row = {"window": self.window, "step": step, "epoch": tr.epoch + 1, "t_s": self._t()}
        if self.prec is not None:
            dec = self.prec.decide(stats)
            self.pending.levels = dict(zip(self.names, dec.levels))
            row["precision_changed"] = dec.changed
            if dec.new_plan:
                self.plan_budget.took_new_plan()
            if dec.held:
                row["precision_held"] = dec.held
                self._say_plan_held()
            moved = dec.reasons.count("overflow")
            if moved and loss_scale is not None:
                # the scale fell this low while the moved layers overflowed; the fp16 layers left would
                # run under it, their small gradients flushed to zero, until it grew back (16 doublings
                # of growth_interval steps): it restarts where the run's did and settles again
                self.pending.loss_scale = float(getattr(tr.scaler, "_init_scale", 2.0 ** 16))
                self.log(f"[precision] {moved} layer(s) moved to bf16 on fp16 overflow at loss scale "
                         f"{loss_scale:g}: scale reset to {self.pending.loss_scale:g}")
            # settled: a window after the first decision, changing nothing
            self.plan_stable = self.window >= 2 and dec.changed == 0
        row["peak_mem_gib"] = peak / GiB
        if batch_decides:
            row.update(self._batch_decide(tr, stats))
        if self.prec is not None and dec.changed:
            self.win_disturbed = True  # the batch window now starting runs the new plan's first steps
        self._autotune_if_settled(tr, step)
        row.update(batch_size=self._now(tr, "batch_size"), micro_batch=self._now(tr, "micro_batch"),
                   lr_factor=self._now(tr, "batch_lr_factor"), levels=self._levels_now(tr),
                   variance=var[:self.L], lam=list(self.lam), lr_scale=self._lr_scale_now(tr))
        self.trajectory.append(row)

    @staticmethod
    def _compile_s(tr) -> float:
        return tr.compiled.seconds() if tr.compiled is not None else 0.0

    def _observe_plan_cost(self, tr) -> bool:
        """Feeds the plan budget this window's compile seconds, host seconds and examples (after the
        window's host read, so its device work is in them); whether a new plan is affordable."""
        if self.plan_budget is None:
            return True
        now = self._t()
        self.plan_budget.observe(self._compile_s(tr), now - self.plan_t, self.plan_n)
        self.plan_t, self.plan_n = now, 0
        return self.plan_budget.affordable()

    def _say_plan_held(self):
        if self.plan_held_said:
            return
        self.plan_held_said = True
        b = self.plan_budget
        if b.budget <= 0:
            self.log("[precision] plan held: triaccel.precision.plan_budget is 0, so no new plan is taken "
                     "(an fp16 overflow still moves its layer)")
        else:
            self.log(f"[precision] plan held: a new plan compiles in about {b.switch_s:.1f} s once ({b.spent:.1f} s "
                     f"spent), over {b.budget:.0%} of the run's predicted {b.run_s:.0f} s "
                     f"(triaccel.precision.plan_budget); plans already run and an fp16 overflow's move still apply")

    def _batch_window(self, tr, step):
        """A short window of the batch controller alone (score policy, while it explores)."""
        peak = tr.meter.window_peak_bytes()
        fb = self._batch_decide(tr, WindowStats(self.window, step, **self._batch_measures(tr, peak)))
        self.trajectory.append({"window": self.window, "step": step, "epoch": tr.epoch + 1, "t_s": self._t(),
                                "peak_mem_gib": peak / GiB, **fb, "batch_size": self._now(tr, "batch_size"),
                                "micro_batch": self._now(tr, "micro_batch"),
                                "lr_factor": self._now(tr, "batch_lr_factor"), "levels": self._levels_now(tr),
                                "variance": list(self.last_var), "lam": list(self.lam),
                                "lr_scale": self._lr_scale_now(tr)})

    def _t(self) -> float:
        """Host seconds since this process's first training step: where the run's time went (a window's
        start-up, cuDNN autotuning, an evaluation in between), read against the steps."""
        return round(time.perf_counter() - self.t_start, 3) if self.t_start is not None else 0.0

    def _batch_measures(self, tr, peak: float) -> dict:
        """The batch controller's fields of ``WindowStats``: the peak since its last decision, and the
        window's seconds (curvature refreshes are per step, not per example: not the batch size's cost),
        examples and device pressure."""
        seconds = None
        peak, self.win_peak = max(peak, self.win_peak), 0.0
        disturbed, self.win_disturbed = self.win_disturbed, False
        if self.win_t is not None and self.win_n > 0 and not disturbed:
            sync(tr.device)
            seconds = time.perf_counter() - self.win_t - self.win_excluded
        pressure = False
        if self.shared_trials > 1:
            used = device_used_fraction(tr.device)
            pressure = used is not None and used > self.cfg.batch.rho_high
        return {"peak_bytes": peak, "seconds": seconds, "examples": self.win_n, "pressure": pressure,
                "first_step_s": self.first_step_s}

    def _batch_decide(self, tr, stats: WindowStats) -> dict:
        """The batch controller's decision on ``stats``, applied; its window starts afresh."""
        bd = self.batch.decide(stats)
        self._apply_batch(tr, bd)
        self.win_t, self.win_n, self.win_excluded = time.perf_counter(), 0, 0.0
        return {"batch_action": bd.action, "usage_frac": bd.usage_frac,
                "window_s": stats.seconds if stats.seconds is not None else float("nan")}

    def _apply_batch(self, tr, bd) -> None:
        if bd.action == "settle":
            costs = ", ".join(f"{k}: {v / GiB * 1e6:.3g}" for k, v in sorted(self.batch.costs.items()))
            why = f"{self.batch.why}; " if self.batch.why else ""
            self.log(f"[batch] settled at B={bd.batch} " + (f"({why}cost per example by size: {costs} GiB*us)" if costs
                                                             else "(no size was measured)"))
            b = self.batch
            if b.over_budget:
                self.log(f"[batch] exploring stopped: a new size costs about {b.switch_s:.1f} s once "
                         f"({b.spent:.1f} s spent), over {b.cfg.explore_budget:.0%} of the run's predicted "
                         f"{b.run_s:.0f} s (triaccel.batch.explore_budget)")
        self.pending = self.pending.merged(Decisions(batch_size=bd.batch, micro_batch=bd.micro_batch,
                                                     batch_lr_factor=self.batch.lr_factor(self.initial_batch)))
        if bd.action == "settle":
            self._autotune_if_settled(tr, None)

    def _autotune_if_settled(self, tr, step) -> None:
        """cuDNN autotuning on, once: when the batch no longer explores and the precision plan has settled."""
        if not self.autotune_due or not self.plan_stable or (self.batch is not None and self.batch.exploring):
            return
        self.autotune_due = False
        self.pending.cudnn_benchmark = True
        self.log(f"[control] batch and precision plan settled{f' at step {step}' if step else ''}: "
                 f"cuDNN autotuning on")

    # ------------------------------------------------------------------ reporting
    def summary(self) -> dict:
        if not self.trajectory:
            return {}
        last = self.trajectory[-1]
        lv = last["levels"]
        return {"ctrl_windows": len(self.trajectory), "ctrl_batch_size": last["batch_size"],
                "ctrl_fp16_layers": lv.count("fp16"), "ctrl_bf16_layers": lv.count("bf16"),
                "ctrl_fp32_layers": lv.count("fp32"),
                "ctrl_lr_scale_min": min(last["lr_scale"]) if last["lr_scale"] else 1.0,
                "ctrl_probe_ooms": self.probe_ooms, **{f"ctrl_{k}": v for k, v in self.timing.items()}}

    def write_artifacts(self, folder: Path, plots: bool = True) -> list[Path]:
        from triaccel.report import write_trajectory

        return write_trajectory(self.trajectory, self.names, Path(folder), plots=plots)

    def log_artifacts(self, client, run_id):
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            for p in self.write_artifacts(Path(d)):
                client.log_artifact(run_id, str(p), "triaccel")

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {"window": self.window, "trajectory": self.trajectory, "ema": self.ema.cpu(),
                "ema_ready": self.ema_ready, "lam": self.lam, "promote": self.promote,
                "prec": self.prec.state_dict() if self.prec else None,
                "curv": self.curv.state_dict() if self.curv else None,
                "batch": self.batch.state_dict() if self.batch else None,
                "probe": self.probe.state_dict() if self.probe else None,
                # mid-window accumulators and the probe's batch stream: a resumed run continues exactly
                "fisher_acc": self.fisher_acc.cpu(), "fisher_n": self.fisher_n, "nonfinite": self.nonfinite.cpu(),
                "last_var": list(self.last_var), "probe_bs": getattr(self, "probe_bs", None),
                "probe_gen": self.probe_gen.get_state() if self.probe is not None else None}

    def load_state_dict(self, s: dict) -> None:
        self.window, self.trajectory = s["window"], list(s["trajectory"])
        self.ema.copy_(s["ema"].to(self.ema.device))
        self.ema_ready, self.lam, self.promote = s["ema_ready"], list(s["lam"]), list(s["promote"])
        for obj, key in ((self.prec, "prec"), (self.curv, "curv"), (self.batch, "batch"), (self.probe, "probe")):
            if obj is not None and s.get(key) is not None:
                obj.load_state_dict(s[key])
        if "fisher_acc" in s:  # a checkpoint that lacks these resumes without them
            self.fisher_acc.copy_(s["fisher_acc"].to(self.fisher_acc.device))
            self.nonfinite.copy_(s["nonfinite"].to(self.nonfinite.device))
            self.fisher_n, self.last_var = s["fisher_n"], list(s["last_var"])
            if s.get("probe_bs") is not None:
                self.probe_bs = s["probe_bs"]
            if self.probe is not None and s.get("probe_gen") is not None:
                self.probe_gen.set_state(s["probe_gen"])



def build_trainer(cfg, callbacks=(), log=print, loop_log=None, shared_trials: int = 1, oom_probe=None,
                  setup: bool = True) -> Trainer:
    """The one place a run is wired (CLI, search trials, baselines, profiles, benchmarks): the
    Tri-Accel control loop first in triaccel mode (``trainer.loop``), then the caller's
    callbacks in order (MLflow logger, Tune reporter). Set up unless ``setup=False``."""
    loop = None
    if cfg.mode == "triaccel":
        loop = TriAccelLoop(cfg.triaccel, log=log if loop_log is None else loop_log, shared_trials=shared_trials)
    t = Trainer(cfg, callbacks=([loop] if loop else []) + list(callbacks), log=log, oom_probe=oom_probe)
    t.loop = loop
    return t.setup() if setup else t
