"""The Python API, for notebooks and scripts: ``triaccel.train``, ``triaccel.search``, ``triaccel.resume``.

``config`` and ``space`` are a YAML path or a dict. ``model`` and ``data`` are factories
(functions or classes, called as triaccel.userdef describes) or import-path strings; they set
model.class_path and data.class_path (their init_args stay the config's). The `triaccel train`
and `triaccel search` commands are thin shells over these functions. Ray and MLflow are imported
only when a function needs them.
"""
from __future__ import annotations

import os
import re
import tempfile
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Optional

from triaccel.errors import ConfigError, DataError, TriAccelError, interrupted
from triaccel.units import mem_text


@dataclass
class TrainResult:
    summary: dict  # val_acc, epoch_time_last5_s, peak_mem_gib, efficiency, (test_acc) ...
    config: dict  # the configuration trained, as a dict (triaccel.config.to_dict)
    run_id: Optional[str] = None  # its MLflow run (None with tracking.enabled: false)
    tracking_uri: Optional[str] = None
    model_path: Optional[str] = None  # save_dir's model.pt (triaccel.saving.load_model reads it); None without


@dataclass
class SearchResult:
    name: str
    best_config: dict  # what `triaccel export NAME` writes ({} when nothing can be exported): triaccel.train(it)
    picked: Optional[str]  # "trial", "baseline" when no trial beat the static baseline, None: nothing
    ratio: Optional[float]  # the pick's efficiency over the reference baseline's (None without baselines)
    baselines: list = field(default_factory=list)  # {"run": label, "run_id", "efficiency", "val_acc"}
    run_ids: dict = field(default_factory=dict)  # {"best": ..., "reference_baseline": ...}
    tracking_uri: Optional[str] = None
    counts: dict = field(default_factory=dict)  # finished, feasible, failed, trials


def _with_refs(data: dict, model, data_factory) -> dict:
    from triaccel.userref import reference_of

    data = dict(data)
    for section, fn in (("model", model), ("data", data_factory)):
        if fn is not None:
            sec = data.get(section) or {}
            if not isinstance(sec, dict):
                raise ConfigError(f"{section}: must be a mapping")
            data[section] = {**sec, "class_path": reference_of(fn, section)}
    return data


def load(config: str | os.PathLike | dict, model=None, data=None, overrides: list[str] | None = None):
    """A TrainConfig from a path or dict, with the model and data factories set."""
    from triaccel.config import load_config, read_yaml, refuse_a_space

    path = None if isinstance(config, dict) else config
    raw = read_yaml(config) if path is not None else config
    if path is not None:
        refuse_a_space(raw, path)
    if not isinstance(raw, dict):
        raise ConfigError(f"config: must be a YAML path or a dict, got {type(config).__name__}")
    try:
        return load_config(None, overrides, base=_with_refs(raw, model, data), written_model=raw.get("model") or {})
    except ConfigError as e:
        if path is not None and not str(e).startswith("--set"):
            raise ConfigError(f"{path}: {e}") from None
        raise


def train(config: str | os.PathLike | dict, model: Callable | str | None = None, data: Callable | str | None = None,
          overrides: list[str] | None = None, on_trainer: Callable | None = None, save_dir: str | None = None,
          resume: bool = False) -> TrainResult:
    """Train one run. ``overrides``: ``key=value`` strings as `--set` takes; ``on_trainer(trainer)`` is
    called before set-up. ``save_dir``: a folder for the run's checkpoint after every epoch and its trained
    model (triaccel.saving); ``resume``: continue the run whose checkpoint is there."""
    cfg = load(config, model, data, overrides)
    if resume and save_dir is None:
        raise ConfigError("--resume: give --save DIR, the folder the run to continue saved its checkpoint in")
    with errors_named_with(config, overrides, model, data):
        return run_config(cfg, on_trainer, save_dir=save_dir, resume=resume)


