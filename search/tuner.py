"""Optuna inside Ray Tune: the sampler (Optuna with the accuracy constraint and the start points), the
trainable with its resources, the scheduler, and Tune's saved state (what ``resume`` restores, and how
many trials it has left)."""
from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

from triaccel.errors import ConfigError, Interrupted, TriAccelError
from triaccel.search.cluster import gpu_share, on_gpu
from triaccel.search.space import FOLLOWS, NEAR, START, SearchSpace, start_points
from triaccel.search.state import EXPERIMENT, again, extension_folders, tune_root


def _constrained_optuna():
    from ray.tune.search.optuna import OptunaSearch

    from triaccel.search.sampler import NEAR_ATTR

    class AccuracyConstrainedOptuna(OptunaSearch):
        """Ray's OptunaSearch that hands Optuna the accuracy constraint with each result
        (``acc_constraint`` <= 0: feasible), so TPE models infeasible trials as infeasible
        instead of as low scores."""

        def __init__(self, *args, start=(), seeds=(), **kw):
            self._start = [dict(p) for p in start]
            self._seeds = list(seeds)  # earlier trials, as Optuna FrozenTrials (search.extend)
            self.seen_before_first = None  # completed trials the study held at the first suggestion
            super().__init__(*args, **kw)

        def _setup_study(self, mode):
            super()._setup_study(mode)
            for t in self._seeds:  # the sampler models them as it models the trials it ran itself
                self._ot_study.add_trial(t)
            # the space's start points, partial ones too (Ray's points_to_evaluate needs every key):
            # Optuna runs enqueued trials first, as given, and samples the keys a point leaves out
            for point in self._start:
                self._ot_study.enqueue_trial(point, skip_if_exists=True)

        def suggest(self, trial_id):
            if self.seen_before_first is None and self._ot_study is not None:
                import optuna

                self.seen_before_first = len(self._ot_study.get_trials(
                    deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
            config = super().suggest(trial_id)
            ot = self._ot_trials.get(trial_id)
            # an enqueued trial (a start point) carries Optuna's fixed_params: mark its config so the
            # scheduler and the MLflow run know it (search.space.START)
            attrs = self._system_attrs(ot) if isinstance(config, dict) and ot is not None else {}
            if "fixed_params" in attrs:
                config[START] = True
            if NEAR_ATTR in attrs:  # drawn near the best so far: which trial, by its Tune id where Tune ran it
                number = attrs[NEAR_ATTR]
                config[NEAR] = next((tid for tid, o in self._ot_trials.items() if o.number == number),
                                    f"optuna trial {number}")
            return config

        def _system_attrs(self, ot) -> dict:
            try:  # Optuna's record of an enqueued trial (optuna 3-5); the public property is deprecated
                return self._ot_study._storage.get_trial_system_attrs(ot._trial_id)
            except AttributeError:
                return getattr(ot, "system_attrs", {})

        def on_trial_complete(self, trial_id, result=None, error=False):
            ot = self._ot_trials.get(trial_id)
            if ot is not None and result and result.get("acc_constraint") is not None \
                    and trial_id not in self._completed_trials:
                try:
                    ot.set_constraint("accuracy", float(result["acc_constraint"]))
                except Exception:  # a trial Optuna already closed
                    pass
            super().on_trial_complete(trial_id, result, error)

    return AccuracyConstrainedOptuna


def new_searcher(space: SearchSpace, seeds=(), ref: dict | None = None):
    """Optuna behind Ray's limiter; ``ref``: the reference baseline's settings, for the start points that
    follow it (search.space.start_points)."""
    import optuna
    from ray.tune.search import ConcurrencyLimiter

    from triaccel.search.sampler import NearBestSampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if space.sampler == "random":
        sampler = optuna.samplers.RandomSampler(seed=space.seed)
    else:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sampler = optuna.samplers.TPESampler(seed=space.seed, multivariate=True, constant_liar=True,
                                                 n_startup_trials=max(2, min(10, space.trials // 3)))
    if space.near_best > 0:  # a share of the trials near the best so far, the rest the sampler's own
        sampler = NearBestSampler(sampler, space.near_best, seed=space.seed)
    start, said = start_points(space, ref)
    for line in said:
        print(line, flush=True)
    alg = _constrained_optuna()(space=space.optuna_distributions(), metric=space.metric, mode=space.mode,
                                sampler=sampler, start=start, seeds=seeds)
    return ConcurrencyLimiter(alg, max_concurrent=space.concurrency)


def trial_trainable(space: SearchSpace, shared: int, ref_curve: list | None, folder: Path):
    """The trials' Tune trainable; ``folder``: the search's Tune folder for this run of Tune (an extension's
    own), where the trials find the marker written here (trainable.check_storage)."""
    import ray
    from ray import tune

    from triaccel.search.trainable import REACH_FILE, run_trial, trial_class

    res = {"cpu": space.cpus_per_trial}
    if on_gpu(space):
        res["gpu"] = space.gpus_per_trial
    from triaccel.userref import shipped

    token = secrets.token_hex(8)  # this driver's: a file of the same name in another folder is not it
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / REACH_FILE).write_text(token)
    except OSError as e:
        raise ConfigError(f"{folder}: cannot write the search's Tune folder ({e.strerror or e})") from None
    fn = tune.with_parameters(run_trial, space_data=space.raw, shared=shared,
                              gpu_fraction=space.gpus_per_trial if on_gpu(space) else 1.0,
                              ref_curve=ref_curve, margin=space.margin, factories=shipped(),
                              reach=(str(folder / REACH_FILE), token),
                              # the node: where the driver has joined Ray (asking before would start one)
                              workdir=(os.getcwd(), ray.get_runtime_context().get_node_id()
                                       if ray.is_initialized() else ""))
    return tune.with_resources(trial_class(fn), res)


class _DropTuneFailureNoise(logging.Filter):
    """Tune's "Trials did not complete: [...]" after every search with a failed trial: the search's
    own summary counts them and each trial's line gave its reason."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Trials did not complete")


class _OneLineSyncFailure(logging.Filter):
    """A failed copy of Tune's experiment state, from its staging folder to the search's Tune folder, as
    one line. Tune writes the next state into the staging folder while the previous copy may still be
    reading it, so on a loaded machine a copy can meet a file that has just been renamed or replaced
    (FileNotFoundError); Tune copies the whole folder again at its next save and at the search's end,
    and logs the failure with its whole traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None and "Traceback (most recent call last)" not in text:
            return True
        head = text.split("Traceback (most recent call last)")[0].strip().rstrip(":").strip()
        last = f"{type(exc).__name__}: {exc}" if exc is not None else text.strip().splitlines()[-1]
        record.msg, record.args = f"{head}: {last.strip()} (Tune saves it again at its next save)", ()
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


SYNC_LOGGERS = ("ray.tune.execution.experiment_state", "ray.train._internal.syncer", "ray.train._internal.storage")


def quiet_tune_failures() -> None:
    """A failed trial is one console line, its reason (``trial 3/8 ... FAILED Diverged: ...``); Tune
    would also print the worker's whole traceback to stderr, ~40 lines per diverged trial. Its own
    switch turns that off (TUNE_PRINT_ALL_TRIAL_ERRORS=1 brings it back); the traceback stays in
    the trial's error file and its MLflow run. A failed copy of Tune's state is one line too."""
    os.environ.setdefault("TUNE_PRINT_ALL_TRIAL_ERRORS", "0")
    lg = logging.getLogger("ray.tune.tune")
    if not any(isinstance(f, _DropTuneFailureNoise) for f in lg.filters):
        lg.addFilter(_DropTuneFailureNoise())
    for name in SYNC_LOGGERS:
        lg = logging.getLogger(name)
        if not any(isinstance(f, _OneLineSyncFailure) for f in lg.filters):
            lg.addFilter(_OneLineSyncFailure())


def new_tuner(space: SearchSpace, name: str, uri: str, shared: int, ref_curve: list | None, searcher=None,
           tune_dir: Path | None = None):
    """The search's Tuner; ``searcher`` and ``tune_dir`` (Tune's folder, default tune_root()/name):
    an extension's own (search.extend)."""
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback
    from ray.tune.schedulers import FIFOScheduler

    from triaccel.search.callbacks import ConsoleReporter, MLflowSearchCallback

    from triaccel.config import TrainConfig, from_dict

    epochs = from_dict(TrainConfig, dict(space.train)).epochs
    if searcher is None:
        from triaccel.search.alone import reference_values

        searcher = new_searcher(space, ref=reference_values(name, space, uri)
                                if any(FOLLOWS in p for p in space.start) else None)
    if space.scheduler == "asha" and space.objective == "efficiency":
        from triaccel.search.schedulers import StartPointsFinishASHA

        # ASHA ranks by the efficiency of feasible trials; a trial below the accuracy margin ranks
        # under every feasible one (search_score < 0), so it is the first to stop. The start points
        # always finish: ASHA ranks trials sharing the GPU, which is not how they rank alone
        sched = StartPointsFinishASHA(metric="search_score", mode="max", time_attr="training_iteration",
                                      max_t=epochs, grace_period=space.grace_period, reduction_factor=2)
    else:  # ASHA needs one metric: off for the multi-objective search
        sched = FIFOScheduler()
    return tune.Tuner(
        trial_trainable(space, shared, ref_curve, tune_dir or tune_root() / name),
        tune_config=tune.TuneConfig(search_alg=searcher, scheduler=sched,
                                    num_samples=space.trials,
                                    trial_dirname_creator=lambda t: t.trial_id, reuse_actors=False),
        run_config=tune.RunConfig(
            name=tune_dir.name if tune_dir else name, storage_path=str(tune_dir.parent if tune_dir else tune_root()),
            verbose=0,
            # Tune's JSON and CSV result logs, named: with TUNE_DISABLE_AUTO_CALLBACK_LOGGERS (init_ray)
            # Tune adds no TensorBoard writer, whose import (tensorboardX, torch) and per-result event
            # files cost the driver CPU for a record MLflow already holds
            callbacks=[MLflowSearchCallback(uri, EXPERIMENT, name, space, shared, gpu_share(space, shared)),
                       ConsoleReporter(space.trials, epochs), JsonLoggerCallback(), CSVLoggerCallback()],
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            failure_config=tune.FailureConfig(max_failures=TRIAL_RETRIES)))


# A trial whose worker or node was lost (a node leaving a cluster, a killed process) runs again from its last
# checkpoint, once; an error the trial raised itself fails it at once on its retry (trainable.run_trial)
TRIAL_RETRIES = 1


def restorable(name: str, space: SearchSpace) -> bool:
    """Whether Tune saved a state ``resume`` can continue: its experiment state, not only the
    ``tuner.pkl`` it writes when the Tuner is built. A driver that died between the two (Tune's
    start-up) left no trial to continue; restoring such a directory would make Tune plan one trial
    (``num_samples`` is not in ``tuner.pkl``) and report a 1-trial search. A
    state whose plan is smaller than the space's (left by such a resume) is refused: resuming it
    can never run the rest."""
    path = tune_root() / name
    if not any(path.glob("experiment_state-*.json")):
        return False
    check_readable(name, path)
    planned = planned_by_tune(path)
    if planned is not None and planned < space.trials:
        raise TriAccelError(f"search '{name}': its Tune state in {path} plans {planned} of the space's {space.trials} "
                            f"trials and cannot run the rest: start the search again under another name "
                            f"(`triaccel search --space {space.source} --name {name}2`)")
    return True


def check_readable(name: str, path: Path) -> None:
    """The newest experiment state in ``path`` (the one Tune restores) must parse: Tune meets a damaged
    one with its traceback, then runs a fresh plan and reports the search finished with trials missing."""
    import json

    newest = max(path.glob("experiment_state-*.json"), key=lambda p: p.name)
    try:
        json.loads(newest.read_text())
    except (OSError, ValueError) as e:
        raise TriAccelError(f"search '{name}': its Tune state {newest} cannot be read ({e}), so resume cannot "
                            f"continue it; its finished trials stay in MLflow (`{again('export', name)}` ranks them): "
                            f"start the search again under another name to run the rest") from None


def unfinished_extension(name: str) -> tuple[Path, int] | None:
    """The newest ``triaccel extend`` of the search, as (its Tune folder, the trials it added), where it
    was stopped with trials left and Tune saved its state: what ``resume`` continues. None where there
    is none (an extension stopped before Tune saved anything started no trial: ``extend`` adds them)."""
    folders = extension_folders(name)
    if not folders or not any(folders[-1].glob("experiment_state-*.json")):
        return None
    check_readable(name, folders[-1])
    planned = planned_by_tune(folders[-1])
    if planned is None or not left_to_run(name, planned, folders[-1]):
        return None
    return folders[-1], planned


def unstarted_extension(name: str) -> Path | None:
    """The newest ``triaccel extend`` folder of the search where Tune saved nothing: an extend stopped in
    Tune's start-up, before its first trial started. None otherwise (an extend stopped before Tune made its
    folder left the search finished: ``extend`` again runs its trials)."""
    folders = extension_folders(name)
    return folders[-1] if folders and not any(folders[-1].glob("experiment_state-*.json")) else None


def planned_by_tune(path: Path) -> int | None:
    """The number of trials Tune's saved search generator will create in all (None if unread)."""
    try:
        from ray.tune.utils.util import _load_newest_checkpoint

        state = _load_newest_checkpoint(str(path), "search_gen_state-*.json")
        return int(state["total_samples"]) if state else None
    except Exception:  # noqa: BLE001 -- another Ray's layout: restore and let check_finished judge
        return None


def left_to_run(name: str, planned: int, path: Path | None = None) -> int:
    """Trials a ``resume`` would still run, from the experiment state Tune saved (what ``resume``
    restores) in ``path`` (default: the search's Tune folder; an extension's folder of its own):
    those not created yet and those neither terminated nor errored."""
    from ray.tune import ExperimentAnalysis

    path = path or tune_root() / name
    if not any(path.glob("experiment_state-*.json")):
        return planned
    return max(0, planned - sum(t.status in ("TERMINATED", "ERROR") for t in ExperimentAnalysis(str(path)).trials))


def check_finished(name: str, planned: int, stopped: bool | None = None, path: Path | None = None) -> None:
    """Tune meets Ctrl-C (SIGINT) by stopping the trials, saving its state and returning as if the
    search had finished. Its loop ends without an error in two ways only: every trial ended (an
    errored one included: a trial whose worker died is ERROR), or a stop signal reached its handler.
    ``stopped`` (from ``own_signals``) says which: False, no signal reached Tune, so the search
    finished, whatever its saved state says (that state can lag behind Tune: the last snapshot's
    failure is only logged, and a trial still RUNNING there read as a trial left, exit 130). True
    or None (not known): the saved state counts the trials left, as Tune's memory cannot (its
    clean-up marks the trials it stopped TERMINATED)."""
    if stopped is False:
        return
    left = left_to_run(name, planned, path)
    if left:
        raise Interrupted(f"{left} of {planned} trials left")
