"""Runs alone on the device, in the driver, as child runs of the search: the static baselines, the
confirm runs of the best trials, and the second look at trials infeasible by a hair."""
from __future__ import annotations

import dataclasses
import json

from triaccel.errors import ConfigError, TriAccelError, check_stop
from triaccel.hooks import Callback
from triaccel.search import cluster
from triaccel.search.space import SearchSpace
from triaccel.search.state import EXPERIMENT, again, open_store, parent_run, read_outcome
from triaccel.search.tags import ALONE_NODE_TAG, TAG_DOMINATED
from triaccel.units import mem_text


# Re-run this many of the best alone when trials shared a GPU. Measured on an H200
# (bench/results/packing/h200_search.json): four trials to a GPU run the winner of the one-at-a-time
# search at half its speed and rank it 5th; its own top 3, re-run alone, hold a config that
# scores 18.2 against 15.3 for the shared winner (the best of all 16 alone: 19.2).
CONFIRM_WHEN_SHARED = 3
# A baseline can stop once it cannot become the reference (baseline.stop_dominated): judged after its
# second epoch (the first holds one-off costs), granting it 100 % accuracy and later epochs this many
# times faster than its second, its score must still fall below the best finished baseline's.
DOMINATED_AFTER_EPOCHS = 2
DOMINATED_SPEEDUP = 2.0


def dominated_bound(epoch_time_s: float, peak_gib: float) -> float:
    """The highest score a run whose steady epoch so far took ``epoch_time_s`` at ``peak_gib`` could
    reach: 100 % validation accuracy, its later epochs DOMINATED_SPEEDUP times faster, no less memory."""
    from triaccel.metrics import efficiency_score

    return efficiency_score(100.0, epoch_time_s / DOMINATED_SPEEDUP, max(peak_gib, 1e-6))


class StopDominated(Callback):
    """A trainer callback that stops a baseline run after DOMINATED_AFTER_EPOCHS epochs when
    ``dominated_bound`` of its figures is below ``best``, the best finished baseline's score; ``why``
    then says so."""

    def __init__(self, best: float, best_label: str):
        self.best, self.best_label, self.why = best, best_label, None

    def on_epoch_end(self, tr, m):
        if tr.epoch != DOMINATED_AFTER_EPOCHS or tr.epoch >= tr.cfg.epochs:
            return None
        # after epoch 2 the score's epoch time and peak are epoch 2's own (metrics.steady_epoch_time, run_peak)
        bound = dominated_bound(m["epoch_time_last5_s"], m["peak_mem_gib"])
        if bound < self.best:
            tr.stop = True
            self.why = f"at most {bound:.2f}, below {self.best_label}'s {self.best:.2f}"
        return None


def baseline_order(train: dict) -> tuple:
    """Run order of baselines (their train dicts) when they may stop dominated: captured + compiled,
    captured, compiled, eager (the strongest first, so the later ones have a score to fall below),
    larger batches first within each."""
    cap, comp = bool(train["capture"]), train["compile"] is not None
    return (not (cap and comp), not cap, not comp, -train["batch_size"])


def check_confirm(confirm: int | None) -> None:
    if confirm is not None and confirm < 0:
        raise ConfigError(f"--confirm: invalid value {confirm} (a number of configurations, >= 0)")


def default_confirm(confirm: int | None, shared: int, gpu: bool | None = None, name: str | None = None) -> int:
    """--confirm as given; by default the top 3 when trials shared a GPU, none otherwise (on a
    CPU-only machine trials share cores, not a device whose contention ranks them unevenly). Trials that
    shared a CPU machine are still slower than the baselines, which ran alone: said, with the flag that
    re-measures them (on a 2-core machine a GPT trial read 0.62x shared and 1.61x alone), and with the command
    that re-measures them once the search has finished (``name``: `resume NAME --confirm K`)."""
    if confirm is not None:
        return confirm
    on_gpu = cluster.gpu_count() > 0 if gpu is None else gpu
    if shared > 1 and on_gpu:
        print(f"{shared} trials shared the GPU: re-running the top {CONFIRM_WHEN_SHARED} (and the space's start "
              f"points) alone before export (--confirm 0 skips this)", flush=True)
        return CONFIRM_WHEN_SHARED
    if shared > 1:
        after = f" (after the search: `{again('resume', name, '--confirm K')}`)" if name else ""
        print(f"note: {shared} trials at a time shared this machine's CPUs while the baselines ran alone: their "
              f"ratios are not like for like (most often low; high where the baselines' threads met a busy machine); --confirm K re-runs the top K alone before export{after}", flush=True)
    return 0