@contextmanager
def errors_named_with(config, overrides=None, model=None, data=None):
    """Config errors raised inside, found while a run is built (``KEY: ...``: an unknown model, a
    dataset's keys), named with the config file, as errors found while it is read are."""
    try:
        yield
    except (ConfigError, DataError) as e:
        named = _in_file(e, config, overrides, model, data)
        if named is e:
            raise
        raise named from None


def _in_file(e: TriAccelError, config, overrides, model, data) -> TriAccelError:
    """``e`` with the config file's name in front, where its message opens with a config key the file
    sets or could set: not a path, not a section's bare name (``data: ...`` names a folder), not a key
    in a section --set changed, not the model or data handed to the API, not a dict."""
    from dataclasses import MISSING

    from triaccel.config import TrainConfig

    msg = str(e)
    key = msg.split(": ", 1)[0]
    sections = {f.name for f in fields(TrainConfig) if f.default_factory is not MISSING}
    top = key.split(".")[0]
    if isinstance(config, dict) or not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*", key) \
            or top not in {f.name for f in fields(TrainConfig)} or key in sections:
        return e
    if {"model": model, "data": data}.get(top) is not None:
        return e
    for o in overrides or []:  # a --set in the key's section may be the cause (data.init_args.root)
        if o.split("=", 1)[0].strip().split(".")[0] == top:
            return e
    return type(e)(f"{config}: {msg}")


def run_config(cfg, on_trainer: Callable | None = None, save_dir: str | None = None,
               resume: bool = False) -> TrainResult:
    """Train ``cfg``; with ``save_dir`` in that folder, held by this run alone (triaccel.saving)."""
    from triaccel import saving

    note_unread_triaccel(cfg)
    with (saving.save_folder(save_dir, resume) if save_dir is not None else nullcontext((None, None))) as held:
        return _run(cfg, on_trainer, save_dir, *held)


def _run(cfg, on_trainer, save_dir, folder, saved) -> TrainResult:
    from triaccel import saving
    from triaccel.config import to_dict
    from triaccel.control import build_trainer

    cfg_dict = to_dict(cfg)
    uri = logger = checkpointer = None
    if cfg.tracking.enabled:
        from triaccel.tracking import MLflowLogger, tracking_uri

        uri = tracking_uri(cfg.tracking.tracking_uri, write=False)  # made where the run first logs
        logger = MLflowLogger(cfg, resume_run_id=saved.get("mlflow_run_id") if saved else None)
    if saved is not None:
        saving.check_resumable(saved, cfg_dict, save_dir, uri)
    callbacks = []
    if folder is not None:  # before the logger: an epoch logged is an epoch a resumed run will not train again
        checkpointer = saving.Checkpointer(folder, cfg_dict, logger, uri)
        callbacks.append(checkpointer)
    if logger is not None:
        callbacks.append(logger)
    trainer = build_trainer(cfg, callbacks, setup=False)
    if on_trainer is not None:
        on_trainer(trainer)
    try:
        trainer.setup()
        if checkpointer is not None and saved is None:  # a kill in the first epoch resumes into this run too
            checkpointer.save(trainer)
        if saved is not None:
            trainer.load_state_dict(saved["trainer"])
            if logger is not None:
                logger.catch_up(trainer)  # an epoch checkpointed but not logged before the run was killed
            print(f"triaccel train: resumed from {folder / saving.LAST} after epoch {trainer.epoch} of "
                  f"{cfg.epochs}", flush=True)
        test = f"{len(trainer.test_data)} test" if trainer.test_data is not None else "no test split"
        data_name = cfg.data.class_path or cfg.data.name
        print(f"triaccel train: {cfg.model.label()} on {data_name} ({len(trainer.train_data)} train / "
              f"{len(trainer.val_data)} val / {test}), mode {cfg.mode}, device {trainer.device}", flush=True)
        summary = trainer.fit()
        from triaccel.errors import check_stop

        check_stop()  # a stop asked for after the last step: the run still ends KILLED
        model_path = _save_model(trainer, cfg, summary, folder, logger)
        if logger is not None:  # inside: a disk that fills while the artifacts are written is one line too
            for cb in trainer.callbacks:
                if hasattr(cb, "log_artifacts"):
                    cb.log_artifacts(logger.client, logger.run_id)
            logger.finish()
    except BaseException as e:
        _close_failed(logger, trainer, e)
        if (said_user := _users_error(cfg, trainer, e)) is not None:
            raise said_user from e
        raise
    line = (f"val acc {summary['val_acc']:.2f}%  epoch time (last 5) {summary['epoch_time_last5_s']:.3f}s  "
            f"peak mem {mem_text(summary['peak_mem_gib'])} ({summary['mem_source']})  "
            f"efficiency {summary['efficiency']:.2f}")
    if "test_acc" in summary:
        line += f"  test acc {summary['test_acc']:.2f}%"
    print(line)
    if logger is not None:
        from triaccel.tracking import shown

        print(f"MLflow run {logger.run_id} in experiment '{cfg.tracking.experiment}' at {shown(uri)}  (browse: "
              f"triaccel ui)")
    if model_path is not None:
        print(f"trained model: {model_path}  (triaccel.load_model reads it)")
    return TrainResult(summary, cfg_dict, logger.run_id if logger is not None else None, uri,
                       str(model_path) if model_path is not None else None)


