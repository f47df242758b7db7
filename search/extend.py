"""``triaccel extend NAME --trials N``: a finished search gets N more trials.

The new trials run as a Tune run of their own (Tune's folder ``<tune>/NAME/extend-<i>``) whose
Optuna study holds every earlier trial of the search before it suggests the first new one:
each finished trial as a COMPLETE trial with its params (in Optuna's names, ``space.sampled``),
the space's distributions, the value(s) Tune reported to Optuna (efficiency, or the Pareto
metrics) and its accuracy constraint; each failed one as FAIL. Its trials log to the same MLflow
search, so the rules, the summary and ``export`` rank them with the earlier ones. The sampler's
seed moves on by the number of earlier trials (the random sampler would otherwise propose the
first search's points again). How many completed trials the study held at its first suggestion
is kept on the parent run (metric ``extend_seen_trials``).
"""
from __future__ import annotations

import dataclasses
import math
import os

from triaccel.errors import ConfigError, Interrupted

TRIALS_VALUE = {"efficiency": ("efficiency",), "pareto": ("val_acc", "epoch_time_last5_s", "peak_mem_gib")}


def earlier_trials(rows: list[dict], space) -> list:
    """The search's trial rows as Optuna trials (runs cut short, KILLED or RUNNING, left out)."""
    from optuna.trial import TrialState, create_trial

    dists = space.optuna_distributions()
    keys = TRIALS_VALUE[space.objective]
    out = []
    for r in rows:
        if r["status"] not in ("FINISHED", "FAILED") or set(space.params) - set(r["values"]):
            continue
        params = {k: v for k, v in space.sampled({k: r["values"][k] for k in space.params}).items() if k in dists}
        vals = [r["metrics"].get(k) for k in keys]
        done = r["status"] == "FINISHED" and all(v is not None and math.isfinite(v) for v in vals)
        attrs = {}
        if done and r["metrics"].get("acc_constraint") is not None:
            attrs["constraints:accuracy"] = float(r["metrics"]["acc_constraint"])
        try:
            out.append(create_trial(params=params, distributions={k: dists[k] for k in params},
                                    values=vals if done else None, system_attrs=attrs,
                                    state=TrialState.COMPLETE if done else TrialState.FAIL))
        except ValueError:  # a value outside the space (edited since?): not a point this study can hold
            continue
    return out


def check_can_extend(name: str, trials: int, state: dict) -> str:
    """The search's store, once the options and the search are known fit to extend; nothing written."""
    from triaccel.search.state import again, search_finished, sqlite_path, state_store, tune_root
    from triaccel.search.space import MAX_TRIALS

    if not 1 <= trials <= MAX_TRIALS:
        raise ConfigError(f"--trials: invalid value {trials} (must be in [1, {MAX_TRIALS}])")
    uri = state_store(state)
    if uri.startswith("sqlite:///") and not sqlite_path(uri).is_file():
        raise ConfigError(f"search '{name}': its MLflow store {sqlite_path(uri)} is gone (moved or deleted)")
    if not os.access(tune_root() / name, os.W_OK | os.X_OK):
        raise ConfigError(f"{tune_root() / name}: cannot write there (a read-only disk or no permission)")
    finished = search_finished(name, uri)
    if finished is not True:
        why = "no parent run in its store" if finished is None else "stopped or still running"
        raise ConfigError(f"search '{name}' has not finished ({why}): `{again('resume', name)}` finishes it; "
                          f"extend it then")
    return uri


def extend_search(name: str, trials: int, address: str | None = None, confirm: int | None = None) -> dict:
    from triaccel.search.alone import check_confirm
    from triaccel.search.lock import driver_lock
    from triaccel.search.state import read_state, saved_option, tune_root

    state = read_state(name)
    check_confirm(confirm)
    if confirm is None:  # as the search was started: trials the search's rules rank must be confirmed alike
        confirm = saved_option(state, "confirm")
    with driver_lock(name, tune_root() / name, "extend"):  # one driver per search, extensions included
        return _extend(name, state, trials, address, confirm)


def _extend(name: str, state: dict, trials: int, address: str | None, confirm: int | None) -> dict:
    from triaccel.search import phases
    from triaccel.search.alone import default_confirm, run_baselines
    from triaccel.search.cluster import init_ray, on_gpu
    from triaccel.search.results import trial_table
    from triaccel.search.runner import check_cluster, finish, reach_search_folder
    from triaccel.search.signals import bounded_http_retries, interruptible, own_signals
    from triaccel.search.state import next_extension_folder, open_store, saved_space
    from triaccel.search.tuner import left_to_run, new_searcher, new_tuner, quiet_tune_failures
    from triaccel.tracking import log_metrics

    space = saved_space(state)
    bounded_http_retries()
    uri = check_can_extend(name, trials, state)
    from triaccel.userref import check_user_code, use_runtime_env

    use_runtime_env(state.get("runtime_env"), "extend")  # the user's code where the search found it, from any folder
    check_user_code(space)  # as resume: before Ray starts, code changed since, or functions not handed again
    check_cluster(name, address, state, "extend", f"--trials {trials}")
    reach_search_folder(name, address, state, "extend", f"--trials {trials}")
    c, exp = open_store(uri)
    rows = trial_table(c, exp, name)
    seeds = earlier_trials(rows, space)
    more = dataclasses.replace(space, trials=trials, start=(), seed=(space.seed + len(rows)) % 2**32)
    tune_dir = next_extension_folder(name)
    print(f"triaccel extend '{name}': {trials} more trials; the sampler starts from its {len(seeds)} earlier "
          f"trials; Tune state in {tune_dir}", flush=True)
    with interruptible(name, uri):
        ref_curve = run_baselines(name, space, uri, state["shared"])  # finished already: read, not trained
        init_ray(address or state.get("address"), runtime_env=state.get("runtime_env"))
        quiet_tune_failures()
        searcher = new_searcher(more, seeds)
        with own_signals() as watch, phases.timed(uri, name, "trials"):
            new_tuner(more, name, uri, state["shared"], ref_curve, searcher=searcher, tune_dir=tune_dir).fit()
        seen = searcher.searcher.seen_before_first
        parent = next(iter(c.search_runs([exp], filter_string=f"tags.`triaccel.search` = '{name}' and "
                                                             f"tags.`triaccel.role` = 'parent'", max_results=1)))
        if seen is not None:
            log_metrics(c, parent.info.run_id, {"extend_seen_trials": seen}, step=int(tune_dir.name.split("-")[1]))
        left = 0 if watch.stopped is False else left_to_run(name, trials, tune_dir)  # as check_finished
        if left:
            raise Interrupted(f"{left} of the {trials} added trials left")
        return finish(name, space, uri, default_confirm(confirm, state["shared"], on_gpu(space), name))
