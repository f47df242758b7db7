"""Driver-side Tune callbacks: the MLflow writer and the console reporter.

MLflow is written from the driver only: one writer, so concurrent trials never lock the
sqlite store. One parent run per search, one child run per trial. MLflow itself is the
source of truth for which trial has which run (tags ``triaccel.search`` and
``triaccel.trial_id``), so after ``Tuner.restore`` (which unpickles these callbacks as they
were when the search started) a resumed trial finds its own child run again instead of
starting a duplicate, and epochs it already logged are not logged twice.
"""
from __future__ import annotations

import json
import math
import re
import sys
import tempfile
from pathlib import Path

from ray.tune import Callback

from triaccel.config import flatten
from triaccel.search.space import CONTROLLER_DEFAULTS, NEAR, START
from triaccel.search.tags import NODE_TAG, TAG_ROLE, TAG_SEARCH, TAG_TRIAL  # noqa: F401 (names of this module)
from triaccel.search.trainable import NODE_KEY, recorded_node
from triaccel.units import mem_text
from triaccel.tracking import client as make_client
from triaccel.tracking import ensure_experiment, git_revision, log_metrics, log_params, log_yaml_artifact


def failure_reason(trial) -> str:
    """The last meaningful line of a failed trial's error (e.g. 'Diverged: train loss is nan ...')."""
    text = ""
    if getattr(trial, "error_file", None):  # the driver's own copy, written as the error came: the latest
        try:
            text = Path(trial.error_file).read_text()
        except OSError:
            pass
    if not text:  # the copy on storage (synced later: a retried trial's may hold only its first failure)
        try:
            err = trial.get_error()
            text = str(err) if err is not None else ""
        except Exception:
            pass
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        ln = lines[i]
        if any(w in ln for w in ("Diverged", "OutOfMemory", "Error", "error")):
            head, sep, rest = ln.partition(": ")
            if sep and re.fullmatch(r"[\w.]+", head):  # the exception's name without its module path
                ln = f"{head.rsplit('.', 1)[-1]}: {rest}"
            ln = ln.removeprefix("TrialFailed: ")  # a retry's re-raise (trainable.TrialFailed): the first error
            if ln.endswith(":") and i < len(lines) - 1:  # a header ("Unable to set up cluster storage with ...:")
                ln = f"{ln} ... {lines[-1]}"  # and what ends the message, where Ray puts its advice
            return ln[:500]
    return (lines[-1] if lines else "unknown error")[:500]


def worker_lost(trial) -> bool:
    """The trial's error is its worker's or node's loss (killed, a node gone), not one the trial raised."""
    import cloudpickle
    from ray.exceptions import NodeDiedError, RayActorError, WorkerCrashedError

    try:  # the driver's own copy of the error just met (storage's is synced later)
        p = getattr(trial, "pickled_error_file", None)
        err = cloudpickle.loads(Path(p).read_bytes()) if p and Path(p).is_file() else trial.get_pickled_error()
        return isinstance(err, (RayActorError, WorkerCrashedError, NodeDiedError))
    except Exception:  # noqa: BLE001 - an unreadable error file: not known to be a loss
        return False


def param_importances(space, done: list[dict]) -> dict:
    """{target: {param: importance}} from Optuna (PED-ANOVA) over the finished trials, for efficiency and
    validation accuracy. A target the trials cannot tell apart (every value equal: Optuna would give every
    parameter the same share and warn on stderr) has no entry."""
    if len(done) < 3:
        return {}
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    sampled = space.optuna_distributions()
    dists = {k: sampled.get(k) or optuna.distributions.FloatDistribution(p.low, p.high,
                                                                         log=p.distribution == "loguniform")
             for k, p in space.params.items()}
    out = {}
    for target in ("efficiency", "val_acc"):
        study = optuna.create_study(direction="maximize")
        for r in done:
            if target not in r["metrics"]:
                continue
            try:
                study.add_trial(optuna.trial.create_trial(params={k: r["values"][k] for k in dists},
                                                          distributions=dists, value=r["metrics"][target]))
            except Exception:  # noqa: BLE001 -- a trial whose values the distributions refuse is left out
                continue
        if len({t.value for t in study.trials}) < 2:
            continue
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            try:
                imp = optuna.importance.get_param_importances(study)
            except Exception:  # noqa: BLE001 -- importances are a summary: none rather than a failed search
                continue
        if any("importances will be equal" in str(w.message) for w in said):
            continue
        out[target] = {k: float(v) for k, v in imp.items()}
    return out


