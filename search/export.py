"""``triaccel export``: the chosen configuration of a search as a training YAML with its provenance."""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import os
import sys
from pathlib import Path

import yaml

from triaccel.config import runnable_dict
from triaccel.errors import ConfigError
from triaccel.search import phases
from triaccel.search.state import again, open_store, read_outcome, read_state, saved_space, search_finished, state_store


MAX_EXPORT_EPOCHS = 100_000


def export(name: str, out: str, how: str = "best", force: bool = False, epochs: int | None = None) -> Path:
    """Write the chosen configuration as a training YAML. It trains as many epochs as the search
    scored (its budget, often short) unless ``epochs`` sets the production length: the lr
    schedule stretches to it, warm-up epochs stay as searched."""
    from triaccel.search.judge import final_pick, judged

    if epochs is not None and not 1 <= epochs <= MAX_EXPORT_EPOCHS:
        raise ConfigError(f"--epochs {epochs}: must be in [1, {MAX_EXPORT_EPOCHS}]")
    state = read_state(name)
    space = saved_space(state)
    p = check_out(out, force)
    uri = state_store(state)
    open_store(uri, write=False)  # export only reads the store: one on a read-only disk will do
    o = read_outcome(name, space, uri)
    j = judged(name, space, uri, o)
    chosen = final_pick(o, space, j, how)
    finished = search_finished(name, uri)
    note_unfinished(name, finished)
    cfg, searched_epochs, length = exported_config(space, chosen, epochs)
    data = runnable_dict(cfg)  # no key the run never reads
    data["provenance"] = provenance(name, state, space, uri, how, o, j, chosen, finished, searched_epochs)
    row = chosen.row
    text = (f"# Exported by `triaccel export {name}` from MLflow run {row['run_id']} ({chosen.reason}).\n"
            + length_line(cfg.epochs, searched_epochs, flag=epochs, length=length)
            + unjudged_line(name, cfg.epochs, j.epochs if j else searched_epochs,
                            o.reference is not None and cfg.epochs >= space.epochs)
            + f"# Train with: {train_command(state, p)}\n"
            + ("# evaluate_test: true, though the space's train says false: the search never read the test split, "
               "and the production run reports it once, at its end\n" if test_said_false(space) else "")
            + ("# Every key is written out: triaccel.policy fills only keys a config leaves unset, so changing it here "
               "changes no rule; change the keys themselves.\n" if cfg.mode == "triaccel" else "")
            + yaml.safe_dump(data, sort_keys=False))
    write_new(p, out, text, force)
    return p


def unjudged_line(name: str, epochs: int, judged_epochs: int, can_judge: bool) -> str:
    """Where the export trains longer or shorter than its verdict was measured at (``--epochs``), the header
    says so and names the command that judges it at that length; said on stderr too. A verdict does not
    carry over: the GPT space's export, 2.6x static at the 8 epochs it was judged at, was 0.59 pp below
    static's accuracy at 16 (bench/results/lm)."""
    # can_judge: a reference baseline to judge against, at a length no shorter than the search's own
    if epochs == judged_epochs or not can_judge:
        return ""
    how = again("resume", name, f"--production-epochs {epochs}")
    print(f"triaccel: note: the export trains {epochs} epochs, but its verdict was measured at {judged_epochs}: "
          f"`{how}` judges it at {epochs}", file=sys.stderr)
    return f"# Its verdict was measured at {judged_epochs} epochs, not {epochs}: `{how}` judges it at {epochs}.\n"


def test_said_false(space) -> bool:
    written = space.raw.get("train") if isinstance(space.raw.get("train"), dict) else {}
    return written.get("evaluate_test") is False


def train_command(state: dict, p) -> str:
    """How to train the export ``p``: ``triaccel train --config P``, or, for a search started from Python
    with functions that have no import path (``callable:NAME`` references only that process knew), the
    Python call that hands them again (the CLI would refuse the file)."""
    from triaccel.userref import handed_again

    import shlex

    refs = state.get("callables") or {}
    if not refs:
        return f"triaccel train --config {shlex.quote(str(p))}"  # pasted as printed, a space in the path too
    return f"triaccel.train({str(p)!r}, {handed_again(refs)}) from Python, handing the search's functions again"


def note_unfinished(name: str, finished: bool | None) -> None:
    """Say on stderr when the export is the best of a search that has not finished, or may not have."""
    if finished is False:  # still running, or stopped: say the export is the best so far
        print(f"triaccel: note: search '{name}' has not finished (still running, or stopped): this is the best of "
              f"what it measured so far (provenance: search_finished: false); `{again('resume', name)}` finishes a "
              f"stopped one", file=sys.stderr)
    elif finished is None:
        print(f"triaccel: note: search '{name}' has no parent run in the store (deleted in the UI?): whether it "
              f"finished is unknown (provenance: search_finished: null)", file=sys.stderr)


