"""Starting and resuming a search: check everything, claim the name, then baselines, trials and the
finish (confirm runs, the judge, the summary). Each step lives in a module named for its job:
cluster (Ray), tuner (Optuna in Tune), state (saved state and store), signals (how a search stops),
alone (baselines, confirm runs), summary (the console), export, listing."""
from __future__ import annotations

import contextlib
import datetime
import os
import sys
from pathlib import Path

from triaccel.errors import ConfigError, TriAccelError, check_stop
from triaccel.search import phases
from triaccel.search.alone import CONFIRM_WHEN_SHARED, check_confirm, confirm_top, default_confirm, run_baselines
from triaccel.search.cluster import (check_address, check_driver_device, check_nodes_reach, check_resources, init_ray,
                                    on_gpu, shared_trials)
from triaccel.search.lock import driver_lock
from triaccel.search.signals import bounded_http_retries, interruptible, own_signals
from triaccel.search.space import CONTROLLER_DEFAULTS, MAX_PRODUCTION_EPOCHS, MAX_TRIALS, SearchSpace, load_space
from triaccel.search.state import (EXPERIMENT, STATE_FILE, again, check_name, claim_name, close_orphan_trials, close_running,
                                   name_unused_in_store, note_space_edits, open_store, parent_run, read_outcome, read_state, record_best,
                                   rewrite_state, saved_option, saved_space, search_finished, sqlite_path, state_store, tune_root,
                                   usable_store, write_state)
from triaccel.search.tuner import (check_finished, new_tuner, quiet_tune_failures, restorable, trial_trainable,
                                  unfinished_extension, unstarted_extension)
from triaccel.tracking import shown


def run_search(space_path: str, name: str | None = None, trials: int | None = None, concurrency: int | None = None,
               gpus_per_trial: float | None = None, address: str | None = None, confirm: int | None = None,
               fresh_baselines: bool = False, warm_start: str | None = None, warm_start_k: int | None = None,
               source: str | None = None) -> dict:
    """Start a new search: the space and every option checked, the store checked and the name claimed
    (its state written under the driver lock), then the search run to its finish. ``source``: what to call the
    space where the file is not the user's (load_space)."""
    space = load_space(space_path, source)  # every error surfaces here, before Ray starts
    check_confirm(confirm)
    if warm_start_k is not None and warm_start is None:
        raise ConfigError("--warm-start-k: needs --warm-start NAME (the search whose best trials start this one)")
    check_address(address)
    given = {}
    for k, v, ok, want in (("trials", trials, lambda v: 1 <= v <= MAX_TRIALS, f"in [1, {MAX_TRIALS}]"),
                           ("concurrency", concurrency, lambda v: v >= 1, ">= 1"),
                           ("gpus_per_trial", gpus_per_trial, lambda v: 0 < v <= 8, "in (0, 8]")):
        if v is not None:
            if not ok(v):  # NaN fails every comparison
                raise ConfigError(f"--{k.replace('_', '-')}: invalid value {v} (must be {want})")
            given[k] = v
    if given:  # a new space, checked as the file would be, with the values in the state it saves
        space = space.with_options(**given)
    if warm_start is not None:  # the earlier search's best points join the start points (search.warmstart)
        from triaccel.search import warmstart

        check_name(warm_start, "--warm-start")
        space = warmstart.warm_start(space, warm_start, warmstart.DEFAULT_K if warm_start_k is None else warm_start_k)
    check_name(name if name is not None else space.name, "--name" if name is not None else
               f"{space.source}: name" if "name" in space.raw else "--name (default: the space file's name)")
    name = name if name is not None else space.name
    if len(space.start) > space.trials:  # the points past the trial count never run: say so
        print(f"triaccel: note: {space.source} has {len(space.start)} start points and the search runs "
              f"{space.trials} trials: only the first {space.trials} run", file=sys.stderr, flush=True)
    check_resources(space, address)
    from triaccel.userref import check_user_code

    runtime_env, callables = check_user_code(space)  # a bad model or data reference: before anything is written
    check_driver_device(space, address, runtime_env)
    path = tune_root() / name
    if (path / STATE_FILE).exists():
        raise ConfigError(_name_taken(name, path))
    checked = [p for p in (path, *path.parents) if not p.exists()]  # deepest first: what the node check makes
    try:
        if address and address != "local":  # every node reaches the Tune folder: before anything is written
            init_ray(address, runtime_env=runtime_env)
            reach_new_folder(path, address)
        bounded_http_retries()
        uri = usable_store()  # before the search takes its name: an unusable store must leave nothing behind
        name_unused_in_store(name, uri, path)
    except BaseException:  # refused (or stopped): no folder the node check made stays
        for p in checked:
            with contextlib.suppress(OSError):  # one another driver of that name has written into stays
                p.rmdir()
        raise
    made = path in checked or not path.exists()  # the node check's folder is this search's own
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{path}: cannot write the search's state there ({e.strerror or e}; "
                          f"TRIACCEL_TUNE_DIR chooses another folder)") from None
    # before the state is written: a resume that finds the state finds the lock held
    with driver_lock(name, path, "search", refused=f"search '{name}' already exists in {path} (started meanwhile "
                                                   f"by another process): choose another --name"):
        return _claim_and_run(name, space, uri, path, made, address, confirm, fresh_baselines, runtime_env, callables)


