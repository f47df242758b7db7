"""Launching, resuming, confirming and exporting searches.

Layout under the store (default ``mlruns/``; ``--storage`` or TRIACCEL_TUNE_DIR moves ``mlruns/tune``):
    mlruns/tune/<name>/                 Ray Tune's experiment state (what ``resume`` restores)
    mlruns/tune/<name>/triaccel_search.json   the validated space and options of the search
    mlruns/tune/<name>/extend-<i>/      the Tune run of ``triaccel extend`` number i (search.extend)
    mlruns/mlflow.db, mlruns/artifacts  MLflow (unless MLFLOW_TRACKING_URI says otherwise)
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime
import json
import logging
import math
import os
import sys
from pathlib import Path

import yaml

from triaccel.errors import ConfigError, Interrupted, TriAccelError, disk_full, interrupted
from triaccel.search import phases
from triaccel.search.lock import LOCK_FILE, driver_lock
from triaccel.search.space import (CONTROLLER_DEFAULTS, MAX_TRIALS, START, SearchSpace, load_space, parse_space,
                                   pin_controller_defaults)
from triaccel.tracking import tracking_uri as resolve_uri

EXPERIMENT = "triaccel-search"
STATE_FILE = "triaccel_search.json"


def tune_root() -> Path:
    raw = os.environ.get("TRIACCEL_TUNE_DIR")
    if raw is not None and not raw.strip():  # an empty value would mean the current folder, silently
        raise ConfigError("TRIACCEL_TUNE_DIR is set but empty: unset it (default mlruns/tune) or name a folder")
    p = Path(raw or "mlruns/tune").resolve()
    if p.exists() and not p.is_dir():  # a misset variable, not an empty store
        raise ConfigError(f"TRIACCEL_TUNE_DIR={raw}: is a file, not a folder")
    return p


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:
        return 0


def on_gpu(space: SearchSpace) -> bool:
    """Its trials train on a GPU: the machine has one and the space's train.device is not cpu. A CPU space
    on a GPU machine must not ask each trial for a share of a GPU it never uses: its trials would run a
    GPU's worth at a time instead of a core each, and be measured as GPU-sharing trials."""
    return _gpu_count() > 0 and str(space.train.get("device", "auto")).strip().lower() != "cpu"


def shared_trials(space: SearchSpace) -> int:
    """How many trials run at once on one device (recorded with every measurement)."""
    if on_gpu(space):
        return max(1, min(space.concurrency, int(math.floor(1 / space.gpus_per_trial + 1e-9))))
    return max(1, min(space.concurrency, os.cpu_count() or 1))


def check_address(address: str | None) -> None:
    """Fail in seconds where nothing answers at ``--address HOST:PORT`` (or ``ray://HOST:PORT``):
    ``ray.init`` retries such an address for minutes. Ray reaches a loopback host through this
    node's IP, so either answering will do; ``auto`` and ``local`` are Ray's to resolve."""
    if not address or address == "local":
        return
    import socket

    label = address
    if address == "auto":  # Ray's own discovery (RAY_ADDRESS, the last `ray start`, a running GCS), now, not after the baselines
        try:
            from ray._private.services import canonicalize_bootstrap_address
        except ImportError:
            return
        try:
            found = canonicalize_bootstrap_address("auto")
        except ConnectionError:  # Ray's "Could not find any running Ray instance"
            found = None
        except Exception as e:  # noqa: BLE001
            raise TriAccelError(f"--address auto: cannot find a Ray cluster "
                                f"({str(e).splitlines()[0][:160] if str(e) else type(e).__name__})") from None
        if not found:
            raise TriAccelError("--address auto: no running Ray cluster found on this machine; start one with "
                                "`ray start --head`, or leave --address out for a local one")
        address, label = found, f"auto (found {found})"

    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise TriAccelError(f"--address {label}: expected HOST:PORT, ray://HOST:PORT or auto")
    target = host
    if host in ("localhost", "127.0.0.1", "::1"):  # Ray reaches a loopback address through this node's IP
        from ray.util import get_node_ip_address

        target = get_node_ip_address()
    try:
        conn = socket.create_connection((target, int(port)), timeout=5)
    except OSError as e:
        why = e.strerror or str(e) or type(e).__name__
        raise TriAccelError(f"--address {label}: cannot join a Ray cluster there (nothing answers on "
                            f"{host}:{port}: {why})") from None
    with conn:
        if not os.environ.get("RAY_USE_TLS") and not _speaks_grpc(conn):
            # ray.init would retry such a port for minutes (over 200 s)
            raise TriAccelError(f"--address {label}: cannot join a Ray cluster there (something answers on "
                                f"{host}:{port}, but not Ray: no gRPC server)")


def _speaks_grpc(conn) -> bool:
    """Whether the server on ``conn`` speaks HTTP/2, as Ray's GCS and client servers (gRPC) do: it
    answers a client's connection preface with a SETTINGS frame. An HTTP/1 server, an SSH daemon
    or anything else answers otherwise or not at all."""
    try:
        conn.settimeout(5)
        conn.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        head = b""
        while len(head) < 9:
            chunk = conn.recv(9 - len(head))
            if not chunk:
                break
            head += chunk
    except OSError:
        return False
    return len(head) == 9 and head[3] == 0x04  # frame type 4: SETTINGS


def _token_auth_for_this_node(address: str) -> None:
    """Joining a cluster of this machine by its address: use the node's token as ``auto`` does.

    ``ray start --head`` turns token authentication on where a token exists (``~/.ray/auth_token``,
    written by any earlier local ``ray.init``), and ``ray.init(address="auto")`` then finds and
    sends it, but an explicit address never does (Ray will not send a token to an address it is
    merely given): without this, the address ``ray start`` prints could not be joined. For this machine's own
    addresses (loopback, this node's IP) the token stays on the machine, so it is used; for any
    other host the user says so with RAY_AUTH_MODE=token, and the error says how.
    """
    if os.environ.get("RAY_AUTH_MODE") is not None or address in ("auto", "local"):
        return
    host = address.split("://", 1)[-1].rpartition(":")[0].strip("[]")
    from ray.util import get_node_ip_address

    if host not in ("localhost", "127.0.0.1", "::1", get_node_ip_address()):
        return
    token_file = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or token_file.is_file():
        os.environ["RAY_AUTH_MODE"] = "token"
        try:  # Ray read its config when it was imported: refresh it, as Ray's own `auto` path does
            from ray._raylet import Config

            Config.initialize("")
        except Exception:  # noqa: BLE001 -- a Ray without it reads the variable at ray.init
            pass


def _init_ray(address: str | None, quiet: bool = True, runtime_env: dict | None = None) -> None:
    """Ray, local or joined at ``address``; ``runtime_env`` ships the user's code to every worker
    (triaccel.userdef.runtime_env_for)."""
    import logging

    import ray

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "0")  # experiment state after every event: crash-safe
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    if ray.is_initialized():
        return
    kw = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR, configure_logging=True)
    if runtime_env:
        kw["runtime_env"] = runtime_env
    if address:
        _token_auth_for_this_node(address)
        try:
            ray.init(address=address, **kw)
        except Exception as e:  # noqa: BLE001 -- connection, auth and bad-address errors alike: one line
            hint = ""
            if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
                hint = ("; if the cluster uses token authentication (what `ray start` turns on where "
                        "~/.ray/auth_token exists), set RAY_AUTH_MODE=token and its token in RAY_AUTH_TOKEN")
            first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            raise TriAccelError(f"--address {address}: cannot join a Ray cluster there ({first}){hint}") from None
    else:  # a new local instance, even where a `ray start` cluster runs (joining one is what --address is for)
        try:
            ray.init(address="local", num_cpus=os.cpu_count(), **kw)
        except Exception as e:  # noqa: BLE001 -- a file-size limit, a node that timed out on a loaded machine
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            with contextlib.suppress(Exception):
                ray.shutdown()  # what it started, stopped
            raise TriAccelError(f"Ray could not start on this machine ({first}); its logs are under "
                                f"/tmp/ray/session_latest/logs") from None
    from triaccel.errors import stop_on_sigterm

    stop_on_sigterm()  # ray.init replaces it: SIGTERM would abort the driver with a stack dump (exit 134)