def note_unread_triaccel(cfg) -> None:
    """Say on stderr where a static or fp32 run's config sets triaccel keys: they are not read (a tuned
    triaccel config trained with --set mode=amp for comparison is meant; a typo'd mode is not)."""
    import sys

    from triaccel.config import TrainConfig, flatten, to_dict

    if cfg.mode == "triaccel":
        return
    default = flatten(to_dict(TrainConfig())["triaccel"])
    set_ = [k for k, v in flatten(to_dict(cfg)["triaccel"]).items() if default.get(k) != v]
    if set_:
        print(f"triaccel: note: mode {cfg.mode} reads no triaccel.* key: this config's "
              f"{', '.join('triaccel.' + k for k in set_[:3])}{' ...' if len(set_) > 3 else ''} are not used "
              f"(nor recorded with the run)", file=sys.stderr, flush=True)


def _save_model(trainer, cfg, summary: dict, folder, logger):
    """The trained model as ``model.pt`` (triaccel.saving.model_file): in ``folder`` where one was given, and in
    the MLflow run's artifacts. Returns the folder's file (None without one)."""
    from triaccel import saving

    if folder is None and logger is None:
        return None
    with tempfile.TemporaryDirectory() as d:  # the folder's file, else one only for the MLflow run
        path = (folder or Path(d)) / saving.MODEL
        saving.write_atomic(saving.model_file(trainer, cfg, summary), path)
        if logger is not None:
            logger.client.log_artifact(logger.run_id, str(path))
    return path if folder is not None else None


def _users_error(cfg, trainer, e: BaseException) -> ConfigError | None:
    """An error raised in the user's model or data code mid-run (a forward that fails at its 31st call) as
    one line naming the section, the step and the user's line that raised, not a traceback through the
    trainer; None for anything else (this package's own errors keep their traceback)."""
    import sys

    from triaccel.userref import is_callable_ref, said, user_frame

    refs = {k: getattr(cfg, k).class_path for k in ("model", "data") if getattr(cfg, k).class_path}
    if not refs or not isinstance(e, Exception) or isinstance(e, (TriAccelError, BrokenPipeError)) \
            or os.environ.get("TRIACCEL_TRACEBACK") or (at := user_frame(e)) is None:
        return None

    def its_file(ref):  # the file of the module an import path names (None for a function handed from Python)
        if is_callable_ref(ref):
            return None
        from triaccel.userref import module_of

        return getattr(sys.modules.get(module_of(ref)), "__file__", None)

    frame_file = at.rsplit(" in ", 1)[0].rsplit(":", 1)[0]
    who = next((k for k, r in refs.items() if its_file(r) == frame_file), None)
    name = f"{who}.class_path {refs[who]}" if who else " and ".join(f"{k}.class_path {r}" for k, r in refs.items())
    where = f"epoch {getattr(trainer, 'epoch', 0) + 1}, step {getattr(trainer, 'step_count', 0)}"
    return ConfigError(f"{name}: raised {said(e)} in {where} (at {at}; TRIACCEL_TRACEBACK=1 shows the traceback)")