class MLflowSearchCallback(Callback):
    def __init__(self, tracking_uri: str, experiment: str, search: str, space, shared: int, gpu_share: float = 1.0):
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.search = search
        self.space_data = space.raw
        self.space_source, self.space_sha = space.source, space.sha256
        self.controller_defaults = CONTROLLER_DEFAULTS  # a callback pickled by an older search has none
        self.objective = space.objective
        self.shared = shared
        self.gpu_share = gpu_share  # the share of the device each trial holds (its cost in device time)
        self._reset()

    @staticmethod
    def _fresh() -> dict:
        """This process's client and caches: never pickled, rebuilt empty on unpickling (a callback
        pickled by an older version lacks the newer ones)."""
        return {"_client": None, "_exp_id": None, "_parent": None, "_runs": {}, "_last_step": {},
                # _closed: trials whose runs a killed search had already closed FINISHED; _space: parsed once;
                # _node: the Ray node each trial ran on
                "_closed": set(), "_space": None, "_node": {}}

    def _reset(self):
        self.__dict__.update(self._fresh())

    def __getstate__(self):  # pickled into Tune's experiment state: keep no client or cache
        return {**self.__dict__, **self._fresh()}

    def __setstate__(self, state):
        self.__dict__.update({**state, **self._fresh()})

    @property
    def space(self):
        """The search's space, parsed once in this process from the data pickled with the callback."""
        if self._space is None:
            from triaccel.search.space import parse_space, pin_controller_defaults

            raw = pin_controller_defaults(self.space_data, getattr(self, "controller_defaults", None))
            self._space = parse_space(raw, source=self.space_source, sha256=self.space_sha)
        return self._space

    @property
    def client(self):
        if self._client is None:
            self._client = make_client(self.tracking_uri)
            self._exp_id = ensure_experiment(self._client, self.experiment)
        return self._client

    # ------------------------------------------------------------------ runs
    def parent_run_id(self) -> str:
        if self._parent is None:
            c = self.client
            found = c.search_runs([self._exp_id], filter_string=f"tags.`{TAG_SEARCH}` = '{self.search}' and "
                                                               f"tags.`{TAG_ROLE}` = 'parent'", max_results=1)
            if found:
                self._parent = found[0].info.run_id
                c.update_run(self._parent, status="RUNNING")
            else:
                from triaccel.search.state import parent_run

                self._parent = parent_run(self.search, self.space, self.tracking_uri, self.shared)
        return self._parent

    def child_run_id(self, trial) -> str:
        tid = trial.trial_id
        if tid in self._runs:
            return self._runs[tid]
        c, parent = self.client, self.parent_run_id()
        found = c.search_runs([self._exp_id], filter_string=f"tags.`{TAG_SEARCH}` = '{self.search}' and "
                                                           f"tags.`{TAG_TRIAL}` = '{tid}'", max_results=1)
        if found:  # a resumed trial keeps its run
            rid = found[0].info.run_id
            hist = c.get_metric_history(rid, "val_acc")
            self._last_step[tid] = max((m.step for m in hist), default=0)
            if found[0].info.status == "FINISHED":
                # it completed before the crash, after Tune's last periodic save: its run keeps its
                # status and end time (Tune completes it again on resume without training it)
                self._closed.add(tid)
            else:
                c.update_run(rid, status="RUNNING")
        else:
            values = self.space.resolve(trial.config)
            run = c.create_run(self._exp_id, run_name=f"{self.search}-{tid}", tags={
                "mlflow.parentRunId": parent, TAG_SEARCH: self.search, TAG_ROLE: "trial", TAG_TRIAL: tid,
                "triaccel.values": json.dumps(values), "shared_trials": str(self.shared),
                "git_revision": git_revision(), **({START: "true"} if trial.config.get(START) else {}),
                **({NEAR: str(trial.config[NEAR])} if trial.config.get(NEAR) else {})})
            rid = run.info.run_id
            train = self.space.train_dict(values)
            params = {k: v for k, v in flatten(train).items()}
            params.update({f"search.{k}": v for k, v in values.items()})
            log_params(c, rid, params)
            self._last_step[tid] = 0
        self._runs[tid] = rid
        return rid

    # ------------------------------------------------------------------ Tune hooks
    def setup(self, **info):
        self.parent_run_id()

    def on_trial_start(self, iteration, trials, trial, **info):
        self.child_run_id(trial)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        rid = self.child_run_id(trial)
        step = int(result.get("training_iteration", 0))
        if step <= self._last_step.get(trial.trial_id, 0):
            return  # logged before a crash: the resumed trial does not log it twice
        metrics = {k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                   and k not in ("training_iteration", "timestamp", "time_this_iter_s", "time_total_s", "pid",
                                 "time_since_restore", "iterations_since_restore", "done")}
        metrics["wall_s"] = float(result.get("time_total_s", 0.0))  # the trial's time so far, restores included
        metrics["gpu_share"] = getattr(self, "gpu_share", 1.0)
        log_metrics(self.client, rid, metrics, step=step)
        self._tag_node(trial, rid, result.get(NODE_KEY))
        self._last_step[trial.trial_id] = step

    def _tag_node(self, trial, rid, node):
        """Where the trial trained (the last node, if a resume moved it): a cluster's placement, checkable per run."""
        if node and self._node.get(trial.trial_id) != node:
            self.client.set_tag(rid, NODE_TAG, node)
            self._node[trial.trial_id] = node

    def on_trial_complete(self, iteration, trials, trial, **info):
        rid = self.child_run_id(trial)
        if trial.trial_id in self._closed:
            return
        self._log_checkpoint_artifacts(trial, rid)
        self.client.set_terminated(rid, status="FINISHED")

    def on_trial_recover(self, iteration, trials, trial, **info):  # Tune runs it again (tuner.TRIAL_RETRIES)
        if worker_lost(trial):
            self.client.set_tag(self.child_run_id(trial), "triaccel.worker_lost", failure_reason(trial))

    def on_trial_error(self, iteration, trials, trial, **info):
        rid = self.child_run_id(trial)
        self.client.set_tag(rid, "failure_reason", failure_reason(trial))
        self._tag_node(trial, rid, recorded_node(trial))  # also for a trial that failed before its first result
        self.client.set_terminated(rid, status="FAILED")

    def on_experiment_end(self, trials, **info):  # also after Ctrl-C: the runner closes the parent run
        self.summarise()

    def _log_checkpoint_artifacts(self, trial, rid):
        ck = getattr(trial, "checkpoint", None)
        path = getattr(ck, "path", None) if ck is not None else None
        if not path or not Path(path).is_dir():
            return
        for name in ("config.yaml",):
            if (Path(path) / name).is_file():
                self.client.log_artifact(rid, str(Path(path) / name))
        folder = Path(path) / "triaccel"
        if folder.is_dir():
            for f in sorted(folder.iterdir()):
                self.client.log_artifact(rid, str(f), "triaccel")
            if (folder / "trajectory.json").is_file() and not any(folder.glob("*.png")):
                self._log_plots(folder / "trajectory.json", rid)

    def _log_plots(self, trajectory_json, rid):
        """The trial's controller plots, drawn here once from its trajectory (the trial writes only
        the data with each epoch's checkpoint). A plot that cannot be drawn costs the plot, not the run."""
        from triaccel.report import plots_from_json

        with tempfile.TemporaryDirectory() as d:
            try:
                files = plots_from_json(trajectory_json, Path(d))
            except Exception as e:  # noqa: BLE001 - a figure is not worth the trial's record
                print(f"[search] the controller plots of run {rid} could not be drawn ({type(e).__name__}: {e})",
                      file=sys.stderr)
                return
            for f in files:
                self.client.log_artifact(rid, str(f), "triaccel")

    # ------------------------------------------------------------------ parent summary
    def summarise(self) -> dict:
        """Counts, importances and the plot on the parent run. Which run is best is decided by
        ``triaccel.search.results`` and recorded by the runner after the confirm runs."""
        from triaccel.search.results import outcome, pareto_front, trial_table

        c, parent = self.client, self.parent_run_id()
        space = self.space
        o = outcome(trial_table(c, self._exp_id, self.search), [],
                    trial_table(c, self._exp_id, self.search, role="baseline", curves=True), space.epochs,
                    space.margin)
        done = [r.row for r in o.ranked]
        summary = {"trials": o.trials, "finished": len(done), "failed": len(o.failed)}
        log_metrics(c, parent, {"trials_finished": len(done), "trials_failed": len(o.failed),
                                "trials_stopped": len(o.stopped)}, step=o.trials)
        if not done:
            return summary
        imp = param_importances(self.space, done)
        if imp:
            log_yaml_artifact(c, parent, imp, "param_importances.yaml")
            for k, v in imp.get("efficiency", {}).items():
                log_metrics(c, parent, {f"importance.{k}": v}, step=o.trials)
        with tempfile.TemporaryDirectory() as d:
            p = self._plot(done, Path(d), pareto_front(done) if self.objective == "pareto" else None,
                           {x.row["run_id"] for x in o.ranked if not x.feasible})
            if p:
                c.log_artifact(parent, str(p))
        return summary

    def _plot(self, done, folder: Path, front, infeasible=frozenset()):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        keys = list(self.space.params)
        if front is not None:
            fig, ax = plt.subplots(figsize=(6, 4.5))
            t = [r["metrics"].get("epoch_time_last5_s", math.nan) for r in done]
            a = [r["metrics"].get("val_acc", math.nan) for r in done]
            m = [r["metrics"].get("peak_mem_gib", math.nan) for r in done]
            sc = ax.scatter(t, a, c=m, cmap="viridis")
            ids = {r["run_id"] for r in front}
            ax.scatter([x for x, r in zip(t, done) if r["run_id"] in ids],
                       [y for y, r in zip(a, done) if r["run_id"] in ids], facecolors="none", edgecolors="red", s=120,
                       label="Pareto front")
            fig.colorbar(sc, label="peak memory (GiB)")
            ax.set_xlabel("epoch time, last 5 (s)")
            ax.set_ylabel("validation accuracy (%)")
            ax.legend()
            p = folder / "pareto_front.png"
        else:
            n = len(keys)
            cols = min(4, n)
            rows = math.ceil(n / cols)
            fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False)
            eff = [r["metrics"]["efficiency"] for r in done]
            col = ["tab:red" if r["run_id"] in infeasible else "tab:blue" for r in done]
            for ax, k in zip(axes.flat, keys):
                xs = [r["values"][k] for r in done]
                choices = self.space.params[k].choices
                if choices is not None:  # each choice at its own position, whatever it holds (a pair, a string)
                    labels = [str(c) for c in choices]
                    xs = [labels.index(str(x)) if str(x) in labels else math.nan for x in xs]
                    ax.set_xticks(range(len(labels)), labels, fontsize=7)
                ax.scatter(xs, eff, s=14, c=col)
                if self.space.params[k].distribution == "loguniform":
                    ax.set_xscale("log")
                ax.set_xlabel(k.split(".")[-1], fontsize=8)
                ax.set_ylabel("efficiency", fontsize=8)
            for ax in list(axes.flat)[n:]:
                ax.axis("off")
            fig.suptitle(f"search {self.search}: efficiency score vs each parameter (red: below the accuracy margin)")
            p = folder / "trials_vs_params.png"
        fig.tight_layout()
        fig.savefig(p, dpi=110)
        plt.close(fig)
        return p