def _constrained_optuna():
    from ray.tune.search.optuna import OptunaSearch

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
            if isinstance(config, dict) and ot is not None and "fixed_params" in self._system_attrs(ot):
                config[START] = True
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


def _searcher(space: SearchSpace, seeds=()):
    import optuna
    from ray.tune.search import ConcurrencyLimiter

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if space.sampler == "random":
        sampler = optuna.samplers.RandomSampler(seed=space.seed)
    else:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sampler = optuna.samplers.TPESampler(seed=space.seed, multivariate=True, constant_liar=True,
                                                 n_startup_trials=max(2, min(10, space.trials // 3)))
    alg = _constrained_optuna()(space=space.optuna_distributions(), metric=space.metric, mode=space.mode,
                                sampler=sampler, start=copy.deepcopy(space.start), seeds=seeds)
    return ConcurrencyLimiter(alg, max_concurrent=space.concurrency)


def _trainable(space: SearchSpace, shared: int, ref_curve: list | None):
    from ray import tune

    from triaccel.search.trainable import run_trial, trial_class

    res = {"cpu": space.cpus_per_trial}
    if on_gpu(space):
        res["gpu"] = space.gpus_per_trial
    from triaccel.userdef import shipped

    fn = tune.with_parameters(run_trial, space_data=space.raw, shared=shared,
                              gpu_fraction=space.gpus_per_trial if on_gpu(space) else 1.0,
                              ref_curve=ref_curve, margin=space.margin, factories=shipped())
    return tune.with_resources(trial_class(fn), res)


def gpu_share(space: SearchSpace, shared: int) -> float:
    """The share of the device a trial holds: its GPU fraction, or 1/shared on a CPU machine."""
    return space.gpus_per_trial if on_gpu(space) else 1.0 / max(1, shared)


class _DropTuneFailureNoise(logging.Filter):
    """Tune's "Trials did not complete: [...]" after every search with a failed trial: the search's
    own summary counts them and each trial's line gave its reason."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Trials did not complete")


def quiet_tune_failures() -> None:
    """A failed trial is one console line, its reason (``trial 3/8 ... FAILED Diverged: ...``); Tune
    would also print the worker's whole traceback to stderr, ~40 lines per diverged trial. Its own
    switch turns that off (TUNE_PRINT_ALL_TRIAL_ERRORS=1 brings it back); the traceback stays in
    the trial's error file and its MLflow run."""
    os.environ.setdefault("TUNE_PRINT_ALL_TRIAL_ERRORS", "0")
    lg = logging.getLogger("ray.tune.tune")
    if not any(isinstance(f, _DropTuneFailureNoise) for f in lg.filters):
        lg.addFilter(_DropTuneFailureNoise())


def _tuner(space: SearchSpace, name: str, uri: str, shared: int, ref_curve: list | None, searcher=None,
           tune_dir: Path | None = None):
    """The search's Tuner; ``searcher`` and ``tune_dir`` (Tune's folder, default tune_root()/name):
    an extension's own (search.extend)."""
    from ray import tune
    from ray.tune.schedulers import FIFOScheduler

    from triaccel.search.callbacks import ConsoleReporter, MLflowSearchCallback

    from triaccel.config import TrainConfig, from_dict

    epochs = from_dict(TrainConfig, dict(space.train)).epochs
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
        _trainable(space, shared, ref_curve),
        tune_config=tune.TuneConfig(search_alg=searcher or _searcher(space), scheduler=sched, num_samples=space.trials,
                                    trial_dirname_creator=lambda t: t.trial_id, reuse_actors=False),
        run_config=tune.RunConfig(
            name=tune_dir.name if tune_dir else name, storage_path=str(tune_dir.parent if tune_dir else tune_root()),
            verbose=0,
            callbacks=[MLflowSearchCallback(uri, EXPERIMENT, name, space, shared, gpu_share(space, shared)),
                       ConsoleReporter(space.trials, epochs)],
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            failure_config=tune.FailureConfig(max_failures=0)))


def run_search(space_path: str, name: str | None = None, trials: int | None = None, concurrency: int | None = None,
               gpus_per_trial: float | None = None, address: str | None = None, confirm: int | None = None,
               fresh_baselines: bool = False, warm_start: str | None = None, warm_start_k: int | None = None) -> dict:
    space = load_space(space_path)  # every error surfaces here, before Ray starts
    _check_confirm(confirm)
    if warm_start_k is not None and warm_start is None:
        raise ConfigError("--warm-start-k: needs --warm-start NAME (the search whose best trials start this one)")
    check_address(address)
    for k, v, ok, want in (("trials", trials, lambda v: 1 <= v <= MAX_TRIALS, f"in [1, {MAX_TRIALS}]"),
                           ("concurrency", concurrency, lambda v: v >= 1, ">= 1"),
                           ("gpus_per_trial", gpus_per_trial, lambda v: 0 < v <= 8, "in (0, 8]")):
        if v is not None:
            if not ok(v):  # NaN fails every comparison
                raise ConfigError(f"--{k.replace('_', '-')}: invalid value {v} (must be {want})")
            space.raw[k] = v
    space = parse_space(space.raw, source=space.source, sha256=space.sha256, strict=True)
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
    from triaccel.userdef import check_user_code

    runtime_env, callables = check_user_code(space)  # a bad model or data reference: before anything is written
    path = tune_root() / name
    if (path / STATE_FILE).exists():
        raise ConfigError(f"search '{name}' already exists in {path}: `triaccel resume {name}` continues it, "
                          f"or choose another --name")
    bounded_http_retries()
    uri = usable_store()  # before the search takes its name: an unusable store must leave nothing behind
    name_unused_in_store(name, uri, path)
    made = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{path}: cannot write the search's state there ({e.strerror or e}; "
                          f"TRIACCEL_TUNE_DIR chooses another folder)") from None
    # before the state is written: a resume that finds the state finds the lock held
    with driver_lock(name, path, "search", refused=f"search '{name}' already exists in {path} (started meanwhile "
                                                   f"by another process): choose another --name"):
        return _claim_and_run(name, space, uri, path, made, address, confirm, fresh_baselines, runtime_env, callables)


def _claim_and_run(name: str, space: SearchSpace, uri: str, path: Path, made: bool, address: str | None,
                   confirm: int | None, fresh_baselines: bool, runtime_env: dict | None, callables: dict) -> dict:
    """Write the new search's state (taking its name), then run it: baselines, trials, finish."""
    shared = shared_trials(space)
    state = {"name": name, "space": space.raw, "source": space.source, "sha256": space.sha256, "tracking_uri": uri,
             "address": address, "created": datetime.datetime.now().isoformat(timespec="seconds"), "shared": shared,
             "controller_defaults": CONTROLLER_DEFAULTS, "fresh_baselines": fresh_baselines,
             # where the workers import the user's code from, and the functions handed from Python
             "runtime_env": runtime_env, "callables": callables,
             # the command's options that shape the search beyond its space (trials, concurrency and
             # gpus_per_trial are in space above, overrides applied): resume uses them unless given again
             "options": {"confirm": confirm}}
    tmp = path / f".{STATE_FILE}.{os.getpid()}.tmp"
    try:
        # whole or not at all: on a full disk an empty state file must not take the name (resume,
        # export and searches could not read it)
        tmp.write_text(json.dumps(state, indent=1))
        try:  # the name claimed exclusively: two searches of one name started together must not both run,
            os.link(tmp, path / STATE_FILE)  # into one Tune folder and one parent run
        except FileExistsError:
            raise ConfigError(f"search '{name}' already exists in {path} (started meanwhile by another "
                              f"process): choose another --name") from None
        except OSError:  # a file system without hard links
            os.replace(tmp, path / STATE_FILE)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if made:
            with contextlib.suppress(OSError):
                (path / LOCK_FILE).unlink()
                path.rmdir()
        raise ConfigError(f"{path}: cannot write the search's state there ({e.strerror or e}; "
                          f"TRIACCEL_TUNE_DIR chooses another folder)") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    print(f"triaccel search '{name}': {space.trials} trials of {space.source}, {space.concurrency} at a time, "
          f"objective {space.objective}; Tune state in {path}; MLflow {uri} (experiment '{EXPERIMENT}')", flush=True)
    with interruptible(name, uri):
        with phases.timed(uri, name, "baselines"):
            ref_curve = run_baselines(name, space, uri, shared, fresh=fresh_baselines)
        _init_ray(address, runtime_env=runtime_env)
        quiet_tune_failures()
        with own_signals() as watch, phases.timed(uri, name, "trials"):
            _tuner(space, name, uri, shared, ref_curve).fit()
        check_finished(name, space.trials, watch.stopped)
        return finish(name, space, uri, default_confirm(confirm, shared, on_gpu(space)))


NAME_MAX = 100


def check_name(name: str, key: str) -> None:
    """A search name is a folder under mlruns/tune and an MLflow tag value: one path component
    of letters, digits, '-' and '_' (no '/', '..', quotes or an empty name)."""
    if not name or len(name) > NAME_MAX or not name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(f"{key} {name!r}: use 1 to {NAME_MAX} letters, digits, '-' and '_'")


def check_resources(space: SearchSpace, address: str | None) -> None:
    """On the local Ray a search starts (no --address), a trial asking for more CPUs or GPUs
    than the machine has can never be scheduled: Tune would wait for it forever."""
    from triaccel.search.trainable import trial_threads

    trial_threads()  # every trial reads it: an unusable value is said once, here
    if address:
        return  # a cluster's resources are the cluster's to judge
    cpus = os.cpu_count() or 1
    if space.cpus_per_trial > cpus:
        raise ConfigError(f"{space.source}: cpus_per_trial: {space.cpus_per_trial:g} is more than this machine's "
                          f"{cpus} CPUs: no trial could start")
    gpus = _gpu_count()
    if on_gpu(space) and space.gpus_per_trial > gpus:
        raise ConfigError(f"{space.source}: gpus_per_trial: {space.gpus_per_trial:g} is more than this machine's "
                          f"{gpus} GPUs: no trial could start")


def name_unused_in_store(name: str, uri: str, path: Path) -> None:
    """A new search's name has no runs in the store: with its Tune state deleted (mlruns/tune/NAME), a new
    search of that name would take the old baseline and parent run and rank the old trials with its own."""
    from triaccel.search.callbacks import TAG_SEARCH

    c, exp = _client(uri)
    if c.search_runs([exp], filter_string=f"tags.`{TAG_SEARCH}` = '{name}'", max_results=1):
        raise ConfigError(f"the MLflow store {uri} already holds runs of a search named '{name}' (from another Tune "
                          f"folder than {path.parent}, or one deleted): choose another --name")


def usable_store() -> str:
    """The store the search will write (MLFLOW_TRACKING_URI, else sqlite:///mlruns/mlflow.db),
    checked once (``tracking.check_store`` through ``client``); an error names where it came from."""
    from triaccel.tracking import client

    key = "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "the MLflow store"
    uri = resolve_uri(None)  # the folder of a sqlite path that cannot be made: one line naming where it came from
    # checked as the search will use it (absolute): MLflow builds one store per URI string, and checking the
    # relative spelling first would build two, ~1.5 s each (schema checks) at every search's start
    absolute = absolute_store(uri)
    try:
        client(absolute, key=key)
        _client(absolute)  # its experiment deleted in the MLflow UI: said here, before the search takes its name
    except ConfigError:
        client(uri, key=key)  # the same failure, said with the path as it was given
        _client(uri)
        raise
    return absolute


def sqlite_path(uri: str) -> Path:
    """The file of a sqlite:/// store (its query, such as ?timeout=30, dropped)."""
    return Path(uri[len("sqlite:///"):].split("?", 1)[0])


def state_store(state: dict) -> str:
    """The store a saved search writes. A state that holds a relative sqlite store (the default
    sqlite:///mlruns/mlflow.db) is read relative to the folder holding mlruns/tune, where the search that
    wrote it ran, not against the current folder."""
    uri = state["tracking_uri"]
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(tune_root().parent.parent / uri[len("sqlite:///"):])
    return uri


def absolute_store(uri: str) -> str:
    """A relative sqlite store (the default sqlite:///mlruns/mlflow.db) as an absolute one, for the search's
    state: resolved against the current folder, `resume`, `export` and `searches` run from elsewhere (with
    TRIACCEL_TUNE_DIR) would read another, empty store and report 0 trials without a word."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
    return uri


def resume_search(name: str, address: str | None = None, confirm: int | None = None) -> dict:
    state = read_state(name)
    _check_confirm(confirm)
    if not os.access(tune_root() / name, os.W_OK | os.X_OK):  # not pyarrow's traceback from Tune's restore
        raise ConfigError(f"{tune_root() / name}: cannot write there (a read-only disk or no permission): resume "
                          f"continues the search in that folder")
    asked = confirm  # --confirm given now: a finished search runs its confirm step with it
    if confirm is None:  # as the search was started (a search stopped in its confirm runs resumes them)
        confirm = saved_option(state, "confirm")
    with driver_lock(name, tune_root() / name, "resume"):  # before anything is written or started
        return _resume(name, state, address, confirm, asked)


def saved_option(state: dict, key: str):
    """An option the search was started with (None: not given, or not in the saved state)."""
    options = state.get("options")
    return options.get(key) if isinstance(options, dict) else None


def _resume(name: str, state: dict, address: str | None, confirm: int | None, asked: int | None = None) -> dict:
    check_address(address or state.get("address"))
    space = parse_space(state["space"], source=state["source"], sha256=state["sha256"])
    from triaccel.userdef import check_user_code, use_runtime_env

    use_runtime_env(state.get("runtime_env"))  # the user's code where the search found it, from any folder
    check_user_code(space)  # a function handed from Python is refused here unless handed again (triaccel.resume)
    from ray import tune

    uri = state_store(state)
    bounded_http_retries()
    if uri.startswith("sqlite:///") and not sqlite_path(uri).is_file():
        # moved or deleted: resuming would train the baseline again into a new, empty store and report
        # the search finished with the trials it ran there
        raise ConfigError(f"search '{name}': its MLflow store {sqlite_path(uri)} is gone (moved or deleted): "
                          f"put it back to resume the search")
    if search_finished(name, uri):  # its parent run closed FINISHED: only `finish` does that
        if asked:  # `resume NAME --confirm K`: the trials are done, the confirm step runs with K
            print(f"triaccel resume '{name}': the search has finished; its trials are not re-run, "
                  f"the confirm step runs with --confirm {asked}", flush=True)
            with interruptible(name, uri):
                return finish(name, space, uri, asked)
        print(f"triaccel resume '{name}': the search has finished; nothing was left to run (export it: "
              f"triaccel export {name} --out tuned.yaml)", flush=True)
        return {"finished_already": True}
    restore = restorable(name, space)  # before anything runs: a state that cannot finish is refused here
    note_space_edits(state)
    print(f"triaccel resume '{name}': " + (f"restoring {tune_root() / name}" if restore else
                                          "Tune saved no trial yet: starting the trials"), flush=True)
    with interruptible(name, uri):
        with phases.timed(uri, name, "baselines"):
            ref_curve = run_baselines(name, space, uri, state["shared"],  # those not finished before
                                      fresh=bool(state.get("fresh_baselines")))
        _init_ray(address or state.get("address"), runtime_env=state.get("runtime_env"))
        quiet_tune_failures()
        if restore:
            tuner = tune.Tuner.restore(str(tune_root() / name), trainable=_trainable(space, state["shared"], ref_curve),
                                       resume_unfinished=True, resume_errored=False, restart_errored=False)
        else:  # stopped before Tune saved its first state (in the baselines or Tune's start-up): trials start now
            close_orphan_trials(name, uri)
            tuner = _tuner(space, name, uri, state["shared"], ref_curve)
        with own_signals() as watch, phases.timed(uri, name, "trials"):
            tuner.fit()
        check_finished(name, space.trials, watch.stopped)
        return finish(name, space, uri, default_confirm(confirm, state["shared"], on_gpu(space)))


def note_space_edits(state: dict) -> None:
    """Resume continues the search as it started (its saved space); say so when the file has changed since
    (the edits are not searched)."""
    import hashlib

    src = Path(state["source"])
    try:
        now = hashlib.sha256(src.read_bytes()).hexdigest()
    except OSError:
        return  # moved or deleted: the saved copy is all there is, nothing to tell apart
    if state.get("sha256") and now != state["sha256"]:
        print(f"triaccel: note: {src} has changed since the search started; resume continues the search as it "
              f"started (the space saved with it): start a new search (--name) to search the edited space",
              file=sys.stderr, flush=True)


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
    planned = planned_by_tune(path)
    if planned is not None and planned < space.trials:
        raise TriAccelError(f"search '{name}': its Tune state in {path} plans {planned} of the space's {space.trials} "
                            f"trials and cannot run the rest: start the search again under another name "
                            f"(`triaccel search --space {space.source} --name {name}2`)")
    return True


def planned_by_tune(path: Path) -> int | None:
    """The number of trials Tune's saved search generator will create in all (None if unread)."""
    try:
        from ray.tune.utils.util import _load_newest_checkpoint

        state = _load_newest_checkpoint(str(path), "search_gen_state-*.json")
        return int(state["total_samples"]) if state else None
    except Exception:  # noqa: BLE001 -- another Ray's layout: restore and let check_finished judge
        return None


def close_orphan_trials(name: str, uri: str) -> None:
    """Trial runs a driver opened in MLflow before Tune saved any state: they can never resume
    (their trials are not in Tune's state), so they are closed KILLED as new trials start."""
    from triaccel.search.callbacks import TAG_ROLE, TAG_SEARCH

    c, exp = _client(uri)
    for r in c.search_runs([exp], filter_string=f"tags.`{TAG_SEARCH}` = '{name}' and tags.`{TAG_ROLE}` = 'trial' "
                                                f"and attributes.status = 'RUNNING'", max_results=10000):
        c.set_terminated(r.info.run_id, status="KILLED")


def left_to_run(name: str, planned: int) -> int:
    """Trials a ``resume`` would still run, from the experiment state Tune saved (what ``resume``
    restores): those not created yet and those neither terminated nor errored."""
    from ray.tune import ExperimentAnalysis

    path = tune_root() / name
    if not any(path.glob("experiment_state-*.json")):
        return planned
    return max(0, planned - sum(t.status in ("TERMINATED", "ERROR") for t in ExperimentAnalysis(str(path)).trials))


def check_finished(name: str, planned: int, stopped: bool | None = None) -> None:
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
    left = left_to_run(name, planned)
    if left:
        raise Interrupted(f"{left} of {planned} trials left")


def _stopped(name: str, uri: str, left: str) -> None:
    close_running(name, uri)
    raise Interrupted(f"search '{name}' stopped before it finished{left}: `triaccel resume {name}` "
                      f"continues it") from None


# MLflow's client retries an unreachable server 7 times with a doubling back-off (about 4 minutes a call):
# with those defaults a server that dies mid-search hangs the search for 8.5 minutes. A search
# rides through a server restarted within about 15 s (1+2+4+8) and stops with one line after that.
HTTP_RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "4", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}