def _close_failed(logger, trainer, e: BaseException) -> None:
    """The MLflow run of a failed or stopped training closed as FAILED or KILLED; a full disk said in one line."""
    from triaccel.errors import disk_full, stop_done
    from triaccel.store_lock import StoreLocked

    full = disk_full(e) if isinstance(e, Exception) else None
    # Ctrl-C or SIGTERM that landed inside a library call (MLflow's SQL layer wraps it in its own error)
    stopped = interrupted(e)
    if stopped:
        stop_done()  # carried out here: the process's next run is not stopped by it
    locked = isinstance(e, StoreLocked)  # a store held by another process: no fault of the run's
    if logger is not None:
        try:
            # stdout closed by its reader (`| head`): stopped by the user, as Ctrl-C is
            logger.finish("KILLED" if stopped or locked or isinstance(e, BrokenPipeError) else "FAILED",
                          reason=f"{type(e).__name__}: {e}")
        except Exception:  # noqa: BLE001 -- a full store cannot take the status either: the error below says why
            if full is None and not stopped and not locked:
                raise
    if full is not None:  # one line, not MLflow's traceback
        epoch, last = getattr(trainer, "epoch", "?"), getattr(getattr(trainer, "cfg", None), "epochs", None)
        when = (f"training finished its {epoch} epochs, but not its record" if epoch == last else
                f"training stopped after epoch {epoch}")
        raise TriAccelError(f"a disk this run writes is full ({full}): {when}; free space and train again") from None
    if stopped and not isinstance(e, KeyboardInterrupt):
        raise KeyboardInterrupt from None


def _space_file(space: str | os.PathLike | dict, model,
                data) -> tuple[str, Optional[tempfile.TemporaryDirectory], Optional[str]]:
    """A space path as given, or (a dict, or a path with factories to set) written to a temporary YAML, and
    what messages and the search's state call it then (not the temporary file, which the user never wrote)."""
    import yaml

    if not isinstance(space, dict) and model is None and data is None:
        return str(space), None, None
    from triaccel.config import read_yaml

    raw = dict(space) if isinstance(space, dict) else read_yaml(space)
    train = raw.get("train") if isinstance(raw.get("train"), dict) else {}
    if model is not None or data is not None:
        raw["train"] = _with_refs(train, model, data)
    name = raw.get("name") or (Path(space).stem if not isinstance(space, dict) else "space")
    d = tempfile.TemporaryDirectory(prefix="triaccel-space-")
    p = Path(d.name) / f"{name}.yaml"
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    said = f"space '{name}' (a dict handed to triaccel.search)" if isinstance(space, dict) else \
        f"{space} (with the functions handed to triaccel.search)"
    return str(p), d, said


