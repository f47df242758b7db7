"""Launching, resuming, confirming and exporting searches.

Layout under the store (default ``mlruns/``):
    mlruns/tune/<name>/                 Ray Tune's experiment state (what ``resume`` restores)
    mlruns/tune/<name>/triaccel_search.json   the validated space and options of the search
    mlruns/mlflow.db, mlruns/artifacts  MLflow (unless MLFLOW_TRACKING_URI says otherwise)
"""
from __future__ import annotations

import datetime
import json
import math
import os
from pathlib import Path

import yaml

from triaccel.errors import ConfigError, TriAccelError
from triaccel.search.space import SearchSpace, load_space, parse_space
from triaccel.tracking import tracking_uri as resolve_uri

EXPERIMENT = "triaccel-search"
STATE_FILE = "triaccel_search.json"


def tune_root() -> Path:
    return Path(os.environ.get("TRIACCEL_TUNE_DIR", "mlruns/tune")).resolve()


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:
        return 0


def shared_trials(space: SearchSpace) -> int:
    """How many trials run at once on one device (recorded with every measurement)."""
    if _gpu_count() > 0:
        return max(1, min(space.concurrency, int(math.floor(1 / space.gpus_per_trial + 1e-9))))
    return max(1, min(space.concurrency, os.cpu_count() or 1))


def _init_ray(address: str | None, quiet: bool = True) -> None:
    import logging

    import ray

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "0")  # experiment state after every event: crash-safe
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    if ray.is_initialized():
        return
    kw = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR, configure_logging=True)
    if address:
        try:
            ray.init(address=address, **kw)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise TriAccelError(f"--address {address}: cannot join a Ray cluster there "
                                f"({str(e).splitlines()[0][:200]})") from None
    else:  # a new local instance, even where a `ray start` cluster runs (joining one is what --address is for)
        ray.init(address="local", num_cpus=os.cpu_count(), **kw)