def bounded_http_retries() -> None:
    """The search's MLflow client gives up on a dead server in seconds (a user's own settings win)."""
    for k, v in HTTP_RETRIES.items():
        os.environ.setdefault(k, v)


def server_gone(e: BaseException, uri: str) -> str | None:
    """Why the MLflow server of an http(s) store no longer answers, if that is what ``e`` says."""
    if not uri.startswith(("http://", "https://")):
        return None
    import requests

    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
            return type(e).__name__
        text = str(e)
        if "Max retries exceeded" in text or "Connection refused" in text:
            return "connection refused" if "Connection refused" in text else "no answer"
        e = e.__cause__ or e.__context__
    return None


def tune_saw_a_signal(handler) -> bool | None:
    """Whether a stop signal reached Tune's fit(), from the SIGINT handler in place as fit() returns:
    Tune's own (``_setup_signal_catching``) is still there unless a SIGINT or SIGUSR1 reached it (it puts
    the previous handler back then). None where Tune installs none (TUNE_DISABLE_SIGINT_HANDLER)."""
    if os.environ.get("TUNE_DISABLE_SIGINT_HANDLER", "0") not in ("", "0"):
        return None
    return "signal_interrupt_tune_run" not in getattr(handler, "__qualname__", "")


@contextlib.contextmanager
def own_signals():
    """Around Tune's fit(): afterwards Ctrl-C and SIGTERM act as they did before it. Tune installs its own SIGINT
    handler for fit() and leaves it in place when fit() returns normally (ray/tune/tune.py,
    _setup_signal_catching), so a Ctrl-C or SIGTERM during the confirm runs would only set an event nobody
    reads: the search would run on, print its summary, close its parent run FINISHED and exit 0. The SIGINT
    handler from before fit() is put back (a caller's own, or SIG_IGN in a background job, stays theirs).
    Yields a namespace whose ``stopped`` says afterwards whether a stop signal reached Tune
    (``tune_saw_a_signal``; None where that is not known, as off the main thread)."""
    import signal
    import threading
    from types import SimpleNamespace

    from triaccel.errors import stop_on_sigterm

    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGINT) if main else None
    watch = SimpleNamespace(stopped=None)
    try:
        yield watch
    finally:
        if main:
            watch.stopped = tune_saw_a_signal(signal.getsignal(signal.SIGINT))
        if main and before is not None:
            signal.signal(signal.SIGINT, before)
            stop_on_sigterm()