def reach_new_folder(path: Path, address: str) -> None:
    """``check_nodes_reach`` for a new search's Tune folder, made for the check (``run_search`` removes what it
    made, the folders above it included, where the search is refused there or later)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return  # the search's own mkdir says why, in its words
    check_nodes_reach(path, address, "give the search a folder every node reaches at the same path (--storage "
                                     "on a shared disk)")


def at_a_time(space: SearchSpace, shared: int, address: str | None) -> str:
    """How many trials run at once, as the header says it: on this machine's CPUs Ray runs no more than
    its cores hold (``shared``), whatever --concurrency asked; a GPU machine or a cluster runs what it
    has room for, which the driver cannot know before Ray starts."""
    if address is None and not on_gpu(space) and shared < space.concurrency:
        return (f"{shared} at a time (concurrency {space.concurrency}: this machine's CPUs hold {shared} at "
                f"cpus_per_trial {space.cpus_per_trial:g})")
    return f"{space.concurrency} at a time"


def _claim_and_run(name: str, space: SearchSpace, uri: str, path: Path, made: bool, address: str | None,
                   confirm: int | None, fresh_baselines: bool, runtime_env: dict | None, callables: dict) -> dict:
    """Write the new search's state (taking its name), then run it: baselines, trials, finish."""
    shared = shared_trials(space)
    state = {"name": name, "space": space.raw, "source": space.source, "sha256": space.sha256, "tracking_uri": uri,
             "source_path": str(Path(space.source).resolve()) if Path(space.source).is_file() else None,
             "address": address, "created": datetime.datetime.now().isoformat(timespec="seconds"), "shared": shared,
             "controller_defaults": CONTROLLER_DEFAULTS, "fresh_baselines": fresh_baselines,
             # where the workers import the user's code from, and the functions handed from Python
             "runtime_env": runtime_env, "callables": callables,
             # the command's options that shape the search beyond its space (trials, concurrency and
             # gpus_per_trial are in space above, overrides applied): resume uses them unless given again
             "options": {"confirm": confirm}}
    write_state(name, path, state, made)
    claim_name(name, space, uri, path, made, shared)  # and in the store, which other Tune folders share
    print(f"triaccel search '{name}': {space.trials} trials of {space.source}, {at_a_time(space, shared, address)}, "
          f"objective {space.objective}; Tune state in {path}; MLflow {shown(uri)} (experiment '{EXPERIMENT}')", flush=True)
    with interruptible(name, uri):
        with phases.timed(uri, name, "baselines"):
            ref_curve = run_baselines(name, space, uri, shared, fresh=fresh_baselines)
        init_ray(address, runtime_env=runtime_env)
        quiet_tune_failures()
        with own_signals() as watch, phases.timed(uri, name, "trials"):
            new_tuner(space, name, uri, shared, ref_curve).fit()
        check_finished(name, space.trials, watch.stopped)
        return finish(name, space, uri, default_confirm(confirm, shared, on_gpu(space), name))