def search(space: str | os.PathLike | dict, model: Callable | str | None = None, data: Callable | str | None = None,
           name: str | None = None, trials: int | None = None, concurrency: int | None = None,
           gpus_per_trial: float | None = None, address: str | None = None,
           confirm: int | None = None, read_back: bool = True, fresh_baselines: bool = False,
           warm_start: str | None = None, warm_start_k: int | None = None) -> SearchResult | None:
    """Search a space (as `triaccel search`) and return its outcome (``read_back``: False returns None: the
    summary has been printed). Factories handed here reach the Ray workers (by value when they
    have no import path: a notebook's functions). ``warm_start`` names an earlier search whose best
    ``warm_start_k`` feasible trials run first; ``fresh_baselines`` re-measures reusable baselines."""
    from triaccel.search.runner import run_search

    path, tmp, said = _space_file(space, model, data)
    try:
        if name is None and (isinstance(space, dict) or model is not None or data is not None):
            from triaccel.config import read_yaml

            name = read_yaml(path).get("name") or Path(path).stem
        out = run_search(path, name=name, trials=trials, concurrency=concurrency, gpus_per_trial=gpus_per_trial,
                         address=address, confirm=confirm, fresh_baselines=fresh_baselines,
                         warm_start=warm_start, warm_start_k=warm_start_k, source=said)
    finally:
        if tmp is not None:
            tmp.cleanup()
    return outcome(name or _space_name(path), out) if read_back else None


def _space_name(path: str) -> str:
    from triaccel.search.space import load_space

    return load_space(path).name


def resume(name: str, model: Callable | str | None = None, data: Callable | str | None = None,
           address: str | None = None, confirm: int | None = None,
           production_epochs: int | None = None) -> SearchResult:
    """Continue a stopped search; a search started with functions that have no import path needs them again.
    ``production_epochs``: judge it again at that length (``triaccel resume --production-epochs``)."""
    from triaccel.search.runner import resume_search

    _hand_again(name, model, data)
    return outcome(name, resume_search(name, address=address, confirm=confirm, production_epochs=production_epochs))


def extend(name: str, trials: int, model: Callable | str | None = None, data: Callable | str | None = None,
           address: str | None = None, confirm: int | None = None) -> SearchResult:
    """Give a finished search ``trials`` more trials (``triaccel extend``); a search started with functions
    that have no import path needs them again."""
    from triaccel.search.extend import extend_search

    _hand_again(name, model, data)
    return outcome(name, extend_search(name, trials, address=address, confirm=confirm))


def _hand_again(name: str, model, data) -> None:
    """The functions a search was started with, handed again in this process (they have no import path)."""
    from triaccel.search.state import read_state
    from triaccel.userref import CALLABLES, check_factory, is_callable_ref

    train = read_state(name)["space"].get("train") or {}
    for section, fn in (("model", model), ("data", data)):
        ref = (train.get(section) or {}).get("class_path")
        if fn is not None and is_callable_ref(ref) and not isinstance(fn, str):
            check_factory(fn, section)
            CALLABLES[ref] = fn


def outcome(name: str, out: dict | None = None) -> SearchResult:
    """A finished search read back: its pick as `export` writes it, its baselines and run ids."""
    import yaml

    from triaccel.search.export import export
    from triaccel.search.state import read_outcome, read_state, saved_space, state_store

    with tempfile.TemporaryDirectory(prefix="triaccel-export-") as d:
        try:
            p = export(name, str(Path(d) / "best.yaml"))
            best = yaml.safe_load(p.read_text())
        except TriAccelError as e:  # nothing to export (every trial failed): the result says why
            print(f"triaccel: note: {e}", flush=True)
            best = {}
    prov = best.get("provenance") or {}
    state = read_state(name)
    uri = state_store(state)
    o = read_outcome(name, saved_space(state), uri)
    bases = [{"run": b["tags"].get("triaccel.baseline"), "run_id": b["run_id"],
              "efficiency": b["metrics"].get("efficiency"), "val_acc": b["metrics"].get("val_acc")}
             for b in o.baselines]
    base = prov.get("baseline") or {}
    ids = {"best": prov.get("mlflow_run_id"), "reference_baseline": base.get("mlflow_run_id")}
    counts = {k: (out or {}).get(k) for k in ("finished", "feasible", "failed", "trials")}
    return SearchResult(name, best, prov.get("exported"), base.get("ratio"), bases, ids, uri, counts)