@contextlib.contextmanager
def interruptible(name: str, uri: str):
    """Ctrl-C anywhere in a search (baselines, trials, confirm runs) ends it as stopped, never as
    finished: its runs still RUNNING in MLflow (the parent included) are closed KILLED, and the
    error says how to continue. The parent run is FINISHED only by ``finish``."""
    try:
        yield
    except (KeyboardInterrupt, Interrupted) as e:
        _stopped(name, uri, f" ({e})" if isinstance(e, Interrupted) else "")
    except Exception as e:  # noqa: BLE001 -- MLflow, sqlite, Ray and the OS each say "full" their own way
        gone = None if isinstance(e, TriAccelError) else server_gone(e, uri)  # a check's own line stays as it is
        if gone:  # the runs cannot be closed on a server that is down: resume closes and continues them
            raise TriAccelError(f"search '{name}' stopped: the MLflow server at {uri} stopped answering ({gone}); "
                                f"start it again, then `triaccel resume {name}` continues the search") from None
        full = disk_full(e)  # first: a full disk met while stopping is what to fix (and the store may be on it)
        if full is None and interrupted(e):  # Ctrl-C or SIGTERM that landed inside a library call, wrapped in its error
            _stopped(name, uri, "")
        if full is not None:
            raise TriAccelError(f"search '{name}' stopped: a disk it writes is full ({full}); free space, then "
                                f"`triaccel resume {name}` continues it") from None
        raise failed(name, uri, e) from None