def resume_search(name: str, address: str | None = None, confirm: int | None = None,
                  production_epochs: int | None = None) -> dict:
    state = read_state(name)
    check_confirm(confirm)
    if not os.access(tune_root() / name, os.W_OK | os.X_OK):  # not pyarrow's traceback from Tune's restore
        raise ConfigError(f"{tune_root() / name}: cannot write there (a read-only disk or no permission): resume "
                          f"continues the search in that folder")
    if production_epochs is not None:
        check_production_epochs(saved_space(state), production_epochs, confirm)
    asked = confirm  # --confirm given now: a finished search runs its confirm step with it
    if confirm is None:  # as the search was started (a search stopped in its confirm runs resumes them)
        confirm = saved_option(state, "confirm")
    with driver_lock(name, tune_root() / name, "resume"):  # before anything is written or started
        if production_epochs is not None:  # the top K: --confirm K, else the search's own K where above 0, else 3
            return judge_again(name, state, address, production_epochs, asked or confirm or CONFIRM_WHEN_SHARED)
        return _resume(name, state, address, confirm, asked)


def check_production_epochs(space: SearchSpace, n, confirm: int | None) -> None:
    """``--production-epochs N`` (``production_epochs=N`` from Python): a whole number in the space's own
    bounds for production_epochs, a space with a baseline to judge against, a K of at least 1."""
    if isinstance(n, bool) or not isinstance(n, int) or not space.epochs <= n <= MAX_PRODUCTION_EPOCHS:
        raise ConfigError(f"--production-epochs {n}: must be in [train.epochs ({space.epochs}), "
                          f"{MAX_PRODUCTION_EPOCHS}]: the length the export is trained for, judged at that length")
    if not space.baseline_runs():
        raise ConfigError(f"--production-epochs {n}: the search trained no static baseline (its space's "
                          f"baseline.batch_sizes is empty): there is nothing to judge its trials against")
    if confirm == 0:
        raise ConfigError(f"--production-epochs {n} with --confirm 0: the judge trains the top K trials "
                          f"again at that length; give K of 1 or more, or leave --confirm out")


def judge_again(name: str, state: dict, address: str | None, n: int, k: int) -> dict:
    """``resume --production-epochs N`` on a finished search: its top K trials and its reference train alone
    at N epochs, paired by seed (``run_judge``; pairs at N already in the store are kept), the summary and
    pick follow that verdict, and only then does the search's state take N as its production length (what
    ``export`` trains). Judge runs at an earlier length stay in the store and count only at theirs."""
    import dataclasses
    import json

    space, uri = _reopen(name, state, address)
    space = dataclasses.replace(space, production_epochs=n)
    rest = f"--production-epochs {n}"
    if not search_finished(name, uri):
        raise ConfigError(f"--production-epochs {n}: search '{name}' has not finished: `{again('resume', name)}` "
                          f"finishes it at its own length first")
    from triaccel.search.judge import run_judge
    from triaccel.userref import check_user_code

    check_user_code(space)
    if (joined := address or state.get("address")) and joined != "local":  # its runs alone hold this node
        init_ray(joined, runtime_env=state.get("runtime_env"))
    was = state["space"].get("production_epochs")
    print(f"triaccel resume '{name}': judging it at {n} epochs (was {was or 'none'}): its top {k} and its "
          f"reference train alone at that length", flush=True)
    with interruptible(name, uri, rest):
        with phases.timed(uri, name, "confirm"):
            run_judge(name, space, uri, k)
        out = finish(name, space, uri, 0)  # the verdict at N, the summary; the confirm step is not run again
    raw = json.loads((tune_root() / name / STATE_FILE).read_text())  # as saved, not as read_state pinned it
    raw["space"]["production_epochs"] = n
    rewrite_state(name, raw)
    print(f"triaccel resume '{name}': judged at {n} epochs from now on (was {was or 'none'}): "
          f"`{again('export', name, '--out tuned.yaml')}` trains that long", flush=True)
    return out