def exported_config(space, chosen, epochs: int | None):
    """The chosen run's training config as ``triaccel train --config`` accepts it, at its length: ``epochs``,
    else the space's production_epochs, else the searched length. Returns the config, the searched length,
    and the length set (None: the searched one)."""
    from triaccel.config import TrainConfig, from_dict

    row = chosen.row
    if chosen.kind == "baseline":
        train = space.baseline_train(row["tags"]["triaccel.baseline"])
    else:
        train = space.train_dict(row["values"])
    train.setdefault("tracking", {})
    train["tracking"] = {**train["tracking"], "enabled": True, "experiment": "triaccel-train"}
    # the trials and baselines never evaluate the test split (selection is on validation, whatever the space's
    # evaluate_test says: the shipped spaces write false to say so); the production run reports it once, at its
    # end, and the file's header says so where the space had false
    train["evaluate_test"] = True
    cfg = from_dict(TrainConfig, train)  # what `triaccel train --config` will accept
    searched_epochs = cfg.epochs
    if epochs is None and space.production_epochs:  # the length the space declares (and the judge judged at)
        epochs = space.production_epochs
    if epochs is not None:
        w = cfg.optim.warmup_epochs
        if w is not None and epochs < w:  # named by the flag the user typed, not by a key they never set
            raise ConfigError(f"--epochs {epochs}: below the exported config's optim.warmup_epochs "
                              f"({w:g}): the lr would still be rising when training ends; "
                              f"export with --epochs {math.ceil(w)} or more")
        cfg = dataclasses.replace(cfg, epochs=epochs)
    return cfg, searched_epochs, epochs


def length_line(epochs: int, searched_epochs: int, flag: int | None, length: int | None) -> str:
    """The export's comment on how long it trains: ``flag`` (--epochs), else ``length`` (production_epochs)."""
    if flag is not None:
        return (f"# Scored over the search's {searched_epochs} epochs; set to {epochs} for production "
                f"(--epochs).\n")
    if length is not None:
        return (f"# Trains {epochs} epochs, the search's production_epochs (it scored {searched_epochs}); "
                f"export --epochs N sets another length.\n")
    return (f"# Trains {epochs} epochs, the search's budget: for a production run add --set epochs=N "
            f"(the lr schedule stretches to N), or export with --epochs N.\n")


KEEP = ("efficiency", "val_acc", "epoch_time_last5_s", "peak_mem_gib", "shared_trials")  # metrics an export records


def provenance(name: str, state: dict, space, uri: str, how: str, o, j, chosen, finished: bool | None,
               searched_epochs: int) -> dict:
    """Where the export came from: the search, the run, its figures, the judge's verdict, the baseline."""
    from triaccel.tracking import git_revision

    row, measured = chosen.row, chosen.measured
    prov = {
        "search": name, "exported": chosen.kind, "why": chosen.reason, "mlflow_run_id": row["run_id"],
        "trial_id": row["trial_id"], "tracking_uri": uri, "pick": how, "objective": space.objective,
        "confirmed_alone": chosen.kind == "baseline" or any(x.row["run_id"] == row["run_id"] and x.confirmed
                                                             for x in o.ranked),
        "metrics": {k: float(v) for k, v in measured.items() if k in KEEP},
        "searched": row["values"], "searched_epochs": searched_epochs, "deleted_runs_ignored": o.deleted,
        "space_file": state["source"], "space_sha256": state["sha256"], "search_finished": finished,
        "exported_at": datetime.datetime.now().isoformat(timespec="seconds"), "git_revision": git_revision(),
        "device_s_by_phase": phases.read(*open_store(uri, write=False), name)}
    if j is not None:
        prov["judge"] = j.provenance()
    if o.reference is not None:
        prov["baseline"] = baseline_provenance(space, o, j, chosen)
    return prov


def baseline_provenance(space, o, j, chosen) -> dict:
    """The reference baseline beside the export: its figures, the ratio, the accuracy difference as the
    rules judged it, the trade and the payback."""
    from triaccel.search import baseline_cache
    from triaccel.search.results import gpu_seconds, payback, trade

    row, measured = chosen.row, chosen.measured
    ref = {**o.reference["metrics"], **(j.mean_metrics("baseline") if j is not None else {})}
    # a trial's accuracy difference as the rules judged it (the mean of two seeds after a second look)
    ranked = next((x for x in o.ranked if x.row["run_id"] == row["run_id"]), None) \
        if chosen.kind == "trial" else None
    return {
        "run": o.reference["tags"].get("triaccel.baseline"), "mlflow_run_id": o.reference["run_id"],
        **baseline_cache.provenance(o.reference),
        "metrics": {k: float(v) for k, v in ref.items() if k in KEEP},
        "ratio": measured["efficiency"] / ref["efficiency"],
        "val_acc_diff_pp": (j.winner.acc_mean if j is not None and j.winner is not None and chosen.kind == "trial"
                            else measured["val_acc"] - ref["val_acc"] if ranked is None else ranked.gap),
        "accuracy_margin_pp": space.margin,
        **({"second_look": {"gaps_pp": list(ranked.gaps), "mlflow_run_ids": list(ranked.second_runs)}}
           if ranked is not None and ranked.gaps else {}),
        **trade(measured, ref),
        **payback(gpu_seconds(o.runs + (j.rows if j is not None else [])), ref["epoch_time_last5_s"],
                  measured["epoch_time_last5_s"])}


def write_new(p: Path, out: str, text: str, force: bool) -> None:
    """Write ``text`` to ``p`` whole or not at all. A temporary name of this process's own (a fixed
    OUT.tmp would replace and then delete a user's file of that name, and two exports at once would write
    the same one); without ``force`` the name is claimed exclusively first: two exports at once can both
    pass check_out, and the second must not replace the first's file."""
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