def failed(name: str, uri: str, e: Exception) -> TriAccelError:
    """Any other end of a search that is no user's stop (a store locked for too long, Ray that could not
    start, an error in Tune): its runs still RUNNING are closed KILLED where the store lets them be (a
    parent left RUNNING read as a search still going), and the cause is one line saying how to continue."""
    from triaccel.errors import _chain
    from triaccel.store_lock import StoreLocked

    with contextlib.suppress(Exception):
        close_running(name, uri)
    cause = next((x for x in _chain(e) if isinstance(x, TriAccelError)), None)
    if cause is not None and not isinstance(cause, StoreLocked):
        return cause  # a check's own line (an unusable --address), as it was
    text = str(cause or e).strip()
    why = text.splitlines()[0][:300] if text else type(e).__name__
    return TriAccelError(f"search '{name}' stopped: {why}; `triaccel resume {name}` continues it")


def close_running(name: str, uri: str) -> None:
    """The search's runs still RUNNING in MLflow, closed KILLED (``resume`` reopens those it continues)."""
    from triaccel.search.callbacks import TAG_SEARCH

    c, exp = _client(uri)
    for r in c.search_runs([exp], filter_string=f"tags.`{TAG_SEARCH}` = '{name}' and attributes.status = 'RUNNING'",
                           max_results=10000):
        c.set_terminated(r.info.run_id, status="KILLED")



# Re-run this many of the best alone when trials shared a GPU. Measured on an H200
# (bench/results/packing/h200_search.json): four trials to a GPU run the winner of the one-at-a-time
# search at half its speed and rank it 5th; its own top 3, re-run alone, hold a config that
# scores 18.2 against 15.3 for the shared winner (the best of all 16 alone: 19.2).
CONFIRM_WHEN_SHARED = 3


def _check_confirm(confirm: int | None) -> None:
    if confirm is not None and confirm < 0:
        raise ConfigError(f"--confirm: invalid value {confirm} (a number of configurations, >= 0)")


def default_confirm(confirm: int | None, shared: int, gpu: bool | None = None) -> int:
    """--confirm as given; by default the top 3 when trials shared a GPU, none otherwise (on a
    CPU-only machine trials share cores, not a device whose contention ranks them unevenly)."""
    if confirm is not None:
        return confirm
    if shared > 1 and (_gpu_count() > 0 if gpu is None else gpu):
        print(f"{shared} trials shared the GPU: re-running the top {CONFIRM_WHEN_SHARED} (and the space's start "
              f"points) alone before export (--confirm 0 skips this)", flush=True)
        return CONFIRM_WHEN_SHARED
    return 0


# the keys of a saved search state and their kinds (created is optional: older states lack it)
STATE_KINDS = {"space": dict, "source": str, "sha256": str, "tracking_uri": str, "created": str}


def read_state(name: str) -> dict:
    p = tune_root() / name / STATE_FILE
    if not p.is_file():
        known = ", ".join(list_names()) or "none"
        raise ConfigError(f"no search named '{name}' under {tune_root()} (known: {known})")
    try:
        state = json.loads(p.read_text())
        if not isinstance(state, dict) or not STATE_KINDS.keys() - {"created"} <= state.keys():
            raise ValueError("not a search's state")
        # of the right kinds too: a number for the store's URI would fail deep in export
        bad = [k for k, tp in STATE_KINDS.items() if k in state and not isinstance(state[k], tp)]
        if bad:
            raise ValueError(f"{', '.join(bad)} of the wrong kind")
    except (OSError, ValueError) as e:  # an empty or damaged file (a disk that filled as it was written)
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0][:120]
        raise ConfigError(f"search '{name}': its state {p} cannot be read ({why}); move that folder "
                          f"away to reuse the name, or start the search under another --name") from None
    state["space"] = pin_controller_defaults(state["space"], state.get("controller_defaults"))
    return state


def list_names() -> list[str]:
    root = tune_root()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / STATE_FILE).is_file())


def _client(uri: str, write: bool = True):
    from triaccel.tracking import client, ensure_experiment

    c = client(uri, key="the search's MLflow store (recorded when it started)", write=write)  # checked once per process
    return c, ensure_experiment(c, EXPERIMENT)


def read_outcome(name: str, space: SearchSpace, uri: str):
    """The search as the result rules see it (``triaccel.search.results``): the one reading
    every command shares."""
    from triaccel.search.results import deleted_count, outcome, trial_table

    c, exp = _client(uri)
    o = outcome(trial_table(c, exp, name), trial_table(c, exp, name, role="confirm"),
                trial_table(c, exp, name, role="baseline", curves=True), space.epochs, space.margin,
                rechecks=trial_table(c, exp, name, role="recheck", curves=True), band=space.second_look)
    o.deleted = deleted_count(c, exp, name)
    return o


def parent_run(name: str, space: SearchSpace, uri: str, shared: int | None = None) -> str:
    """The search's parent MLflow run, created once (by the baselines, or by the Tune callback
    where there are none); ``shared``: trials sharing a device, recorded when it is created."""
    from triaccel.search.callbacks import TAG_ROLE, TAG_SEARCH
    from triaccel.tracking import git_revision, log_yaml_artifact

    c, exp = _client(uri)
    found = c.search_runs([exp], filter_string=f"tags.`{TAG_SEARCH}` = '{name}' and tags.`{TAG_ROLE}` = 'parent'",
                          max_results=1)
    if found:
        return found[0].info.run_id
    run = c.create_run(exp, run_name=name, tags={
        TAG_SEARCH: name, TAG_ROLE: "parent", "git_revision": git_revision(), "space_file": space.source,
        "space_sha256": space.sha256, "objective": space.objective, "shared_trials": str(shared or 1)})
    log_yaml_artifact(c, run.info.run_id, space.raw, "space.yaml")
    return run.info.run_id


def run_alone(name: str, uri: str, cfg, tags: dict, label: str) -> dict | None:
    """Train one configuration alone on the device, in this process, as a child run of the
    search: the baselines and the confirm re-runs. The summary, or None if it failed."""
    import time

    from triaccel.control import build_trainer
    from triaccel.measure import free_device
    from triaccel.tracking import MLflowLogger, log_metrics

    cfg.tracking.experiment = EXPERIMENT
    cfg.tracking.tracking_uri = uri
    cfg.tracking.run_name = f"{name}-{label}"
    cfg.evaluate_test = False
    logger = MLflowLogger(cfg, parent_run_id=tags.pop("parent"), extra_tags={"shared_trials": "1", **tags})
    t0 = time.perf_counter()
    trainer = build_trainer(cfg, [logger], log=lambda *a: None)
    try:
        s = trainer.fit()
        s["wall_s"], epoch = time.perf_counter() - t0, trainer.epoch
    except TriAccelError as e:
        logger.finish("FAILED", reason=f"{type(e).__name__}: {e}")
        print(f"{label}: FAILED {e}", flush=True)
        return None
    finally:  # the next run alone gets the device as this one found it (graphs' pool, model, data)
        del trainer
        free_device()
    log_metrics(logger.client, logger.run_id, {"efficiency": s["efficiency"], "val_acc": s["val_acc"],
                                               "epoch_time_last5_s": s["epoch_time_last5_s"],
                                               "peak_mem_gib": s["peak_mem_gib"], "epoch": epoch,
                                               "wall_s": s["wall_s"], "gpu_share": 1.0}, step=epoch)
    logger.finish()
    return s