def check_cluster(name: str, address: str | None, state: dict, verb: str = "resume", rest: str = "") -> None:
    """``--address``, else the cluster the search recorded, answers (``check_address``); where the recorded
    one is gone, the error says how to go on without it; a GPU cluster joined from a machine with none is
    refused (``check_driver_device``)."""
    try:
        check_address(address or state.get("address"))
    except TriAccelError as e:
        if address or not state.get("address"):
            raise
        how = again(verb, name, f"{rest} --address local".strip())
        raise type(e)(f"{e}; the search started on that cluster: `{how}` continues it on this machine, "
                      f"--address HOST:PORT on another cluster") from None
    check_driver_device(saved_space(state), address or state.get("address"), state.get("runtime_env"))


def reach_search_folder(name: str, address: str | None, state: dict, verb: str, rest: str = "") -> None:
    """``check_nodes_reach`` for a search that continues (resume, extend) on the cluster it joins."""
    joined = address or state.get("address")
    if joined and joined != "local":
        init_ray(joined, runtime_env=state.get("runtime_env"))
        check_nodes_reach(tune_root() / name, joined, f"make it reach them there (a shared disk), or "
                                                      f"`{again(verb, name, f'{rest} --address local'.strip())}` "
                                                      f"continues the search on this machine")


def _name_taken(name: str, path: Path) -> str:
    """What a new search under a name already taken is told: how to go on with that search."""
    try:
        finished = search_finished(name, state_store(read_state(name)))
    except Exception:  # an unreadable state or store: the state's own commands will say why
        finished = None
    if finished:
        return (f"search '{name}' already exists in {path} and has finished: `{again('export', name, '--out tuned.yaml')}` "
                f"writes its pick, `{again('extend', name, '--trials N')}` adds trials, or choose another --name")
    return f"search '{name}' already exists in {path}: `{again('resume', name)}` continues it, or choose another --name"


def _reopen(name: str, state: dict, address: str | None) -> tuple[SearchSpace, str]:
    """What every resume does first: the cluster answers, the user's code is found where the search found
    it (from any folder), and its MLflow store is still there. Returns (the saved space, the store's URI)."""
    from triaccel.userref import use_runtime_env

    check_cluster(name, address, state)
    use_runtime_env(state.get("runtime_env"))
    uri = state_store(state)
    bounded_http_retries()
    if uri.startswith("sqlite:///") and not sqlite_path(uri).is_file():
        # moved or deleted: resuming would train the baseline again into a new, empty store and report
        # the search finished with the trials it ran there
        raise ConfigError(f"search '{name}': its MLflow store {sqlite_path(uri)} is gone (moved or deleted): "
                          f"put it back to resume the search")
    return saved_space(state), uri