class ConsoleReporter(Callback):
    """One line per finished or failed trial, instead of Tune's pages of tables."""

    def __init__(self, total: int, epochs: int | None = None):
        self.total = total
        self.epochs = epochs  # the budget: a trial done before it was stopped early by ASHA
        self.done = 0

    def __getstate__(self):
        return dict(self.__dict__)

    def _values(self, trial, space) -> str:
        try:
            vals = space.resolve(trial.config)
        except Exception:
            return ""
        return "  ".join(f"{k.split('.')[-1]}={v:.3g}" if isinstance(v, float) else f"{k.split('.')[-1]}={v}"
                         for k, v in vals.items())

    def _count(self, trials, trial) -> None:
        """This trial's number among the finished: counted from Tune's trial list, so a resumed
        search goes on from the trials its first run finished (it restarted at 1)."""
        before = sum(1 for t in trials if t is not trial and t.status in ("TERMINATED", "ERROR"))
        self.done = max(self.done + 1, before + 1)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._count(trials, trial)
        r = trial.last_result or {}
        n, budget = int(r.get("training_iteration", 0)), getattr(self, "epochs", None)
        what = f"stopped early at epoch {n} (ASHA)" if budget and n < budget else f"done   epochs {n}"
        print(f"trial {self.done:>3}/{self.total} {trial.trial_id}  {what}  "
              f"eff {r.get('efficiency', float('nan')):10.2f}  val {r.get('val_acc', float('nan')):6.2f}%  "
              f"{r.get('epoch_time_last5_s', float('nan')):6.2f}s/epoch  {mem_text(r.get('peak_mem_gib', float('nan')))}",
              flush=True)

    def on_trial_recover(self, iteration, trials, trial, **info):
        if worker_lost(trial):  # an error the trial raised itself fails it on the retry: one line, then
            why = failure_reason(trial).split(". ")[0][:160]  # Ray's first sentence; its advice is in MLflow
            print(f"  trial {trial.trial_id} lost its worker ({why}): it runs again from its last checkpoint",
                  flush=True)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._count(trials, trial)
        print(f"trial {self.done:>3}/{self.total} {trial.trial_id}  FAILED {failure_reason(trial)}", flush=True)