def run_baselines(name: str, space: SearchSpace, uri: str, shared: int, fresh: bool = False) -> list | None:
    """Train the static AMP references the space declares, alone and before any trial (resumed
    searches train only those not finished; one the store already measured with the same settings,
    device and versions is reused unless ``fresh``: search.baseline_cache), and return the reference
    baseline's per-epoch validation accuracy: the curve every trial's accuracy is held to."""
    from triaccel.config import TrainConfig, from_dict
    from triaccel.search import baseline_cache
    from triaccel.search.callbacks import TAG_ROLE, TAG_SEARCH
    from triaccel.search.results import reference, trial_table

    runs = space.baseline_runs()
    if not runs:
        print("no baseline declared (baseline.batch_sizes: []): trials are not held to an accuracy", flush=True)
        return None
    c, exp = _client(uri)
    parent = parent_run(name, space, uri, shared)
    have = trial_table(c, exp, name, role="baseline")
    done = {b["tags"].get("triaccel.baseline") for b in have if b["status"] == "FINISHED"}
    for b in have:  # a baseline cut short by a crash is re-trained, its run closed as KILLED
        if b["status"] == "RUNNING":
            c.set_terminated(b["run_id"], status="KILLED")
    todo = [(label, d) for label, d in runs if label not in done]
    if todo:
        print(f"baselines: static AMP {', '.join(label for label, _ in todo)}, alone, "
              f"{space.epochs} epochs each (what a user would run without the search"
              f"{'' if fresh else '; reused where this store measured one alike'})", flush=True)
    for label, d in todo:
        cfg = from_dict(TrainConfig, d)
        tags = {"parent": parent, TAG_SEARCH: name, TAG_ROLE: "baseline", "triaccel.baseline": label,
                "triaccel.trial_id": f"baseline-{label}", baseline_cache.KEY_TAG: baseline_cache.reuse_key(cfg),
                "triaccel.values": json.dumps({"mode": "amp", "amp_dtype": d["amp_dtype"], "batch_size": d["batch_size"],
                                               "capture": d["capture"], "compile": d["compile"]})}
        if not fresh and baseline_cache.reuse(c, exp, name, label, cfg, tags, space.epochs) is not None:
            continue
        s = run_alone(name, uri, cfg, tags, label)
        if s is not None:
            print(f"baseline {label}: eff {s['efficiency']:.2f}  val {s['val_acc']:.2f}%  "
                  f"{s['epoch_time_last5_s']:.2f}s/epoch  {s['peak_mem_gib']:.3f} GiB", flush=True)
    ref = reference(trial_table(c, exp, name, role="baseline", curves=True), space.epochs)
    if ref is None:
        print("no baseline finished: trials are not held to an accuracy", flush=True)
        return None
    print(f"reference baseline: {ref['tags'].get('triaccel.baseline')} (eff {ref['metrics']['efficiency']:.2f}); "
          f"a trial more than {space.margin:g} pp below its validation accuracy at the same epoch is infeasible",
          flush=True)
    return ref["curve"]


def _cell(v) -> str:
    """A searched value in the summary table: numbers to 3 digits, categorical choices as they are."""
    return f"{v:.3g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def finish(name: str, space: SearchSpace, uri: str, confirm: int) -> dict:
    from triaccel.search import baseline_cache
    from triaccel.search.judge import final_pick, judged, run_judge, summary_lines
    from triaccel.search.results import fmt

    if confirm:
        with phases.timed(uri, name, "confirm"):
            confirm_top(name, space, uri, confirm)
            run_judge(name, space, uri, confirm)
    o = read_outcome(name, space, uri)
    j = judged(name, space, uri, o)
    record_best(name, space, uri, o, j)
    print(f"\nsearch '{name}': {len(o.ranked)} finished ({len(o.feasible)} feasible), {len(o.stopped)} stopped early, "
          f"{len(o.failed)} failed, {o.trials} trials in MLflow")
    from triaccel.search.summary import print_table

    print_table(o, space)
    for line in baseline_cache.reused_lines(o.baselines):  # where a reused baseline's figures came from
        print(line)
    for x in o.ranked:
        if x.gaps:
            print(f"  second look {x.row['trial_id']} (+): d.acc {x.gaps[0]:+.2f} at the first seed, {x.gaps[1]:+.2f} "
                  f"at the next, mean {x.gap:+.2f}: {'feasible' if x.feasible else 'infeasible'}")
    for line in summary_lines(j, o) if j is not None else ():
        print(line)
    p = None
    try:
        p = final_pick(o, space, j)
    except TriAccelError:
        pass
    if p is not None and p.kind == "baseline":
        print(f"{p.reason}: `export` writes the static baseline {p.row['tags'].get('triaccel.baseline')}")
    c, exp = _client(uri)
    print(phases.words(phases.read(c, exp, name)))
    print(f"export the best: triaccel export {name} --out tuned.yaml    browse: triaccel ui")
    c.set_terminated(parent_run(name, space, uri), status="FINISHED")
    best = o.best.row if o.best else None
    return {"finished": len(o.ranked), "feasible": len(o.feasible), "failed": len(o.failed), "trials": o.trials,
            "best": best, "pick": p.kind if p else None}


def record_best(name: str, space: SearchSpace, uri: str, o, j=None) -> None:
    """The parent run's best: the same pick ``export`` makes (set again after confirm runs); ``j``:
    the judge's verdict at the production length (``triaccel.search.judge``), recorded with it."""
    from triaccel.search.judge import final_pick
    from triaccel.tracking import log_metrics, log_yaml_artifact

    c, exp = _client(uri)
    parent = parent_run(name, space, uri)
    try:
        p = final_pick(o, space, j)
    except TriAccelError:
        return
    c.set_tag(parent, "best_run_id", p.row["run_id"])
    c.set_tag(parent, "best_kind", p.kind)
    m = {"best_efficiency": p.measured["efficiency"], "best_val_acc": p.measured.get("val_acc", math.nan),
         "trials_feasible": len(o.feasible)}
    if o.reference is not None:
        ref = j.mean_metrics("baseline") if j is not None else o.reference["metrics"]  # at the judged length
        m["reference_efficiency"] = ref["efficiency"]
        m["best_ratio_to_baseline"] = p.measured["efficiency"] / ref["efficiency"]
    if j is not None and j.winner is not None:
        m["best_paired_ratio_mean"], m["best_paired_ratio_lower95"] = j.winner.mean, j.winner.lower
    log_metrics(c, parent, m, step=o.trials)
    log_yaml_artifact(c, parent, {"kind": p.kind, "why": p.reason, "run_id": p.row["run_id"], "values": p.row["values"],
                                  "metrics": p.measured, **({"judge": j.provenance()} if j else {})},
                      "best_config.yaml")


def _close_cut_short(name: str, uri: str) -> None:
    """Confirm and second-look runs a crash left RUNNING are closed KILLED (the rules never read
    them; ``resume`` runs them again), as the baselines' are."""
    from triaccel.search.callbacks import TAG_ROLE, TAG_SEARCH

    c, exp = _client(uri)
    for role in ("confirm", "recheck"):
        for r in c.search_runs([exp], filter_string=f"tags.`{TAG_SEARCH}` = '{name}' and tags.`{TAG_ROLE}` = "
                                                    f"'{role}' and attributes.status = 'RUNNING'", max_results=10000):
            c.set_terminated(r.info.run_id, status="KILLED")


