"""`triaccel profile`: where the time and memory of a training step go, measured honestly.

Follows the guide's "Finding the real bottleneck" (seed 001):
- the warmed-up step with the real input pipeline against the same shape of batch repeated
  from device memory (the controlled check): a large difference implicates the input path
  (gathering, augmentation, transfers) without saying which part;
- forward, backward and optimizer phases timed separately (CUDA events on a GPU,
  synchronised wall time on a CPU), each with its own memory peak, so the step's peak is
  located, not guessed;
- the first step (allocation, cuDNN autotuning, Triton compilation) reported apart;
- a ``torch.profiler`` trace (CPU, plus CUDA when present; shapes and memory recorded) that
  opens in chrome://tracing or Perfetto, and the top operations;
- for amp and triaccel configs, fp32 beside them, and activation checkpointing off and on.
CPU and GPU totals are never added, and no annotation percentage is called utilisation.
All timing goes through ``triaccel.measure``.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from triaccel.config import TrainConfig, to_dict
from triaccel.measure import GiB, bench, sync
from triaccel.trainer import Trainer

CAVEATS = [
    "real vs repeated: a large gap implicates the input path (gather, augmentation, transfers) but does not say "
    "which part; repeating a batch also removes input variability and may improve caching.",
    "phase times are measured in separate synchronised intervals: their sum can differ from the step time "
    "(the step overlaps host and device work).",
    "CPU and GPU times from the trace are different measurements of overlapping work: they are not added, and "
    "profiler annotation percentages are not utilisation.",
    "recording shapes and memory adds overhead: the trace is not the source of the step times above.",
    "triaccel variants run with the memory-elastic batch held at the config's batch_size, so every variant "
    "is measured at the same batch.",
]


class _Repeated:
    """Stands in for a split: every batch is the same, already on the device."""

    def __init__(self, data, x, y):
        self._data, self.x_, self.y_ = data, x, y
        self.gen = data.gen

    def __len__(self):
        return len(self._data)

    def batch(self, idx, train):
        return self.x_, self.y_


def _trainer(cfg: TrainConfig) -> Trainer:
    from triaccel.control import build_trainer

    return build_trainer(cfg, log=lambda *a: None)


def _take(t: Trainer):
    if t.sampler.remaining < t.batch_size:
        t.sampler.start_epoch(t.sampler.epoch + 1)
    return t.sampler.take(t.batch_size)


def _phases(t: Trainer, x, y, repeats: int) -> dict:
    """Forward, backward, optimizer: median time and memory peak of each, in separate intervals."""
    cuda = t.device.type == "cuda"
    out = {"forward": [], "backward": [], "optimizer": []}
    peaks = {"forward": 0, "backward": 0, "optimizer": 0}
    for _ in range(repeats):
        t.optimizer.zero_grad(set_to_none=True)
        marks = []

        def mark():
            if cuda:
                e = torch.cuda.Event(enable_timing=True)
                e.record()
                marks.append(e)
            else:
                marks.append(time.perf_counter())

        def peak(name):
            if cuda:
                peaks[name] = max(peaks[name], torch.cuda.max_memory_allocated(t.device) - t.meter.baseline)
                torch.cuda.reset_peak_memory_stats(t.device)
            else:
                peaks[name] = max(peaks[name], t.meter._persistent + t.meter._saved_peak)
                t.meter._saved_peak = 0

        sync(t.device)
        if cuda:
            torch.cuda.reset_peak_memory_stats(t.device)
        mark()
        with t.meter.track_forward(), t.autocast():
            logits = (t.compiled or t.model)(x).float()  # the training forward (compile); [B, T, V] for an LM
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        sync(t.device)
        mark()
        peak("forward")
        loss.backward()
        sync(t.device)
        mark()
        peak("backward")
        t.optimizer.step()
        sync(t.device)
        mark()
        peak("optimizer")
        if cuda:
            times = [marks[i].elapsed_time(marks[i + 1]) / 1e3 for i in range(3)]
        else:
            times = [marks[i + 1] - marks[i] for i in range(3)]
        for name, v in zip(out, times):
            out[name].append(v)
    res = {name: {"median_ms": 1e3 * statistics.median(v), "peak_gib": peaks[name] / GiB} for name, v in out.items()}
    res["peak_phase"] = max(peaks, key=peaks.get)
    return res


def profile_variant(cfg: TrainConfig, steps: int, warmup: int, trace_path: Path | None) -> dict:
    """One variant's figures, with the run's cuBLAS workspace as ``fit`` would size it."""
    t = _trainer(cfg)
    with t.cublas_scope():
        return _profile_trainer(t, cfg, steps, warmup, trace_path)


def _profile_trainer(t: Trainer, cfg: TrainConfig, steps: int, warmup: int, trace_path: Path | None) -> dict:
    t.model.train()
    t.meter.start_epoch()
    # first step apart: allocation, autotuning, compilation
    sync(t.device)
    t0 = time.perf_counter()
    t.train_step(_take(t))
    sync(t.device)
    first = time.perf_counter() - t0
    real = bench(lambda: t.train_step(_take(t)), t.device, warmup=warmup, repeats=steps)
    x, y = t.train_data.batch(_take(t), train=True)
    real_data = t.train_data
    t.train_data = _Repeated(real_data, x, y)
    repeated = bench(lambda: t.train_step(_take(t)), t.device, warmup=warmup, repeats=steps)
    t.train_data = real_data
    phases = _phases(t, x, y, repeats=max(3, steps // 2))
    b = t.batch_size
    res = {"mode": cfg.mode, "amp_dtype": cfg.amp_dtype, "checkpointing": cfg.checkpointing, "batch_size": b,
           "device": str(t.device), "first_step_s": first,
           "step_real_ms": 1e3 * real["median_s"], "step_real_std_ms": 1e3 * real["std_s"],
           "step_repeated_ms": 1e3 * repeated["median_s"], "step_repeated_std_ms": 1e3 * repeated["std_s"],
           "images_per_s": b / real["median_s"], "input_share": 1 - repeated["median_s"] / real["median_s"],
           "phases": phases, "mem_source": t.meter.source, "rate_unit": t._rate_unit()}
    if trace_path is not None:
        res["top_ops"] = _trace(t, trace_path)
        res["trace"] = str(trace_path)
    return res


def _trace(t: Trainer, path: Path) -> str:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if t.device.type == "cuda" else [])
    with _quiet_profiler():
        with profile(activities=acts, record_shapes=True, profile_memory=True) as prof:
            for _ in range(3):
                t.train_step(_take(t))
                prof.step()
            sync(t.device)
        prof.export_chrome_trace(str(path))
    key = "self_cuda_time_total" if t.device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=15)


# what torch.profiler's C++ side (kineto, c10) writes to the process's stderr about itself: its start and
# stop, an allocation made before it started, and on a machine without a GPU "ERROR ... gpuGetDeviceCount
# failed"; none is a finding of the profile
PROFILER_NOISE = re.compile(r"USDT:|profiler_start|profiler_stop|gpuGetDeviceCount|"
                            r"allocated before the profiling started|ActivityProfilerController|CuptiActivity")


@contextlib.contextmanager
def _quiet_profiler():
    """The profiler's own lines kept off the terminal (file descriptor 2, where C++ writes); any other
    line written meanwhile is passed on as it was."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            for line in caught.read().decode(errors="replace").splitlines():
                if line.strip() and not PROFILER_NOISE.search(line):
                    print(line, file=sys.stderr)