def run_alone(name: str, uri: str, cfg, tags: dict, label: str, callbacks: tuple = ()) -> dict | None:
    """Train one configuration alone on the device, in this process, as a child run of the
    search: the baselines and the confirm re-runs. The summary (with its MLflow ``run_id``), or None
    if it failed. A stop asked for since the last run (one whose own exception Python dropped, in that
    run's clean-up say) ends the search here, before this run starts."""
    import time

    from triaccel.control import build_trainer
    from triaccel.measure import free_device
    from triaccel.tracking import MLflowLogger, log_metrics

    check_stop()
    cfg.tracking.experiment = EXPERIMENT
    cfg.tracking.tracking_uri = uri
    cfg.tracking.run_name = f"{name}-{label}"
    cfg.evaluate_test = False
    gpu = str(cfg.device).strip().lower() != "cpu" and cluster.gpu_count() > 0
    with cluster.this_node_alone(gpu) as held:  # on a joined cluster: nothing else scheduled on this node
        if held:
            tags[ALONE_NODE_TAG] = held
        logger = MLflowLogger(cfg, parent_run_id=tags.pop("parent"), extra_tags={"shared_trials": "1", **tags})
        t0 = time.perf_counter()
        trainer = build_trainer(cfg, [logger, *callbacks], log=lambda *a: None)
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
    # the last epoch logged val_acc, efficiency and epoch_time_last5_s already, as the summary has them;
    # peak_mem_gib there is that epoch's own, and the run's (the score's, metrics.run_peak) goes after it
    log_metrics(logger.client, logger.run_id, {"peak_mem_gib": s["peak_mem_gib"], "wall_s": s["wall_s"],
                                               "gpu_share": 1.0}, step=epoch)
    logger.finish()
    s["run_id"] = logger.run_id
    return s