def _confirm_one(name: str, space: SearchSpace, uri: str, parent: str, r: dict) -> None:
    """One trial's configuration re-run alone, at its own seed: a confirm run."""
    from triaccel.search.callbacks import TAG_ROLE, TAG_SEARCH

    print(f"confirm {r['trial_id']}: re-running alone ...", flush=True)
    s = run_alone(name, uri, space.train_config(r["values"]),
                  {"parent": parent, TAG_SEARCH: name, TAG_ROLE: "confirm", "triaccel.confirms": r["run_id"],
                   "triaccel.values": json.dumps(r["values"]), "triaccel.trial_id": f"confirm-{r['trial_id']}"},
                  f"confirm-{r['trial_id']}")
    if s is not None:
        print(f"confirm {r['trial_id']}: eff {s['efficiency']:.2f} (shared: {r['metrics']['efficiency']:.2f})  "
              f"val {s['val_acc']:.2f}%", flush=True)


def confirm_top(name: str, space: SearchSpace, uri: str, k: int) -> None:
    """Re-run the top K feasible configurations, and the feasible start points, alone (no GPU
    sharing) as confirm runs (``results.to_confirm``); then the second look."""
    from triaccel.search.results import confirmed_metrics, to_confirm, trial_table

    _close_cut_short(name, uri)
    o = read_outcome(name, space, uri)
    c, exp = _client(uri)
    done_ids = set(confirmed_metrics(trial_table(c, exp, name, role="confirm")))
    parent = parent_run(name, space, uri)
    runs = to_confirm(o, k)
    top = min(k, len(o.feasible))
    extra = len(runs) - top
    if extra:
        print(f"confirm: {len(runs)} runs alone, the top {top} and {extra} more start "
              f"point{'s' if extra > 1 else ''} (sharing ranks configurations unlike running alone)", flush=True)
    for x in runs:
        if x.row["run_id"] not in done_ids:
            _confirm_one(name, space, uri, parent, x.row)
    second_look(name, space, uri, k)


def second_look(name: str, space: SearchSpace, uri: str, k: int) -> None:
    """Trials infeasible by a hair (``results.to_recheck``) are confirmed alone at their seed
    (if they were not), then re-run alone at the reference's next seed, as is the reference
    (once); the rules judge them by the mean of the two paired accuracy gaps, and by their
    figures alone at their own seed (the exported config's). A single seed misjudges a config
    as accurate as the reference about one time in four (an H200: both start points of
    spaces/cifar10_resnet18.yaml, level with static over 3 seeds on the JPEG space, fall 0.72
    and 0.82 pp below the reference's one seed)."""
    from triaccel.config import TrainConfig, from_dict
    from triaccel.search.callbacks import TAG_ROLE, TAG_SEARCH
    from triaccel.search.results import second_looks, to_recheck, trial_table

    o = read_outcome(name, space, uri)
    todo = to_recheck(o, k)
    if not todo:
        return
    c, exp = _client(uri)
    parent = parent_run(name, space, uri)
    label = o.reference["tags"]["triaccel.baseline"]
    cfg = from_dict(TrainConfig, space.baseline_train(label))
    # both second runs at one seed, the reference's next (wrapping: seed 2**32-1 is valid), so they pair
    # even where a space searches the seed itself
    seed = (cfg.seed + 1) % 2**32
    print(f"second look: {len(todo)} trial{'s' if len(todo) > 1 else ''} within {space.second_look:g} pp beyond "
          f"the margin, re-run alone at seed {seed} with the reference {label}", flush=True)
    if not all(x.confirmed for x in todo):
        for x in todo:  # gap one alone, at the trial's own seed (the figures it is judged and exported by)
            if not x.confirmed:
                _confirm_one(name, space, uri, parent, x.row)
        todo = to_recheck(read_outcome(name, space, uri), k)  # alone, one may be feasible, or far below
        if not todo:
            return
    ref2, done = second_looks(trial_table(c, exp, name, role="recheck"), o.reference, space.epochs)
    if ref2 is None:
        s = run_alone(name, uri, dataclasses.replace(cfg, seed=seed),
                      {"parent": parent, TAG_SEARCH: name, TAG_ROLE: "recheck", "triaccel.baseline": label,
                       "triaccel.seed": str(seed), "triaccel.trial_id": f"recheck-{label}"}, f"recheck-{label}")
        if s is None:
            return  # the trials stay as judged: a second look needs the reference's second seed
        print(f"second look {label}: val {s['val_acc']:.2f}% at seed {seed}", flush=True)
    for x in todo:
        r = x.row
        if r["run_id"] in done:
            continue
        s = run_alone(name, uri, dataclasses.replace(space.train_config(r["values"]), seed=seed),
                      {"parent": parent, TAG_SEARCH: name, TAG_ROLE: "recheck", "triaccel.confirms": r["run_id"],
                       "triaccel.seed": str(seed), "triaccel.values": json.dumps(r["values"]),
                       "triaccel.trial_id": f"recheck-{r['trial_id']}"}, f"recheck-{r['trial_id']}")
        if s is not None:
            print(f"second look {r['trial_id']}: val {s['val_acc']:.2f}% at seed {seed}", flush=True)


MAX_EXPORT_EPOCHS = 100_000


def search_finished(name: str, uri: str) -> bool | None:
    """Whether the search ran to its end: its parent run is closed FINISHED (only ``finish`` does that);
    None when the store holds no parent run to tell."""
    from triaccel.search.callbacks import TAG_ROLE, TAG_SEARCH

    c, exp = _client(uri)
    parents = c.search_runs([exp], filter_string=f"tags.`{TAG_SEARCH}` = '{name}' and tags.`{TAG_ROLE}` = 'parent'",
                            max_results=10)
    return all(r.info.status == "FINISHED" for r in parents) if parents else None