def _resume(name: str, state: dict, address: str | None, confirm: int | None, asked: int | None = None) -> dict:
    space, uri = _reopen(name, state, address)
    from ray import tune

    from triaccel.userref import check_user_code

    finished = search_finished(name, uri)  # its parent run closed FINISHED: only `finish` does that
    if finished and not asked:  # nothing will train: the user's code is not needed, nor asked for
        print(f"triaccel resume '{name}': the search has finished; nothing was left to run (export it: "
              f"{again('export', name, '--out tuned.yaml')})", flush=True)
        return {"finished_already": True}
    check_user_code(space)  # a function handed from Python is refused here unless handed again (triaccel.resume)
    if finished:  # `resume NAME --confirm K`: the trials are done, the confirm step runs with K
        print(f"triaccel resume '{name}': the search has finished; its trials are not re-run, "
              f"the confirm step runs with --confirm {asked}", flush=True)
        if (joined := address or state.get("address")) and joined != "local":  # its runs alone hold this node
            init_ray(joined, runtime_env=state.get("runtime_env"))
        with interruptible(name, uri):
            return finish(name, space, uri, asked)
    try:  # before anything runs: a state that cannot finish is refused
        ext = unfinished_extension(name)  # a stopped `extend`: its own Tune folder, its own trials
        restore = ext is not None or restorable(name, space)
    except TriAccelError:
        close_running(name, uri)  # what a killed driver left RUNNING: nothing continues it now
        raise
    folder, planned = ext or (tune_root() / name, space.trials)
    reach_search_folder(name, address, state, "resume")  # what is left to run runs on the cluster's nodes
    note_space_edits(state)
    if ext is None and (unstarted := unstarted_extension(name)) is not None:  # its trials would vanish unsaid
        print(f"triaccel resume '{name}': note: the extend in {unstarted} stopped before its first trial "
              f"started, and none of its trials will run: `{again('extend', name, '--trials N')}` adds them "
              f"once this resume has finished the search", flush=True)
    print(f"triaccel resume '{name}': " + (f"restoring {folder}" if restore else
                                          "Tune saved no trial yet: starting the trials"), flush=True)
    with interruptible(name, uri):
        with phases.timed(uri, name, "baselines"):
            ref_curve = run_baselines(name, space, uri, state["shared"],  # those not finished before
                                      fresh=bool(state.get("fresh_baselines")))
        init_ray(address or state.get("address"), runtime_env=state.get("runtime_env"))
        quiet_tune_failures()
        if restore:
            trainable = trial_trainable(space, state["shared"], ref_curve, folder)
            tuner = tune.Tuner.restore(str(folder), trainable=trainable,
                                       resume_unfinished=True, resume_errored=False, restart_errored=False)
        else:  # stopped before Tune saved its first state (in the baselines or Tune's start-up): trials start now
            close_orphan_trials(name, uri)
            tuner = new_tuner(space, name, uri, state["shared"], ref_curve)
        with own_signals() as watch, phases.timed(uri, name, "trials"):
            tuner.fit()
        check_finished(name, planned, watch.stopped, folder)
        return finish(name, space, uri, default_confirm(confirm, state["shared"], on_gpu(space), name))


def finish(name: str, space: SearchSpace, uri: str, confirm: int) -> dict:
    """The search's end: the confirm runs and the judge where asked, the parent run's best, the console
    summary, and the parent run closed FINISHED (nothing else closes it so)."""
    from triaccel.search.judge import judged, run_judge
    from triaccel.search.summary import print_summary

    check_stop()  # a stop asked for while Tune ran (SIGTERM reaches Tune's handler) or since
    if confirm:
        with phases.timed(uri, name, "confirm"):
            confirm_top(name, space, uri, confirm)
            run_judge(name, space, uri, confirm)
    check_stop()  # no FINISHED parent after a stop asked for in the last run's end
    o = read_outcome(name, space, uri)
    j = judged(name, space, uri, o)
    record_best(name, space, uri, o, j)
    p = print_summary(name, space, uri, o, j)
    c, _ = open_store(uri)
    c.set_terminated(parent_run(name, space, uri), status="FINISHED")
    best = o.best.row if o.best else None
    return {"name": name, "finished": len(o.ranked), "feasible": len(o.feasible), "failed": len(o.failed), "trials": o.trials,
            "best": best, "pick": p.kind if p else None}