def variants(cfg: TrainConfig) -> list[tuple[str, TrainConfig]]:
    """The config itself, fp32 beside an amp/triaccel config, and checkpointing off and on."""
    from triaccel.config import TrainConfig, from_dict

    base = to_dict(cfg)
    base["tracking"]["enabled"] = False
    out = []
    modes = [cfg.mode] + (["fp32"] if cfg.mode != "fp32" else [])
    for mode in modes:
        for ck in (False, True):
            d = json.loads(json.dumps(base))
            d["mode"], d["checkpointing"] = mode, ck
            d["triaccel"]["batch"]["enabled"] = False  # profiled at the config's batch: variants stay comparable
            if mode == "fp32" and d["amp_dtype"] == "fp32":
                d["amp_dtype"] = "bf16"
            name = f"{mode}{'' if mode == 'fp32' else '-' + (d['amp_dtype'] if mode == 'amp' else 'tri')}" \
                   f"{'_ckpt' if ck else ''}"
            out.append((name, from_dict(TrainConfig, d)))
    return out


def run_profile(cfg: TrainConfig, steps: int = 20, warmup: int = 5, out_dir: Path | None = None) -> dict:
    out_dir = Path(out_dir or tempfile.mkdtemp(prefix="triaccel-profile-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {"config": to_dict(cfg), "steps": steps, "warmup": warmup, "caveats": CAVEATS, "variants": {}}
    for i, (name, vcfg) in enumerate(variants(cfg)):
        trace = out_dir / "trace.json" if i == 0 else None  # one trace: the config as given
        report["variants"][name] = profile_variant(vcfg, steps, warmup, trace)
    (out_dir / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (out_dir / "report.txt").write_text(format_report(report))
    first = next(iter(report["variants"].values()))
    if "top_ops" in first:
        (out_dir / "top_ops.txt").write_text(first["top_ops"])
    report["out_dir"] = str(out_dir)
    return report


def format_report(report: dict) -> str:
    from triaccel.units import mem_column

    lines = []
    first = next(iter(report["variants"].values()))
    rate = first.get("rate_unit", "img/s")  # images, sequences (a language model's windows) or examples
    peaks = {name: max(v["phases"][p]["peak_gib"] for p in ("forward", "backward", "optimizer"))
             for name, v in report["variants"].items()}
    unit, factor = mem_column(peaks.values())  # MiB where every peak is below 0.1 GiB, as train says them
    head = (f"{'variant':<18} {'B':>5} {'step ms':>9} {'repeated':>9} {'input %':>8} {rate:>9} {'first s':>8} "
            f"{'fwd ms':>8} {'bwd ms':>8} {'opt ms':>8} {'peak ' + unit:>9} {'peak in':>9}")
    lines.append(head)
    for name, v in report["variants"].items():
        ph = v["phases"]
        peak = peaks[name] * factor
        lines.append(f"{name:<18} {v['batch_size']:>5} {v['step_real_ms']:>9.2f} {v['step_repeated_ms']:>9.2f} "
                     f"{100 * v['input_share']:>7.1f}% {v['images_per_s']:>9.0f} {v['first_step_s']:>8.2f} "
                     f"{ph['forward']['median_ms']:>8.2f} {ph['backward']['median_ms']:>8.2f} "
                     f"{ph['optimizer']['median_ms']:>8.2f} {peak:>9.3f} {ph['peak_phase']:>9}")
    lines.append(f"(memory: {first['mem_source']}; medians of {report['steps']} steps after {report['warmup']} "
                 f"warm-up steps; first step reported apart)")
    lines.append("")
    lines += [f"- {c}" for c in report["caveats"]]
    return "\n".join(lines)


REPORT_FILES = ("report.json", "report.txt", "trace.json", "top_ops.txt")  # what a profile writes in --out
MAX_STEPS = 100_000


def cmd_profile(args) -> int:
    from triaccel.config import load_config
    from triaccel.errors import ConfigError

    # --steps 0 would profile every variant's warm-up and then have no median to report; a negative
    # --warmup would act as 0 without a word
    if not 1 <= args.steps <= MAX_STEPS:
        raise ConfigError(f"--steps {args.steps}: must be in [1, {MAX_STEPS}] (timed steps per measurement)")
    if not 0 <= args.warmup <= MAX_STEPS:  # a huge --warmup would run until killed
        raise ConfigError(f"--warmup {args.warmup}: must be in [0, {MAX_STEPS}]")
    cfg = load_config(args.config, args.set)
    if cfg.tracking.enabled:  # an unusable store said before the profile runs, not after (as train does)
        from triaccel.tracking import client

        client(cfg.tracking.tracking_uri)
    if args.out is not None and not getattr(args, "force", False):
        # an earlier profile's report in --out is not replaced without --force (as export refuses)
        old = [f for f in REPORT_FILES if (Path(args.out) / f).exists()]
        if old:
            raise ConfigError(f"--out {args.out}: holds an earlier profile ({', '.join(old)}): give another "
                              f"folder, or --force to replace it")
    if args.out is not None:  # --out naming a file: one line, not a FileExistsError traceback
        try:
            Path(args.out).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            why = "is a file, not a folder" if Path(args.out).exists() else \
                f"cannot create the folder ({e.strerror or e})"
            raise ConfigError(f"--out {args.out}: {why}") from None
        # a folder where a report file goes: refused now, not an IsADirectoryError after the whole profile
        taken = [f for f in REPORT_FILES if (Path(args.out) / f).is_dir()]
        if taken:
            raise ConfigError(f"--out {args.out}: {', '.join(taken)} there is a folder: the profile writes a file "
                              f"of that name")
    from triaccel.api import errors_named_with

    with errors_named_with(args.config, args.set):
        report = run_profile(cfg, steps=args.steps, warmup=args.warmup, out_dir=args.out)
    print(format_report(report))
    out = Path(report["out_dir"])
    print(f"\ntrace: {out / 'trace.json'} (open in chrome://tracing or ui.perfetto.dev); report: {out / 'report.json'}")
    if cfg.tracking.enabled:
        from triaccel.tracking import client, ensure_experiment, git_revision, log_metrics

        c = client(cfg.tracking.tracking_uri)
        exp = ensure_experiment(c, "triaccel-profile")
        run = c.create_run(exp, run_name=f"profile-{cfg.model.name}-{cfg.mode}",
                           tags={"git_revision": git_revision(), "config": str(args.config)})
        for name, v in report["variants"].items():
            log_metrics(c, run.info.run_id, {f"{name}.step_real_ms": v["step_real_ms"],
                                             f"{name}.step_repeated_ms": v["step_repeated_ms"],
                                             f"{name}.images_per_s": v["images_per_s"],
                                             f"{name}.first_step_s": v["first_step_s"],
                                             **{f"{name}.{p}_ms": v["phases"][p]["median_ms"]
                                                for p in ("forward", "backward", "optimizer")},
                                             **{f"{name}.{p}_peak_gib": v["phases"][p]["peak_gib"]
                                                for p in ("forward", "backward", "optimizer")}}, step=0)
        for f in REPORT_FILES:
            if (out / f).is_file():
                c.log_artifact(run.info.run_id, str(out / f))
        c.set_terminated(run.info.run_id)
        print(f"MLflow run {run.info.run_id} in experiment 'triaccel-profile'")
    return 0
