"""A search's saved state and its MLflow store: where they live, how they are named, read and checked.

Layout under the store (default ``mlruns/``; ``--storage`` or TRIACCEL_TUNE_DIR moves ``mlruns/tune``):
    mlruns/tune/<name>/                 Ray Tune's experiment state (what ``resume`` restores)
    mlruns/tune/<name>/triaccel_search.json   the validated space and options of the search
    mlruns/tune/<name>/extend-<i>/      the Tune run of ``triaccel extend`` number i (search.extend)
    mlruns/mlflow.db, mlruns/artifacts  MLflow (unless MLFLOW_TRACKING_URI says otherwise)
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from pathlib import Path

from triaccel.errors import ConfigError, TriAccelError
from triaccel.search.lock import LOCK_FILE
from triaccel.search.space import SearchSpace, parse_space, pin_controller_defaults
from triaccel.tracking import shown
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


def again(verb: str, name: str, rest: str = "") -> str:
    """``triaccel VERB NAME [REST]`` as the user types it where it is printed: with ``--storage`` where the
    search's Tune folder is not this folder's default (mlruns/tune), a teammate's shared one, so that the
    command runs as printed."""
    import shlex

    if verb in ("resume", "extend") and (handed := _handed(name)):
        # a search started from Python with functions that have no import path: the CLI cannot continue it.
        # The flags the hint carries (--address local where the cluster is gone, --confirm K) as arguments
        words, flags = rest.split(), {}
        for flag, arg in zip(words, words[1:]):
            if flag in ("--address", "--confirm", "--trials", "--production-epochs"):
                flags[flag[2:].replace("-", "_")] = arg
        trials = f"{flags.pop('trials', 'TRIALS').replace('N', 'TRIALS')}, " if verb == "extend" else ""
        more = "".join(f", {k}={v!r}" if k == "address" else f", {k}={v}" for k, v in flags.items())
        return f"triaccel.{verb}({name!r}, {trials}{handed}{more}) from Python"
    try:
        flag = "" if tune_root() == Path("mlruns/tune").resolve() else f" --storage {shlex.quote(str(tune_root()))}"
    except ConfigError:  # an unusable TRIACCEL_TUNE_DIR is said where it is read
        flag = ""
    return f"triaccel {verb} {name}{flag}" + (f" {rest}" if rest else "")


def _handed(name: str) -> str:
    """'model=make_model, data=make_data': the functions a search started from Python must be handed again
    (its state's ``callables``); '' for a search whose code has import paths, or none saved yet."""
    from triaccel.userref import handed_again

    try:
        refs = read_state(name).get("callables") or {}
    except Exception:  # noqa: BLE001 -- no state (a search not yet claimed), or one unreadable: the CLI form
        return ""
    return handed_again(refs)


def extension_folders(name: str) -> list[Path]:
    """The Tune folders of the search's ``triaccel extend`` runs, ``extend-<i>``, oldest first."""
    numbered = (p for p in (tune_root() / name).glob("extend-*") if p.name[len("extend-"):].isdigit())
    return sorted(numbered, key=lambda p: int(p.name[len("extend-"):]))


def next_extension_folder(name: str) -> Path:
    """Where the search's next ``triaccel extend`` keeps its Tune run: one past the newest."""
    folders = extension_folders(name)
    return tune_root() / name / f"extend-{int(folders[-1].name[len('extend-'):]) + 1 if folders else 1}"


NAME_MAX = 100


def valid_name(name: str) -> bool:
    """A search name is a folder under mlruns/tune and an MLflow tag value: one path component
    of letters, digits, '-' and '_' (no '/', '..', quotes or an empty name)."""
    return bool(name) and len(name) <= NAME_MAX and name.replace("-", "").replace("_", "").isalnum()


def check_name(name: str, key: str) -> None:
    if not valid_name(name):
        raise ConfigError(f"{key} {name!r}: use 1 to {NAME_MAX} letters, digits, '-' and '_'")


# the keys of a saved search state and their kinds (created is optional: older states lack it)
STATE_KINDS = {"space": dict, "source": str, "sha256": str, "tracking_uri": str, "created": str}


def read_state(name: str) -> dict:
    p = tune_root() / name / STATE_FILE
    # a name no search can have is none of theirs, even where it leads to one's folder ('s1/', 's1/.'): it would
    # be logged to MLflow as a search of its own, and reopen (and end) that search's runs
    if not p.is_file() or not valid_name(name):
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



def saved_space(state: dict) -> SearchSpace:
    """The space of a saved search (``read_state``), as it was accepted when the search started, with the
    command's overrides: parsed once for the command that reads it."""
    return parse_space(state["space"], source=state["source"], sha256=state["sha256"])

def list_names() -> list[str]:
    root = tune_root()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / STATE_FILE).is_file())


