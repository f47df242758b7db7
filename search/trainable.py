"""The Ray Tune function trainable: a thin shell around the Trainer.

Per epoch it reports validation accuracy, epoch time, peak memory, the efficiency score (all
on the held-out validation split; the test set is never evaluated in a search), a
controller summary and how many trials shared the GPU, with a checkpoint so a trial resumes
where it stopped. Inside a Tune function trainable only ``ray.tune.report`` and
``ray.tune.get_checkpoint`` are used (``ray.train.*`` raises under Train v2).
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

import yaml

from triaccel.config import runnable_dict
from triaccel.hooks import Callback

# val_ppl: a language model's (sequence targets) only
REPORT_KEYS = ("epoch", "train_loss", "val_acc", "val_loss", "val_ppl", "epoch_time_s", "epoch_time_last5_s",
               "images_per_s", "peak_mem_gib", "efficiency", "batch_size", "micro_batch", "skipped_steps", "oom_events",
               "lr",
               "ctrl_windows", "ctrl_fp16_layers", "ctrl_bf16_layers", "ctrl_fp32_layers", "ctrl_lr_scale_min",
               "ctrl_probe_ooms", "captures", "graph_keys", "replays", "capture_s", "graph_pool_gib", "graph_resets",
               "compiled_graphs", "compile_s", "graph_breaks", "compile_disabled")


def accuracy_terms(metrics: dict, ref_curve: list | None, margin: float) -> dict:
    """The accuracy constraint for one epoch's result, by the rules of ``triaccel.search.results``:
    ``acc_constraint`` <= 0 is feasible (Optuna's convention); ``search_score`` is what ASHA
    ranks: the efficiency of a feasible trial, minus its shortfall for an infeasible one (below
    every feasible trial)."""
    from triaccel.search.results import curve_gap

    eff = float(metrics["efficiency"])
    gap = curve_gap(metrics, ref_curve)
    if gap is None:
        return {"search_score": eff, "feasible": 1.0}
    constraint = -(gap + margin)
    return {"acc_gap_pp": gap, "acc_constraint": constraint, "feasible": float(constraint <= 0),
            "search_score": eff if constraint <= 0 else -constraint}


class TuneReporter(Callback):
    def __init__(self, shared: int, ref_curve: list | None = None, margin: float = 0.0):
        self.shared = shared
        self.ref_curve = ref_curve
        self.margin = margin

    def on_epoch_end(self, trainer, metrics):
        from ray import tune

        out = {k: float(metrics[k]) for k in REPORT_KEYS if k in metrics}
        out.update(accuracy_terms(out, self.ref_curve, self.margin))
        out["shared_trials"] = self.shared
        out["first_epoch_peak_mem_gib"] = trainer.history.epochs[0]["peak_mem_gib"]
        out[NODE_KEY] = ray_node_id()
        with tempfile.TemporaryDirectory() as d:
            trainer.save(Path(d) / "trainer.pt")
            (Path(d) / "config.yaml").write_text(yaml.safe_dump(runnable_dict(trainer.cfg), sort_keys=False))
            if trainer.loop is not None:
                trainer.loop.write_artifacts(Path(d) / "triaccel", plots=False)  # the driver draws them once
            # the iteration this checkpoint ends (one report per epoch): what restoring a newer checkpoint
            # than the one Tune's saved state names needs (``restore_newest``)
            (Path(d) / ITERATION_FILE).write_text(json.dumps({"training_iteration": int(metrics["epoch"])}))
            tune.report(out, checkpoint=tune.Checkpoint.from_directory(d))


ITERATION_FILE = "iteration.json"
# The Ray node a trial's epoch ran on, in each result: the driver tags the trial's MLflow run with it
# (Tune's own node_ip is the same for two nodes of one host; a resumed trial may move to another node).
NODE_KEY = "ray_node_id"


def ray_node_id() -> str:
    import ray

    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - outside a Ray worker: no node to name
        return ""


def restore_newest(result):
    """The checkpoint a restored trial continues from: the one Tune's saved state names while it exists, else
    the newest of the trial's checkpoints on storage, else None (the trial starts again).

    Tune deletes a trial's older checkpoint on the driver as it registers a new one (num_to_keep), at once;
    the experiment state naming the new one reaches storage later (staged, then synced in the background). A
    driver killed in between leaves a state naming a checkpoint gone from storage, and restoring from that
    state alone fails ("Could not recover from checkpoint as it does not exist on storage anymore"), a
    finished trial included.
    The newer checkpoint is on storage: the trial continues from it (a finished one has nothing left to train).
    """
    import ray.tune
    from ray.train._internal.session import _TrainingResult

    ck = getattr(result, "checkpoint", None)
    if ck is None or Path(ck.path).exists():
        return result
    found = []
    for d in Path(ck.path).parent.glob("checkpoint_*"):
        try:
            found.append((int(json.loads((d / ITERATION_FILE).read_text())["training_iteration"]), d))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # half-written, or written before iterations were recorded
    if not found:
        return None
    it, d = max(found)
    return _TrainingResult(checkpoint=ray.tune.Checkpoint(str(d), filesystem=ck.filesystem),
                           metrics={**(result.metrics or {}), "training_iteration": it})


def trial_class(fn):
    """The Tune trainable class of the trial function ``fn`` (as Tune wraps it), restoring through
    ``restore_newest``; named as ``fn`` is, as Tune's saved state knows the trainable."""
    from ray.tune.trainable.function_trainable import wrap_function

    class SearchTrial(wrap_function(fn)):
        def restore(self, checkpoint_path):
            newest = restore_newest(checkpoint_path)
            if newest is not None:
                return super().restore(newest)

    return SearchTrial


def trial_threads() -> int:
    """CPU threads of each trial's torch (TRIACCEL_TRIAL_THREADS, default 1: trials share the machine's
    cores); checked by the driver before the search starts (an unusable value would fail every trial)."""
    from triaccel.errors import ConfigError

    raw = os.environ.get("TRIACCEL_TRIAL_THREADS", "1")
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= 4096:
        raise ConfigError(f"TRIACCEL_TRIAL_THREADS={raw!r}: must be a whole number of threads in [1, 4096]")
    return n


def run_trial(config: dict, space_data: dict, shared: int, gpu_fraction: float, ref_curve: list | None = None,
              margin: float = 0.0, factories: dict | None = None, reach: tuple[str, str] | None = None,
              workdir: tuple[str, str] | None = None) -> None:
    """One trial: ``config`` holds Optuna's sample; the fixed settings come from the space.
    ``factories``: the model and data functions handed to triaccel.search from Python, by reference.
    ``reach``: the marker the driver wrote into the search's Tune folder and what it holds (check_storage).
    ``workdir``: the folder the search's command runs in and the Ray node it runs on."""
    from ray import tune

    # Tune re-runs a failed trial once (tuner.TRIAL_RETRIES) for a worker or node that was lost; an error the
    # trial raised itself (Diverged, the user's code) would only repeat, so a retry re-raises it at once, first
    # (on a node that does not reach the storage, the storage's error would hide it)
    failed = Path(tune.get_context().get_trial_dir()) / FAILED_FILE
    if failed.is_file():
        with contextlib.suppress(StorageError):
            record_node()
        raise TrialFailed(failed.read_text())
    check_storage(reach)  # before anything is written or trained; not kept for a retry, which may land elsewhere
    record_node()
    # Tune starts each trial in a folder of its own. On the command's own node the trial runs where the command
    # runs: a relative path in the user's init_args means there what it meant to the driver's check of the
    # user's code and to the baselines. Another node's folder of that path may hold something else: not there.
    # Nothing of the trial's own is written relative to it.
    if workdir and workdir[1] == ray_node_id() and os.path.isdir(workdir[0]):
        os.chdir(workdir[0])
    try:
        _train_trial(config, space_data, shared, gpu_fraction, ref_curve, margin, factories)
    except Exception as e:
        with contextlib.suppress(OSError):
            failed.write_text(f"{type(e).__name__}: {e}")
        raise


FAILED_FILE = "triaccel_failed.txt"  # in the trial's own folder on its node: the error it raised, for a retry
# in the trial's folder on the search's storage, which every node reaches (the search checks it): the Ray node the
# trial last started on. Each result names its node too (NODE_KEY); this names it for a trial that fails before
# its first result, whose MLflow run would otherwise not say where it failed
NODE_FILE = "triaccel_node.txt"


class StorageError(RuntimeError):
    """The trial's node does not see the search's Tune folder (``check_storage``)."""


REACH_FILE = ".triaccel_trials_reach"  # in the search's Tune folder: written by the driver as the trials start


def check_storage(reach: tuple[str, str] | None) -> None:
    """The search checks that every node reaches its Tune folder as it starts (cluster.check_nodes_reach). A
    node that joins the cluster later may have no such folder, a disk of its own there, or a read-only one:
    Ray finds out only as the trial saves its first checkpoint, after an epoch of training, and that epoch is
    lost. Here the trial reads, before it trains, the marker the driver wrote into the folder (``reach``: its
    path and the token it holds), and fails in one line naming its node where it is not there."""
    if reach is None:
        return
    path, token = reach
    try:
        seen = Path(path).read_text() == token
    except OSError:
        seen = False
    if not seen:
        raise StorageError(
            f"Ray node {node_named(ray_node_id())} does not reach the search's Tune folder {Path(path).parent} "
            f"(the search checked the nodes alive as it started: this one joined later, or lost the folder since): "
            f"the trial trained nothing there; give that node the shared disk at the same path, or stop it")


def record_node() -> None:
    """Writes this trial's node into its folder on the search's storage; a node that cannot write there (a
    read-only disk at the path) fails the trial here, in one line, before it trains."""
    node = ray_node_id()
    if not node:
        return
    from ray import tune

    try:
        st = tune.get_context().get_storage()
    except Exception:  # noqa: BLE001 - not inside a Tune trial: nothing to record
        return
    try:
        st.storage_filesystem.create_dir(st.trial_fs_path, recursive=True)
        with st.storage_filesystem.open_output_stream(f"{st.trial_fs_path}/{NODE_FILE}") as f:
            f.write(node.encode())
    except OSError as e:
        raise StorageError(
            f"Ray node {node_named(node)} cannot write to the search's Tune folder {st.trial_fs_path} "
            f"({e.strerror or e}): the trial trained nothing there; every node writes trials' checkpoints there") \
            from None


def node_named(node: str) -> str:
    """``node`` (its Ray id) as a line names it: the id's first 12 characters and the node's address."""
    import ray

    with contextlib.suppress(Exception):
        return f"{node[:12]} at {ray.util.get_node_ip_address()}"
    return node[:12]


def recorded_node(trial) -> str | None:
    """The node ``record_node`` wrote for this Tune trial, read on the driver; None where there is none."""
    with contextlib.suppress(Exception):
        st = trial.storage
        with st.storage_filesystem.open_input_stream(f"{st.trial_fs_path}/{NODE_FILE}") as f:
            return f.read().decode().strip() or None
    return None


class TrialFailed(RuntimeError):
    """A retried trial's own error, raised again without training: the first attempt's line is its message."""


def _train_trial(config: dict, space_data: dict, shared: int, gpu_fraction: float, ref_curve: list | None,
                 margin: float, factories: dict | None) -> None:
    import torch
    from ray import tune

    from triaccel.userref import CALLABLES

    CALLABLES.update(factories or {})

    from triaccel.search.space import parse_space

    # the space crosses to this worker as the data it was parsed from: parsed here once, for this trial
    space = parse_space(space_data, source=space_data.get("name", "space"))
    # the driver writes MLflow (one writer for the sqlite store); the search selects on the validation split
    fixed = {"tracking.enabled": False, "evaluate_test": False}
    if torch.cuda.is_available() and gpu_fraction < 1:
        fixed["memory_limit_fraction"] = gpu_fraction  # Ray's fractional GPUs are bookkeeping: cap for real
    cfg = space.train_config(space.resolve(config), fixed)
    torch.set_num_threads(trial_threads())
    from triaccel.control import build_trainer

    trainer = build_trainer(cfg, [TuneReporter(shared, ref_curve, margin)], log=lambda *a: None,
                            shared_trials=shared)
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            trainer.load(Path(d) / "trainer.pt")
    trainer.fit()