def run_baselines(name: str, space: SearchSpace, uri: str, shared: int, fresh: bool = False) -> list | None:
    """Train the static AMP references the space declares, alone and before any trial (resumed
    searches train only those not finished; one the store already measured with the same settings,
    device and versions is reused unless ``fresh``: search.baseline_cache), and return the reference
    baseline's per-epoch validation accuracy: the curve every trial's accuracy is held to."""
    from triaccel.config import TrainConfig, from_dict
    from triaccel.search import baseline_cache
    from triaccel.search.results import is_complete, reference, trial_table
    from triaccel.search.tags import TAG_ROLE, TAG_SEARCH

    runs = space.baseline_runs()
    if not runs:
        print("no baseline declared (baseline.batch_sizes: []): trials are not held to an accuracy", flush=True)
        return None
    c, exp = open_store(uri)
    parent = parent_run(name, space, uri, shared)
    have = trial_table(c, exp, name, role="baseline")
    done = {b["tags"].get("triaccel.baseline") for b in have if b["status"] == "FINISHED"}
    for b in have:  # a baseline cut short by a crash is re-trained, its run closed as KILLED
        if b["status"] == "RUNNING":
            c.set_terminated(b["run_id"], status="KILLED")
    todo = [(label, d) for label, d in runs if label not in done]
    if space.stop_dominated:
        todo.sort(key=lambda x: baseline_order(x[1]))
    best = max(((b["metrics"]["efficiency"], b["tags"].get("triaccel.baseline", "?")) for b in have
                if is_complete(b, space.epochs)), default=None)
    if todo:
        print(f"baselines: static AMP {', '.join(label for label, _ in todo)}, alone, "
              f"{space.epochs} epochs each (what a user would run without the search"
              f"{'' if fresh else '; reused where this store measured one alike'})", flush=True)
    baseline_cache.clear_file_fingerprints()  # the data as it is now, not as an earlier search in this process saw it
    for label, d in todo:
        cfg = from_dict(TrainConfig, d)
        tags = {"parent": parent, TAG_SEARCH: name, TAG_ROLE: "baseline", "triaccel.baseline": label,
                "triaccel.trial_id": f"baseline-{label}", baseline_cache.KEY_TAG: baseline_cache.reuse_key(cfg),
                "triaccel.values": json.dumps({"mode": "amp", "amp_dtype": d["amp_dtype"], "batch_size": d["batch_size"],
                                               "capture": d["capture"], "compile": d["compile"]})}
        m = baseline_cache.reuse(c, exp, name, label, cfg, tags, space.epochs) if not fresh else None
        named = baseline_cache.named_paths(cfg)
        stop = StopDominated(*best) if space.stop_dominated and best is not None and m is None else None
        s = m if m is not None else run_alone(name, uri, cfg, tags, label, callbacks=(stop,) if stop else ())
        if s is None:
            continue
        if m is None:
            baseline_cache.rekey(c, s["run_id"], cfg, tags[baseline_cache.KEY_TAG], named)
        if stop is not None and stop.why:
            c.set_tag(s["run_id"], TAG_DOMINATED, stop.why)
            print(f"baseline {label}: stopped after epoch {DOMINATED_AFTER_EPOCHS} (eff {s['efficiency']:.2f}): "
                  f"{stop.why}, even at 100 % accuracy with epochs {DOMINATED_SPEEDUP:g}x as fast", flush=True)
            continue
        if best is None or s["efficiency"] > best[0]:
            best = (s["efficiency"], label)
        if m is None:
            print(f"baseline {label}: eff {s['efficiency']:.2f}  val {s['val_acc']:.2f}%  "
                  f"{s['epoch_time_last5_s']:.2f}s/epoch  {mem_text(s['peak_mem_gib'])}", flush=True)
    check_stop()  # not into the trials after a stop asked for in the last baseline's end
    ref = reference(trial_table(c, exp, name, role="baseline", curves=True), space.epochs)
    if ref is None:
        print("no baseline finished: trials are not held to an accuracy", flush=True)
        return None
    print(f"reference baseline: {ref['tags'].get('triaccel.baseline')} (eff {ref['metrics']['efficiency']:.2f}); "
          f"a trial more than {space.margin:g} pp below its validation accuracy at the same epoch is infeasible",
          flush=True)
    return ref["curve"]


def reference_values(name: str, space: SearchSpace, uri: str) -> dict | None:
    """The reference baseline's settings (its ``triaccel.values``: mode, amp_dtype, batch_size, capture,
    compile), or None where no baseline finished."""
    from triaccel.search.results import reference, trial_table

    c, exp = open_store(uri)
    ref = reference(trial_table(c, exp, name, role="baseline", curves=True), space.epochs)
    return json.loads(ref["tags"].get("triaccel.values") or "null") if ref else None


def close_cut_short(name: str, uri: str) -> None:
    """Confirm, second-look and judge runs a crash left RUNNING are closed KILLED (the rules never read
    them; ``resume`` runs them again), as the baselines' are."""
    from triaccel.search.judge import ROLE as JUDGE
    from triaccel.search.tags import TAG_ROLE, TAG_SEARCH

    c, exp = open_store(uri)
    for role in ("confirm", "recheck", JUDGE):
        for r in c.search_runs([exp], filter_string=f"tags.`{TAG_SEARCH}` = '{name}' and tags.`{TAG_ROLE}` = "
                                                    f"'{role}' and attributes.status = 'RUNNING'", max_results=10000):
            c.set_terminated(r.info.run_id, status="KILLED")


def _confirm_one(name: str, space: SearchSpace, uri: str, parent: str, r: dict) -> None:
    """One trial's configuration re-run alone, at its own seed: a confirm run."""
    from triaccel.search.tags import TAG_ROLE, TAG_SEARCH

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

    close_cut_short(name, uri)
    o = read_outcome(name, space, uri)
    c, exp = open_store(uri)
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
    from triaccel.search.tags import TAG_ROLE, TAG_SEARCH
    from triaccel.search.results import second_looks, to_recheck, trial_table

    o = read_outcome(name, space, uri)
    todo = to_recheck(o, k)
    if not todo:
        return
    c, exp = open_store(uri)
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