def rewrite_state(name: str, state: dict) -> None:
    """Replace an existing search's state, whole or not at all (under its driver lock: ``resume
    --production-epochs`` changes the length its judge judges at and its export trains)."""
    path = tune_root() / name
    tmp = path / f".{STATE_FILE}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(state, indent=1))
        os.replace(tmp, path / STATE_FILE)
    except OSError as e:
        raise ConfigError(f"{path}: cannot write the search's state there ({e.strerror or e})") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def write_state(name: str, path: Path, state: dict, made: bool) -> None:
    """Write a new search's state, which claims its name: whole or not at all, and exclusively (two
    searches of one name started together must not both run, into one Tune folder and one parent run).
    ``made``: the search's folder was made for it, and is removed again if the state cannot be written."""
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


def saved_option(state: dict, key: str):
    """An option the search was started with (None: not given, or not in the saved state)."""
    options = state.get("options")
    return options.get(key) if isinstance(options, dict) else None


def note_space_edits(state: dict) -> None:
    """Resume continues the search as it started (its saved space); say so when the file has changed since
    (the edits are not searched)."""
    import hashlib

    # the file's absolute path where the state records it: the typed path may be relative to another folder
    # (a teammate's resume with --storage)
    src = Path(state.get("source_path") or state["source"])
    try:
        now = hashlib.sha256(src.read_bytes()).hexdigest()
    except OSError:
        return  # moved or deleted: the saved copy is all there is, nothing to tell apart
    if state.get("sha256") and now != state["sha256"]:
        print(f"triaccel: note: {src} has changed since the search started; resume continues the search as it "
              f"started (the space saved with it): start a new search (--name) to search the edited space",
              file=sys.stderr, flush=True)


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
        open_store(absolute)  # its experiment deleted in the MLflow UI: said here, before the search takes its name
    except ConfigError:
        client(uri, key=key)  # the same failure, said with the path as it was given
        open_store(uri)
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


def name_unused_in_store(name: str, uri: str, path: Path) -> None:
    """A new search's name has no runs in the store: with its Tune state deleted (mlruns/tune/NAME), a new
    search of that name would take the old baseline and parent run and rank the old trials with its own."""
    from triaccel.search.tags import TAG_SEARCH

    c, exp = open_store(uri)
    if c.search_runs([exp], filter_string=f"tags.`{TAG_SEARCH}` = '{name}'", max_results=1):
        # a search in this folder took the name since this one looked (it writes its state before its parent run)
        if (path / STATE_FILE).exists():
            raise ConfigError(f"search '{name}' already exists in {path} (started meanwhile by another "
                              f"process): choose another --name")
        raise ConfigError(f"the MLflow store {shown(uri)} already holds runs of a search named '{name}' (from another Tune "
                          f"folder than {path.parent}, or one deleted): choose another --name")


def open_store(uri: str, write: bool = True):
    from triaccel.tracking import client, ensure_experiment

    c = client(uri, key="the search's MLflow store (recorded when it started)", write=write)  # checked once per process
    return c, ensure_experiment(c, EXPERIMENT)


def read_outcome(name: str, space: SearchSpace, uri: str):
    """The search as the result rules see it (``triaccel.search.results``): the one reading
    every command shares."""
    from triaccel.search.results import deleted_count, outcome, trial_table

    c, exp = open_store(uri)
    o = outcome(trial_table(c, exp, name), trial_table(c, exp, name, role="confirm"),
                trial_table(c, exp, name, role="baseline", curves=True), space.epochs, space.margin,
                rechecks=trial_table(c, exp, name, role="recheck", curves=True), band=space.second_look)
    o.deleted = deleted_count(c, exp, name)
    return o


def _first_parent(c, exp, name: str):
    """The search's parent run that holds its name: the earliest started (then the least run id), so that
    two drivers that each made one agree on which holds it (``claim_name``)."""
    from triaccel.search.tags import TAG_ROLE, TAG_SEARCH

    found = c.search_runs([exp], filter_string=f"tags.`{TAG_SEARCH}` = '{name}' and tags.`{TAG_ROLE}` = 'parent'",
                          max_results=100)
    return min(found, key=lambda r: (r.info.start_time, r.info.run_id)) if found else None