def _searcher(space: SearchSpace):
    import optuna
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if space.sampler == "random":
        sampler = optuna.samplers.RandomSampler(seed=space.seed)
    else:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sampler = optuna.samplers.TPESampler(seed=space.seed, multivariate=True, constant_liar=True,
                                                 n_startup_trials=max(2, min(10, space.trials // 3)))
    alg = OptunaSearch(space=space.optuna_distributions(), metric=space.metric, mode=space.mode, sampler=sampler)
    return ConcurrencyLimiter(alg, max_concurrent=space.concurrency)


def _trainable(space: SearchSpace, shared: int):
    from ray import tune

    from triaccel.search.trainable import run_trial

    res = {"cpu": space.cpus_per_trial}
    if _gpu_count() > 0:
        res["gpu"] = space.gpus_per_trial
    fn = tune.with_parameters(run_trial, space_data=space.raw, shared=shared,
                              gpu_fraction=space.gpus_per_trial if _gpu_count() > 0 else 1.0)
    return tune.with_resources(fn, res)


def _tuner(space: SearchSpace, name: str, uri: str, shared: int):
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    from triaccel.search.callbacks import ConsoleReporter, MLflowSearchCallback

    from triaccel.config import TrainConfig, from_dict

    epochs = from_dict(TrainConfig, dict(space.train)).epochs
    if space.scheduler == "asha" and space.objective == "efficiency":
        sched = ASHAScheduler(metric="efficiency", mode="max", time_attr="training_iteration", max_t=epochs,
                              grace_period=space.grace_period, reduction_factor=2)
    else:  # ASHA needs one metric: off for the multi-objective search
        sched = FIFOScheduler()
    return tune.Tuner(
        _trainable(space, shared),
        tune_config=tune.TuneConfig(search_alg=_searcher(space), scheduler=sched, num_samples=space.trials,
                                    trial_dirname_creator=lambda t: t.trial_id, reuse_actors=False),
        run_config=tune.RunConfig(
            name=name, storage_path=str(tune_root()), verbose=0,
            callbacks=[MLflowSearchCallback(uri, EXPERIMENT, name, space, shared), ConsoleReporter(space.trials)],
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            failure_config=tune.FailureConfig(max_failures=0)))


def run_search(space_path: str, name: str | None = None, trials: int | None = None, concurrency: int | None = None,
               gpus_per_trial: float | None = None, address: str | None = None, confirm: int | None = None) -> dict:
    space = load_space(space_path)  # every error surfaces here, before Ray starts
    _check_confirm(confirm)
    for k, v in (("trials", trials), ("concurrency", concurrency), ("gpus_per_trial", gpus_per_trial)):
        if v is not None:
            if (k == "gpus_per_trial" and not 0 < v <= 8) or (k != "gpus_per_trial" and v < 1):
                raise ConfigError(f"--{k.replace('_', '-')}: invalid value {v}")
            space.raw[k] = v
    space = parse_space(space.raw, source=space.source, sha256=space.sha256)
    name = name or space.name
    if not name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(f"--name {name!r}: use letters, digits, '-' and '_'")
    path = tune_root() / name
    if (path / STATE_FILE).exists():
        raise ConfigError(f"search '{name}' already exists in {path}: `triaccel resume {name}` continues it, "
                          f"or choose another --name")
    uri = resolve_uri(None)
    shared = shared_trials(space)
    path.mkdir(parents=True, exist_ok=True)
    state = {"name": name, "space": space.raw, "source": space.source, "sha256": space.sha256, "tracking_uri": uri,
             "address": address, "created": datetime.datetime.now().isoformat(timespec="seconds"), "shared": shared}
    (path / STATE_FILE).write_text(json.dumps(state, indent=1))
    print(f"triaccel search '{name}': {space.trials} trials of {space.source}, {space.concurrency} at a time, "
          f"objective {space.objective}; Tune state in {path}; MLflow {uri} (experiment '{EXPERIMENT}')", flush=True)
    _init_ray(address)
    tuner = _tuner(space, name, uri, shared)
    tuner.fit()
    summary = finish(name, space, uri, default_confirm(confirm, shared))
    return summary


def resume_search(name: str, address: str | None = None, confirm: int | None = None) -> dict:
    state = read_state(name)
    _check_confirm(confirm)
    space = parse_space(state["space"], source=state["source"], sha256=state["sha256"])
    from ray import tune

    print(f"triaccel resume '{name}': restoring {tune_root() / name}", flush=True)
    _init_ray(address or state.get("address"))
    if not tune.Tuner.can_restore(str(tune_root() / name)):
        raise TriAccelError(f"search '{name}' has no Tune state to restore in {tune_root() / name}")
    tuner = tune.Tuner.restore(str(tune_root() / name), trainable=_trainable(space, state["shared"]),
                               resume_unfinished=True, resume_errored=False, restart_errored=False)
    tuner.fit()
    return finish(name, space, state["tracking_uri"], default_confirm(confirm, state["shared"]))


# Re-run this many of the best alone when trials shared a GPU. Measured on the H200
# (bench/results/h200_search.json): four trials to a GPU ran the winner of the one-at-a-time
# search at half its speed and ranked it 5th; its own top 3, re-run alone, hold a config that
# scores 18.2 against 15.3 for the shared winner (the best of all 16 alone: 19.2).
CONFIRM_WHEN_SHARED = 3


def _check_confirm(confirm: int | None) -> None:
    if confirm is not None and confirm < 0:
        raise ConfigError(f"--confirm: invalid value {confirm} (a number of configurations, >= 0)")


def default_confirm(confirm: int | None, shared: int) -> int:
    """--confirm as given; by default the top 3 when trials shared a GPU, none otherwise (on a
    CPU-only machine trials share cores, not a device whose contention ranks them unevenly)."""
    if confirm is not None:
        return confirm
    if shared > 1 and _gpu_count() > 0:
        print(f"{shared} trials shared the GPU: re-running the top {CONFIRM_WHEN_SHARED} alone before export "
              f"(--confirm 0 skips this)", flush=True)
        return CONFIRM_WHEN_SHARED
    return 0


def read_state(name: str) -> dict:
    p = tune_root() / name / STATE_FILE
    if not p.is_file():
        known = ", ".join(list_names()) or "none"
        raise ConfigError(f"no search named '{name}' under {tune_root()} (known: {known})")
    return json.loads(p.read_text())


def list_names() -> list[str]:
    root = tune_root()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / STATE_FILE).is_file())


def _rows(name: str, uri: str):
    from triaccel.search.results import trial_table
    from triaccel.tracking import client, ensure_experiment

    c = client(uri)
    exp = ensure_experiment(c, EXPERIMENT)
    return c, exp, trial_table(c, exp, name), trial_table(c, exp, name, role="confirm")


def finish(name: str, space: SearchSpace, uri: str, confirm: int) -> dict:
    if confirm:
        confirm_top(name, space, uri, confirm)
    c, exp, rows, confirms = _rows(name, uri)
    done = sorted([r for r in rows if r["status"] == "FINISHED" and "efficiency" in r["metrics"]],
                  key=lambda r: -r["metrics"]["efficiency"])
    failed = [r for r in rows if r["status"] == "FAILED"]
    print(f"\nsearch '{name}': {len(done)} finished, {len(failed)} failed, {len(rows)} trials in MLflow")
    if done:
        keys = list(space.params)
        head = f"{'rank':>4} {'trial':>10} {'eff':>10} {'val%':>6} {'s/ep':>6} {'GiB':>6}  " + \
               "  ".join(k.split(".")[-1][:10] for k in keys)
        print(head)
        for i, r in enumerate(done[:5]):
            m = r["metrics"]
            vals = "  ".join(f"{r['values'].get(k, float('nan')):.3g}".rjust(len(k.split('.')[-1][:10])) for k in keys)
            print(f"{i + 1:>4} {r['trial_id']:>10} {m['efficiency']:10.2f} {m.get('val_acc', 0):6.2f} "
                  f"{m.get('epoch_time_last5_s', 0):6.2f} {m.get('peak_mem_gib', 0):6.3f}  {vals}")
    print(f"export the best: triaccel export {name} --out tuned.yaml    browse: triaccel ui")
    return {"finished": len(done), "failed": len(failed), "trials": len(rows), "best": done[0] if done else None}


def confirm_top(name: str, space: SearchSpace, uri: str, k: int) -> None:
    """Re-run the top K configurations alone (no GPU sharing) and log them as confirm runs."""
    from triaccel.control import TriAccelLoop
    from triaccel.search.callbacks import TAG_ROLE, TAG_SEARCH
    from triaccel.tracking import MLflowLogger
    from triaccel.trainer import Trainer

    c, exp, rows, confirms = _rows(name, uri)
    done_ids = {x["confirms"] for x in confirms if x["status"] == "FINISHED"}
    done = sorted([r for r in rows if r["status"] == "FINISHED" and "efficiency" in r["metrics"]],
                  key=lambda r: -r["metrics"]["efficiency"])[:k]
    parent = c.search_runs([exp], filter_string=f"tags.`{TAG_SEARCH}` = '{name}' and tags.`{TAG_ROLE}` = 'parent'")
    for r in done:
        if r["run_id"] in done_ids:
            continue
        cfg = space.train_config(r["values"])
        cfg.tracking.experiment = EXPERIMENT
        cfg.tracking.run_name = f"{name}-confirm-{r['trial_id']}"
        cfg.evaluate_test = False
        logger = MLflowLogger(cfg, parent_run_id=parent[0].info.run_id if parent else None,
                              extra_tags={TAG_SEARCH: name, TAG_ROLE: "confirm", "triaccel.confirms": r["run_id"],
                                          "triaccel.values": json.dumps(r["values"]), "shared_trials": "1",
                                          "triaccel.trial_id": f"confirm-{r['trial_id']}"})
        cbs = ([TriAccelLoop(cfg.triaccel, log=lambda *a: None)] if cfg.mode == "triaccel" else []) + [logger]
        print(f"confirm {r['trial_id']}: re-running alone ...", flush=True)
        t = Trainer(cfg, callbacks=cbs, log=lambda *a: None).setup()
        try:
            s = t.fit()
        except TriAccelError as e:
            logger.finish("FAILED", reason=f"{type(e).__name__}: {e}")
            continue
        log = {"efficiency": s["efficiency"], "val_acc": s["val_acc"], "epoch_time_last5_s": s["epoch_time_last5_s"],
               "peak_mem_gib": s["peak_mem_gib"]}
        from triaccel.tracking import log_metrics

        log_metrics(logger.client, logger.run_id, log, step=t.epoch + 1)
        logger.finish()
        print(f"confirm {r['trial_id']}: eff {s['efficiency']:.2f} (shared: {r['metrics']['efficiency']:.2f})  "
              f"val {s['val_acc']:.2f}%", flush=True)


def export(name: str, out: str, how: str = "best") -> Path:
    state = read_state(name)
    space = parse_space(state["space"], source=state["source"], sha256=state["sha256"])
    from triaccel.search.results import pick

    c, exp, rows, confirms = _rows(name, state["tracking_uri"])
    row, measured = pick(rows, confirms, space.objective, how)
    train = space.train_dict(row["values"])
    train.setdefault("tracking", {})
    train["tracking"] = {**train["tracking"], "enabled": True, "experiment": "triaccel-train"}
    train["evaluate_test"] = True
    from triaccel.config import TrainConfig, from_dict, to_dict

    cfg = from_dict(TrainConfig, train)  # what `triaccel train --config` will accept
    data = to_dict(cfg)
    from triaccel.tracking import git_revision

    data["provenance"] = {
        "search": name, "mlflow_run_id": row["run_id"], "trial_id": row["trial_id"],
        "tracking_uri": state["tracking_uri"], "pick": how, "objective": space.objective,
        "confirmed_alone": any(x["confirms"] == row["run_id"] for x in confirms),
        "metrics": {k: float(v) for k, v in measured.items() if k in ("efficiency", "val_acc", "epoch_time_last5_s",
                                                                         "peak_mem_gib", "shared_trials")},
        "searched": row["values"], "space_file": state["source"], "space_sha256": state["sha256"],
        "exported": datetime.datetime.now().isoformat(timespec="seconds"), "git_revision": git_revision()}
    p = Path(out)
    if p.exists() and p.is_dir():
        raise ConfigError(f"--out {out}: is a directory")
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(f"# Exported by `triaccel export {name}` from MLflow run {row['run_id']}.\n"
                   f"# Train with: triaccel train --config {p}\n" + yaml.safe_dump(data, sort_keys=False))
    os.replace(tmp, p)
    return p


def list_searches() -> list[dict]:
    out = []
    for name in list_names():
        st = read_state(name)
        item = {"name": name, "space": st["source"], "created": st["created"], "trials": st["space"].get("trials")}
        try:
            _, _, rows, _ = _rows(name, st["tracking_uri"])
            done = [r for r in rows if r["status"] == "FINISHED" and "efficiency" in r["metrics"]]
            item.update(finished=len(done), failed=sum(r["status"] == "FAILED" for r in rows),
                        best=max((r["metrics"]["efficiency"] for r in done), default=None))
        except Exception as e:  # a store that moved: still list the search
            item["error"] = str(e)[:100]
        out.append(item)
    return out