def export(name: str, out: str, how: str = "best", force: bool = False, epochs: int | None = None) -> Path:
    """Write the chosen configuration as a training YAML. It trains as many epochs as the search
    scored (its budget, often short) unless ``epochs`` sets the production length: the lr
    schedule stretches to it, warm-up epochs stay as searched."""
    from triaccel.config import TrainConfig, from_dict, to_dict
    from triaccel.search import baseline_cache
    from triaccel.search.judge import final_pick, judged
    from triaccel.search.results import gpu_seconds, payback, trade
    from triaccel.tracking import git_revision

    if epochs is not None and not 1 <= epochs <= MAX_EXPORT_EPOCHS:
        raise ConfigError(f"--epochs {epochs}: must be in [1, {MAX_EXPORT_EPOCHS}]")
    state = read_state(name)
    space = parse_space(state["space"], source=state["source"], sha256=state["sha256"])
    p = check_out(out, force)
    uri = state_store(state)
    _client(uri, write=False)  # export only reads the store: one on a read-only disk will do
    o = read_outcome(name, space, uri)
    j = judged(name, space, uri, o)
    chosen = final_pick(o, space, j, how)
    row, measured = chosen.row, chosen.measured
    finished = search_finished(name, uri)
    if finished is False:  # still running, or stopped: say the export is the best so far
        print(f"triaccel: note: search '{name}' has not finished (still running, or stopped): this is the best of "
              f"what it measured so far (provenance: search_finished: false); `triaccel resume {name}` finishes a "
              f"stopped one", file=sys.stderr)
    elif finished is None:
        print(f"triaccel: note: search '{name}' has no parent run in the store (deleted in the UI?): whether it "
              f"finished is unknown (provenance: search_finished: null)", file=sys.stderr)
    if chosen.kind == "baseline":
        train = space.baseline_train(row["tags"]["triaccel.baseline"])
    else:
        train = space.train_dict(row["values"])
    train.setdefault("tracking", {})
    train["tracking"] = {**train["tracking"], "enabled": True, "experiment": "triaccel-train"}
    train["evaluate_test"] = True
    cfg = from_dict(TrainConfig, train)  # what `triaccel train --config` will accept
    searched_epochs = cfg.epochs
    epochs_flag = epochs
    if epochs is None and space.production_epochs:  # the length the space declares (and the judge judged at)
        epochs = space.production_epochs
    if epochs is not None:
        w = cfg.optim.warmup_epochs
        if w is not None and epochs < w:  # named by the flag the user typed, not by a key they never set
            raise ConfigError(f"--epochs {epochs}: below the exported config's optim.warmup_epochs "
                              f"({w:g}): the lr would still be rising when training ends; "
                              f"export with --epochs {math.ceil(w)} or more")
        cfg = dataclasses.replace(cfg, epochs=epochs)
    data = to_dict(cfg)
    if cfg.mode != "triaccel":  # a static export: no triaccel section that nothing reads
        data.pop("triaccel", None)
    keep = ("efficiency", "val_acc", "epoch_time_last5_s", "peak_mem_gib", "shared_trials")
    prov = {
        "search": name, "exported": chosen.kind, "why": chosen.reason, "mlflow_run_id": row["run_id"],
        "trial_id": row["trial_id"], "tracking_uri": uri, "pick": how, "objective": space.objective,
        "confirmed_alone": chosen.kind == "baseline" or any(x.row["run_id"] == row["run_id"] and x.confirmed
                                                             for x in o.ranked),
        "metrics": {k: float(v) for k, v in measured.items() if k in keep},
        "searched": row["values"], "searched_epochs": searched_epochs, "deleted_runs_ignored": o.deleted,
        "space_file": state["source"], "space_sha256": state["sha256"], "search_finished": finished,
        "exported_at": datetime.datetime.now().isoformat(timespec="seconds"), "git_revision": git_revision(),
        "device_s_by_phase": phases.read(*_client(uri, write=False), name)}
    if j is not None:
        prov["judge"] = j.provenance()
    if o.reference is not None:
        ref = {**o.reference["metrics"], **(j.mean_metrics("baseline") if j is not None else {})}
        # a trial's accuracy difference as the rules judged it (the mean of two seeds after a second look)
        ranked = next((x for x in o.ranked if x.row["run_id"] == row["run_id"]), None) \
            if chosen.kind == "trial" else None
        prov["baseline"] = {
            "run": o.reference["tags"].get("triaccel.baseline"), "mlflow_run_id": o.reference["run_id"],
            **baseline_cache.provenance(o.reference),
            "metrics": {k: float(v) for k, v in ref.items() if k in keep},
            "ratio": measured["efficiency"] / ref["efficiency"],
            "val_acc_diff_pp": (j.winner.acc_mean if j is not None and j.winner is not None and chosen.kind == "trial"
                                else measured["val_acc"] - ref["val_acc"] if ranked is None else ranked.gap),
            "accuracy_margin_pp": space.margin,
            **({"second_look": {"gaps_pp": list(ranked.gaps), "mlflow_run_ids": list(ranked.second_runs)}}
               if ranked is not None and ranked.gaps else {}),
            **trade(measured, ref), **payback(gpu_seconds(o.runs), ref["epoch_time_last5_s"], measured["epoch_time_last5_s"])}
    data["provenance"] = prov
    length = (f"# Scored over the search's {searched_epochs} epochs; set to {cfg.epochs} for production (--epochs).\n"
              if epochs_flag is not None else
              f"# Trains {cfg.epochs} epochs, the space's production_epochs (the search scored {searched_epochs}); "
              f"export --epochs N sets another length.\n" if epochs is not None else
              f"# Trains {cfg.epochs} epochs, the search's budget: for a production run add --set epochs=N "
              f"(the lr schedule stretches to N), or export with --epochs N.\n")
    text = (f"# Exported by `triaccel export {name}` from MLflow run {row['run_id']} ({chosen.reason}).\n"
            + length + f"# Train with: triaccel train --config {p}\n"
            + ("# Every key is written out: triaccel.policy fills only keys a config leaves unset, so changing it here "
               "changes no rule; change the keys themselves.\n" if cfg.mode == "triaccel" else "")
            + yaml.safe_dump(data, sort_keys=False))
    # a temporary name of this process's own (a fixed OUT.tmp would replace and then delete a user's file
    # of that name, and two exports at once would write the same one); without --force the name is claimed
    # exclusively first: two exports at once can both pass check_out, and the second must not replace the
    # first's file
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    claimed = False
    try:
        if not force:
            os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            claimed = True
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, p)
    except OSError as e:  # a full disk, a file system that refuses it: nothing half-written is left
        with contextlib.suppress(OSError):
            tmp.unlink()
        if claimed:
            with contextlib.suppress(OSError):
                p.unlink()
        if isinstance(e, FileExistsError) and not claimed:
            raise ConfigError(f"--out {out}: exists (written meanwhile by another process); choose another "
                              f"path or add --force to replace it") from None
        raise ConfigError(f"--out {out}: cannot write it ({e.strerror or e})") from None
    return p


def check_out(out: str, force: bool) -> Path:
    """``export --out``: a file in a folder that exists and can be written, checked before the
    store is read (a mistyped folder is not created: it is said, as for ``--space``)."""
    p = Path(out)
    if not out or out.endswith(("/", os.sep)) or p.is_dir():
        raise ConfigError(f"--out {out!r}: names a folder, not a file; give a file path such as "
                          f"{Path(out or '.') / 'tuned.yaml'}")
    if p.exists() and not force:
        raise ConfigError(f"--out {out}: exists; choose another path or add --force to replace it")
    if p.exists() and not p.is_file():
        raise ConfigError(f"--out {out}: is not a regular file; export writes a YAML file")
    folder = p.parent
    if not folder.is_dir():
        above = next((a for a in [folder, *folder.parents] if a.exists()), None)
        if above is not None and not above.is_dir():  # a file that is there, not a missing folder
            raise ConfigError(f"--out {out}: {above} is a file, not a folder")
        raise ConfigError(f"--out {out}: no such folder {folder}")
    if not os.access(folder, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ConfigError(f"--out {out}: cannot write there (permission denied in {folder})")
    return p


def list_searches() -> list[dict]:
    from triaccel.search.judge import final_pick, judged

    out = []
    for name in list_names():
        try:
            st = read_state(name)
        except ConfigError as e:  # one damaged state does not hide the other searches
            out.append({"name": name, "space": "?", "created": "?", "error": str(e)})
            continue
        item = {"name": name, "space": st["source"], "created": st.get("created", "?"),
                "trials": st["space"].get("trials")}
        try:
            space = parse_space(st["space"], source=st["source"], sha256=st["sha256"])
            _client(state_store(st), write=False)  # listing only reads
            o = read_outcome(name, space, state_store(st))
            item.update(finished=len(o.ranked), failed=len(o.failed), feasible=len(o.feasible),
                        search_finished=search_finished(name, state_store(st)))
            # what `export` would write (results.pick), not the best trial: where nothing feasible beats the
            # baseline, export writes the baseline, and the listing must not show a trial's score or '-'
            with contextlib.suppress(ConfigError):  # nothing to export yet
                j = judged(name, space, state_store(st), o)  # at the production length, where judged
                chosen = final_pick(o, space, j)
                ref = (j.mean_metrics("baseline") if j is not None else o.reference["metrics"])["efficiency"] \
                    if o.reference is not None else None
                item.update(best=chosen.measured["efficiency"], exports=chosen.kind,
                            ratio=chosen.measured["efficiency"] / ref if ref else None)
        except Exception as e:  # a store that moved: still list the search
            item["error"] = str(e)[:300]
        out.append(item)
    return out