def _new_parent(c, exp, name: str, space: SearchSpace, shared: int | None) -> str:
    from triaccel.search.tags import TAG_ROLE, TAG_SEARCH
    from triaccel.tracking import git_revision, log_yaml_artifact

    run = c.create_run(exp, run_name=name, tags={
        TAG_SEARCH: name, TAG_ROLE: "parent", "git_revision": git_revision(), "space_file": space.source,
        "space_sha256": space.sha256, "objective": space.objective, "shared_trials": str(shared or 1)})
    log_yaml_artifact(c, run.info.run_id, space.raw, "space.yaml")
    return run.info.run_id


def parent_run(name: str, space: SearchSpace, uri: str, shared: int | None = None) -> str:
    """The search's parent MLflow run: made by ``claim_name`` when the search starts (or here, for a search
    saved before that); ``shared``: trials sharing a device, recorded when it is created."""
    c, exp = open_store(uri)
    first = _first_parent(c, exp, name)
    return first.info.run_id if first is not None else _new_parent(c, exp, name, space, shared)


def claim_name(name: str, space: SearchSpace, uri: str, path: Path, made: bool, shared: int) -> None:
    """Take a new search's name in the store, where searches from other Tune folders (other users' machines)
    meet: two started at once with one name each pass ``name_unused_in_store``, and each shared the other's
    parent run. Each makes a parent run of its own; the earliest keeps the name, and a later one is refused
    (ConfigError) with nothing left of it: its parent run moved off the name and deleted (not counted among
    the other search's deleted runs), its Tune state removed (``path``, and the folder where ``made``)."""
    from triaccel.search.tags import TAG_SEARCH

    c, exp = open_store(uri)
    mine = _new_parent(c, exp, name, space, shared)
    first = _first_parent(c, exp, name)
    if first is None or first.info.run_id == mine:
        return
    c.set_tag(mine, TAG_SEARCH, f"{name} (refused: name taken)")
    c.delete_run(mine)
    with contextlib.suppress(OSError):
        (path / STATE_FILE).unlink(missing_ok=True)
        if made:
            (path / LOCK_FILE).unlink(missing_ok=True)  # held by this driver until it exits: an open file unlinked
            path.rmdir()
    raise ConfigError(f"the MLflow store {shown(uri)} took the name '{name}' for another search started at the same "
                      f"moment (its parent run {first.info.run_id}, from another Tune folder than {path.parent}): "
                      f"choose another --name")


def search_finished(name: str, uri: str) -> bool | None:
    """Whether the search ran to its end: its parent run is closed FINISHED (only ``finish`` does that);
    None when the store holds no parent run to tell."""
    from triaccel.search.tags import TAG_ROLE, TAG_SEARCH

    c, exp = open_store(uri)
    parents = c.search_runs([exp], filter_string=f"tags.`{TAG_SEARCH}` = '{name}' and tags.`{TAG_ROLE}` = 'parent'",
                            max_results=10)
    return all(r.info.status == "FINISHED" for r in parents) if parents else None


def close_running(name: str, uri: str) -> None:
    """The search's runs still RUNNING in MLflow, closed KILLED (``resume`` reopens those it continues)."""
    from triaccel.search.tags import TAG_SEARCH

    c, exp = open_store(uri)
    for r in c.search_runs([exp], filter_string=f"tags.`{TAG_SEARCH}` = '{name}' and attributes.status = 'RUNNING'",
                           max_results=10000):
        c.set_terminated(r.info.run_id, status="KILLED")


def close_orphan_trials(name: str, uri: str) -> None:
    """Trial runs a driver opened in MLflow before Tune saved any state: they can never resume
    (their trials are not in Tune's state), so they are closed KILLED as new trials start."""
    from triaccel.search.tags import TAG_ROLE, TAG_SEARCH

    c, exp = open_store(uri)
    for r in c.search_runs([exp], filter_string=f"tags.`{TAG_SEARCH}` = '{name}' and tags.`{TAG_ROLE}` = 'trial' "
                                                f"and attributes.status = 'RUNNING'", max_results=10000):
        c.set_terminated(r.info.run_id, status="KILLED")


def record_best(name: str, space: SearchSpace, uri: str, o, j=None) -> None:
    """The parent run's best: the same pick ``export`` makes (set again after confirm runs); ``j``:
    the judge's verdict at the production length (``triaccel.search.judge``), recorded with it."""
    from triaccel.search.judge import final_pick
    from triaccel.tracking import log_metrics, log_yaml_artifact

    c, _ = open_store(uri)
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
