"""The search service as a user runs it: real local Ray, real Optuna, a real sqlite MLflow store.

One search runs once for the module (six trials, two at a time, one lr choice that diverges);
the tests read it back. A second search is killed with SIGKILL and resumed.
"""
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from _harness import DIGITS_SPACE, child_env, free_port, searcher_trials, user_env, with_store

pytestmark = pytest.mark.slow

# the digits space of the end-to-end tests (one quick baseline; a wide margin keeps every sane trial
# feasible, so these tests exercise the mechanics: the margin itself is tested in tests/test_results.py
# and by the README job below), with more trials, a start point and two more searched keys
SPACE = {
    **DIGITS_SPACE, "name": "t", "trials": 6, "seed": 3,
    "train": {**DIGITS_SPACE["train"], "epochs": 3},
    # the first trial, as given (Optuna's enqueued trial): tau_high in real units above tau_low
    "start": [{"triaccel.precision.tau_low": 2e-5, "triaccel.precision.tau_high": 0.05}],
    "params": {
        **DIGITS_SPACE["params"],
        "triaccel.batch.rho_high": {"distribution": "uniform", "low": 0.5, "high": 0.95,
                                    "above": "triaccel.batch.rho_low"},
        "optim.lr": {"distribution": "categorical", "choices": [0.05, 1.0e5]},  # 1e5 diverges
    },
}


def cli(*args, cwd, timeout=600, **kw):
    env = child_env("MLFLOW_TRACKING_URI", "TRIACCEL_TUNE_DIR")
    return subprocess.run([sys.executable, "-m", "triaccel.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env, **kw)


def mlflow_client(d):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{d}/mlruns/mlflow.db")


def trial_runs(d, name, role="trial"):
    c = mlflow_client(d)
    exp = c.get_experiment_by_name("triaccel-search")
    if exp is None:
        return c, []
    return c, c.search_runs([exp.experiment_id], filter_string=f"tags.`triaccel.search` = '{name}' and "
                                                               f"tags.`triaccel.role` = '{role}'", max_results=1000)


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    d = with_store(tmp_path_factory.mktemp("search"))  # a copy of the migrated template (its creation: elsewhere)
    (d / "space.yaml").write_text(yaml.safe_dump(SPACE))
    r = cli("search", "--space", "space.yaml", "--name", "t1", cwd=d)
    assert r.returncode == 0, r.stderr[-3000:]
    return d, r


def test_console_output_is_one_line_per_trial(searched):
    d, r = searched
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("trial ")]
    assert len(lines) == 6
    assert "search 't1':" in r.stdout and "export the best" in r.stdout
    assert len(r.stdout.splitlines()) < 40  # a summary, not pages of Tune tables
    # a diverged trial (test below) is its own line with the reason; Tune printed its worker's whole
    # traceback to stderr too, ~40 lines each, and "Trials did not complete: [...]"
    assert any(" FAILED " in ln for ln in lines)
    assert "Traceback" not in r.stderr and "Trials did not complete" not in r.stderr, r.stderr[-3000:]


def test_resume_of_a_search_whose_cluster_is_gone_says_how_to_go_on_without_it(searched, tmp_path):
    """The cluster a search started on (its recorded --address) is gone: resume said only 'cannot join a Ray
    cluster there', where `--address local` continues it on this machine. Refused before anything is written."""
    d, _ = searched
    state = json.loads((d / "mlruns" / "tune" / "t1" / "triaccel_search.json").read_text())
    port = free_port()
    (tmp_path / "mlruns" / "tune" / "t1").mkdir(parents=True)
    (tmp_path / "mlruns" / "tune" / "t1" / "triaccel_search.json").write_text(
        json.dumps(dict(state, address=f"127.0.0.1:{port}")))
    before = len(trial_runs(d, "t1")[1])
    r = cli("resume", "t1", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"triaccel: error: --address 127.0.0.1:{port}: cannot join a Ray cluster there (nothing answers on "
        f"127.0.0.1:{port}: Connection refused); the search started on that cluster: `triaccel resume t1 "
        f"--address local` continues it on this machine, --address HOST:PORT on another cluster"], r.stderr
    assert len(trial_runs(d, "t1")[1]) == before


def test_every_metric_of_every_trial_arrives(searched):
    d, _ = searched
    c, runs = trial_runs(d, "t1")
    assert len(runs) == 6 and len({r.data.tags["triaccel.trial_id"] for r in runs}) == 6
    finished = [r for r in runs if r.info.status == "FINISHED"]
    assert finished
    total = 0
    for r in finished:
        tid = r.data.tags["triaccel.trial_id"]
        reported = (d / "mlruns" / "tune" / "t1" / tid / "result.json").read_text().strip().splitlines()
        for key in ("val_acc", "efficiency", "epoch_time_s", "peak_mem_gib", "batch_size", "shared_trials"):
            hist = c.get_metric_history(r.info.run_id, key)
            assert sorted(m.step for m in hist) == list(range(1, len(reported) + 1)), (key, tid)
            total += len(hist)
        assert r.data.params["search.triaccel.precision.tau_low"]
        assert float(r.data.params["search.triaccel.precision.tau_low"]) < float(
            r.data.params["search.triaccel.precision.tau_high"])
        arts = {a.path for a in c.list_artifacts(r.info.run_id, "triaccel")}
        assert "triaccel/trajectory.csv" in arts and "triaccel/precision_heatmap.png" in arts
    assert total == 6 * sum(1 for _ in finished) * 3  # 6 keys x 3 epochs per finished trial


def test_the_start_point_runs_first_as_given(searched):
    d, _ = searched
    _, runs = trial_runs(d, "t1")
    tau = lambda r, k: float(r.data.params[f"search.triaccel.precision.{k}"])  # noqa: E731
    (start,) = [r for r in runs if tau(r, "tau_low") == pytest.approx(2e-5)]  # once, the rest are sampled
    assert tau(start, "tau_high") == pytest.approx(0.05, rel=1e-6)
    first_wave = sorted(runs, key=lambda r: r.info.start_time)[:SPACE["concurrency"]]
    assert start in first_wave  # asked for before any sampled trial


def test_a_start_point_that_follows_the_reference_runs_at_the_reference_baselines_batch(tmp_path):
    """`reference: true`: the point takes the batch (and 16-bit type, step, forward) of the reference baseline,
    which is known only once the baselines have trained; its own batch_size 32 stands where there is none."""
    d = with_store(tmp_path)
    space = {**DIGITS_SPACE, "name": "f", "trials": 1, "concurrency": 1,
             "train": {**DIGITS_SPACE["train"], "epochs": 1},
             "baseline": {**DIGITS_SPACE["baseline"], "batch_sizes": [48]},
             "params": {**DIGITS_SPACE["params"], "batch_size": {"distribution": "categorical", "choices": [32, 48]}},
             "start": [{"reference": True, "batch_size": 32, "triaccel.precision.tau_low": 2e-5,
                        "triaccel.precision.tau_high": 0.05, "triaccel.batch.rho_low": 0.5}]}
    (d / "space.yaml").write_text(yaml.safe_dump(space))
    r = cli("search", "--space", "space.yaml", "--name", "f", cwd=d)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "start point 0 follows the reference baseline: batch_size 48\n" in r.stdout, r.stdout[-3000:]
    _, (run,) = trial_runs(d, "f")
    assert run.data.tags.get("triaccel.start") == "true"
    assert json.loads(run.data.tags["triaccel.values"])["batch_size"] == 48
    assert float(run.data.params["search.triaccel.precision.tau_low"]) == pytest.approx(2e-5)  # the rest as given


def test_diverging_trial_fails_with_reason_and_search_goes_on(searched):
    d, _ = searched
    c, runs = trial_runs(d, "t1")
    huge = [r for r in runs if json.loads(r.data.tags["triaccel.values"])["optim.lr"] > 1]
    sane = [r for r in runs if json.loads(r.data.tags["triaccel.values"])["optim.lr"] < 1]
    assert huge and sane, "the seed should draw both lr choices"
    for r in huge:
        assert r.info.status == "FAILED"
        assert r.data.tags["failure_reason"].startswith("Diverged"), r.data.tags["failure_reason"]
        # run once more by Tune (a lost worker's retry), it raised its first error again without training
        assert "TrialFailed: Diverged" in (d / "mlruns" / "tune" / "t1" / r.data.tags["triaccel.trial_id"] /
                                           "error.txt").read_text()
        assert "triaccel.worker_lost" not in r.data.tags
        # where it failed, though it failed before any result named its node (each result names it)
        assert c.get_metric_history(r.info.run_id, "val_acc") == []
        assert r.data.tags.get("triaccel.ray_node_id") == sane[0].data.tags["triaccel.ray_node_id"], r.data.tags
    assert all(r.info.status == "FINISHED" for r in sane)


def test_a_search_whose_every_trial_failed_exits_1_and_still_exports_its_baseline(tmp_path):
    """A search in a script (search, export, train) read a search whose every trial had failed (the user's
    model failing on the workers, a learning rate that diverges) as a success: it exited 0. It still closes
    FINISHED with the static baseline as its pick, and exits 1 with one line saying why."""
    d = with_store(tmp_path)
    space = {**DIGITS_SPACE, "name": "dead", "trials": 1, "concurrency": 1,
             "train": {**DIGITS_SPACE["train"], "epochs": 1},
             "params": {"optim.lr": {"distribution": "categorical", "choices": [1.0e5, 2.0e5]}}}  # both diverge
    (d / "space.yaml").write_text(yaml.safe_dump(space))
    r = cli("search", "--space", "space.yaml", "--confirm", "0", cwd=d)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1] == (
        "triaccel search 'dead': every trial failed (1 of 1; each one's reason is on its line above and in its "
        "MLflow run): exit status 1"), r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "failed: Diverged" in r.stdout, r.stdout[-2000:]
    r = cli("export", "dead", "--out", "tuned.yaml", cwd=d)
    assert r.returncode == 0 and "every trial failed" in r.stdout, r.stdout + r.stderr[-2000:]
    assert yaml.safe_load((d / "tuned.yaml").read_text())["mode"] == "amp"  # the static baseline
    r = cli("resume", "dead", cwd=d)  # trains nothing: its status is not the search's again
    assert r.returncode == 0 and "has finished" in r.stdout, r.stdout + r.stderr[-2000:]


def test_parent_run_carries_best_importances_and_plot(searched):
    d, _ = searched
    c, parents = trial_runs(d, "t1", role="parent")
    assert len(parents) == 1
    p = parents[0]
    assert p.info.status == "FINISHED" and "best_run_id" in p.data.tags
    arts = {a.path for a in c.list_artifacts(p.info.run_id)}
    assert {"best_config.yaml", "space.yaml", "trials_vs_params.png"} <= arts
    _, bases = trial_runs(d, "t1", role="baseline")
    assert len(bases) == 1 and bases[0].info.status == "FINISHED"  # the search trained its baseline
    from triaccel.search import results as R
    from triaccel.search.state import read_outcome, read_state
    from triaccel.search.space import parse_space

    os.environ["TRIACCEL_TUNE_DIR"] = str(d / "mlruns" / "tune")
    try:
        st = read_state("t1")
        space = parse_space(st["space"], source=st["source"], sha256=st["sha256"])
        uri = f"sqlite:///{d}/mlruns/mlflow.db"
        want = R.pick(read_outcome("t1", space, uri), space.objective, "best")
    finally:
        os.environ.pop("TRIACCEL_TUNE_DIR")
    assert p.data.tags["best_run_id"] == want.row["run_id"]  # the parent's best is the export's pick


def test_export_trains_as_is_and_reproduces_validation_accuracy(searched):
    d, _ = searched
    r = cli("export", "t1", "--out", "tuned.yaml", cwd=d)
    assert r.returncode == 0, r.stderr
    data = yaml.safe_load((d / "tuned.yaml").read_text())
    prov = data["provenance"]
    assert prov["search"] == "t1" and len(prov["space_sha256"]) == 64 and prov["mlflow_run_id"]
    # it trains the search's budget as scored, and says how to train longer
    assert data["epochs"] == prov["searched_epochs"]
    if "triaccel" in data:  # nothing the run does not read: the Hessian probe's keys under the Fisher proxy
        curv = data["triaccel"]["curvature"]
        assert curv["method"] == "fisher" and not {"probe", "top_k", "max_iters", "tol", "graphs"} & set(curv), curv
    assert "--set epochs=N" in r.stdout and "--set epochs=N" in (d / "tuned.yaml").read_text().split("\n", 3)[1]
    r = cli("export", "t1", "--out", "long.yaml", "--epochs", "7", cwd=d)
    assert r.returncode == 0, r.stderr
    long = yaml.safe_load((d / "long.yaml").read_text())
    assert long["epochs"] == 7 and long["provenance"]["searched_epochs"] == data["epochs"]
    assert {k: v for k, v in long.items() if k not in ("epochs", "provenance")} == \
        {k: v for k, v in data.items() if k not in ("epochs", "provenance")}
    r = cli("export", "t1", "--out", "zero.yaml", "--epochs", "0", cwd=d)
    assert r.returncode == 2 and r.stderr.strip().endswith("--epochs 0: must be in [1, 100000]"), r.stderr
    assert "Traceback" not in r.stderr and not (d / "zero.yaml").exists()
    r = cli("train", "--config", "tuned.yaml", cwd=d)
    assert r.returncode == 0, r.stderr[-2000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("val acc")][0]
    val = float(line.split()[2].rstrip("%"))
    assert abs(val - prov["metrics"]["val_acc"]) <= 3.0, (val, prov["metrics"]["val_acc"])


def test_a_run_deleted_in_the_ui_is_named_by_export_not_silently_skipped(searched):
    """Deleting the exported run in the MLflow UI changed export's pick without a word; export
    now says how many of the search's runs it could not see. The run is restored afterwards."""
    d, _ = searched
    r = cli("export", "t1", "--out", "before.yaml", "--force", cwd=d)
    assert r.returncode == 0, r.stderr
    first = yaml.safe_load((d / "before.yaml").read_text())["provenance"]
    assert first["deleted_runs_ignored"] == 0 and "deleted in MLflow" not in r.stdout
    c = mlflow_client(d)
    c.delete_run(first["mlflow_run_id"])
    try:
        r = cli("export", "t1", "--out", "after.yaml", "--force", cwd=d)
        assert r.returncode == 0, r.stderr
        after = yaml.safe_load((d / "after.yaml").read_text())["provenance"]
        assert after["deleted_runs_ignored"] == 1 and after["mlflow_run_id"] != first["mlflow_run_id"]
        assert "1 run(s) of search 't1' are deleted in MLflow" in r.stdout
    finally:
        c.restore_run(first["mlflow_run_id"])


def test_the_listing_of_a_search_not_finished_counts_every_ended_trial_as_done(searched, tmp_path):
    """`done` of a search that has not finished counted only the trials that ran every epoch: a stopped search
    whose one ended trial ASHA had stopped read 0/2. Here the finished search's copy, its parent run marked
    KILLED (stopped before its end): every trial ended, failed and stopped early included."""
    import shutil

    d, _ = searched
    state = json.loads((d / "mlruns" / "tune" / "t1" / "triaccel_search.json").read_text())
    (tmp_path / "mlruns" / "tune" / "t1").mkdir(parents=True)
    shutil.copyfile(d / "mlruns" / "mlflow.db", tmp_path / "mlruns" / "mlflow.db")
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    (tmp_path / "mlruns" / "tune" / "t1" / "triaccel_search.json").write_text(
        json.dumps(dict(state, tracking_uri=uri)))
    c, (parent,) = trial_runs(tmp_path, "t1", "parent")
    c.set_terminated(parent.info.run_id, status="KILLED")
    _, trials = trial_runs(tmp_path, "t1")
    ended = [t for t in trials if t.info.status in ("FINISHED", "FAILED")]
    assert any(t.info.status == "FAILED" for t in trials) and len(ended) == len(trials) == SPACE["trials"]
    r = cli("searches", cwd=tmp_path)
    row = next(ln.split() for ln in r.stdout.splitlines() if ln.startswith("t1 "))
    assert r.returncode == 0 and f"{len(ended)}/{SPACE['trials']}" in row, r.stdout


def test_listing_and_name_collision_lose_nothing(searched):
    d, _ = searched
    r = cli("searches", cwd=d)
    assert r.returncode == 0 and "t1" in r.stdout and " finished " in r.stdout  # not done 6/6
    assert next(ln for ln in r.stdout.splitlines() if ln.startswith("t1 ")).endswith("  finished"), r.stdout
    # the listing's best is what export writes (it showed the best trial even where export wrote the baseline)
    row = next(ln.split() for ln in r.stdout.splitlines() if ln.startswith("t1 "))
    # the space file as every folder reads it: its absolute path (its tail where long), not the spelling typed
    assert str(d / "space.yaml").endswith(row[1].removeprefix("...")) and row[1].endswith("/space.yaml"), row
    assert len(str(d / "space.yaml")) <= 34 or row[1].startswith("..."), row  # a cut path says it was cut
    e = cli("export", "t1", "--out", "listed.yaml", cwd=d)
    assert e.returncode == 0, e.stderr[-2000:]
    prov = yaml.safe_load((d / "listed.yaml").read_text())["provenance"]
    assert row[-2] == prov["exported"] and row[-4] == f"{prov['metrics']['efficiency']:.2f}" and row[-1] == "finished", (row, prov)
    # a Tri-Accel export writes every rule out, so its policy key is inert there: the header says so
    assert ("triaccel.policy fills only keys" in (d / "listed.yaml").read_text()) == (prov["exported"] == "trial")
    _, before = trial_runs(d, "t1")
    r = cli("search", "--space", "space.yaml", "--name", "t1", cwd=d)
    assert r.returncode == 2 and "already exists" in r.stderr and "Traceback" not in r.stderr
    _, after = trial_runs(d, "t1")
    assert len(after) == len(before)
    r = cli("export", "nope", "--out", "x.yaml", cwd=d)
    assert r.returncode == 2 and "no search named 'nope'" in r.stderr
    # a name that leads to t1's folder (a tab-completed 't1/') is not t1: it reopened t1's parent run as RUNNING
    r = cli("resume", "t1/", cwd=d)
    assert r.returncode == 2 and "no search named 't1/'" in r.stderr and "(known: " in r.stderr, r.stderr[-2000:]
    r = cli("resume", "t1", "--confirm", "-1", cwd=d)  # refused before Ray starts; nothing touched
    assert r.returncode == 2 and "--confirm" in r.stderr and "Traceback" not in r.stderr
    _, after = trial_runs(d, "t1")
    assert len(after) == len(before)


def test_confirm_defaults_to_top_three_only_when_trials_shared_a_gpu(monkeypatch, capsys):
    from triaccel.search import alone, cluster

    # trials that shared a CPU machine are not re-run by default, but their low ratios are said (a new user's
    # GPT trials read 0.62x shared against the alone baselines, 1.61x alone)
    assert alone.default_confirm(None, shared=2, gpu=False) == 0
    assert capsys.readouterr().out == ("note: 2 trials at a time shared this machine's CPUs while the baselines ran "
                                       "alone: their ratios are not like for like (most often low; high where the baselines' "
                                       "threads met a busy machine); --confirm K re-runs the top K alone before "
                                       "export\n")
    assert alone.default_confirm(None, shared=1, gpu=False) == 0 and capsys.readouterr().out == ""
    # with the command that re-runs them once the search has finished (a finished search refuses `search`)
    assert alone.default_confirm(None, shared=2, gpu=False, name="q") == 0
    assert capsys.readouterr().out.endswith("before export (after the search: `triaccel resume q --confirm K`)\n")

    assert alone.default_confirm(2, shared=4) == 2 and alone.default_confirm(0, shared=4) == 0  # as asked
    assert alone.default_confirm(None, shared=4) == (3 if cluster.gpu_count() > 0 else 0)
    monkeypatch.setattr(cluster, "gpu_count", lambda: 1)  # the decision on a GPU machine (none in CI)
    assert alone.default_confirm(None, shared=4) == alone.CONFIRM_WHEN_SHARED == 3
    assert alone.default_confirm(None, shared=1) == 0  # one trial at a time: already measured alone


def test_the_header_says_how_many_trials_this_machines_cpus_run_at_once(monkeypatch):
    """`--concurrency 8` on a 2-core machine printed "8 at a time" and the closing note "2 trials at a time"."""
    from triaccel.search import cluster
    from triaccel.search.runner import at_a_time
    from triaccel.search.space import parse_space

    monkeypatch.setattr(cluster.os, "cpu_count", lambda: 2)
    space = parse_space(dict(SPACE, concurrency=8), source="s.yaml")
    shared = cluster.shared_trials(space)
    assert shared == 2
    assert at_a_time(space, shared, None) == "2 at a time (concurrency 8: this machine's CPUs hold 2 at cpus_per_trial 1)"
    assert at_a_time(space, shared, "auto") == "8 at a time"  # a cluster's CPUs are the cluster's
    space = parse_space(dict(SPACE, concurrency=2), source="s.yaml")
    assert at_a_time(space, cluster.shared_trials(space), None) == "2 at a time"


def test_a_cpu_space_on_a_gpu_machine_asks_for_no_gpu(monkeypatch, tmp_path):
    """A space whose train.device is cpu, searched on a GPU machine: each trial asked Ray for a share of a
    GPU it never used (its trials ran a GPU's worth at a time) and was accounted as sharing the GPU."""
    from triaccel.errors import ConfigError
    from triaccel.search import alone, cluster, tuner
    from triaccel.search.space import parse_space

    monkeypatch.setattr(cluster, "gpu_count", lambda: 1)  # a GPU machine (none in CI)
    cpu = parse_space(dict(SPACE, concurrency=2, gpus_per_trial=4))  # more GPUs than the machine has: not asked
    gpu = parse_space(dict(SPACE, concurrency=8, gpus_per_trial=0.25, train=dict(SPACE["train"], device="auto")))
    assert not cluster.on_gpu(cpu) and cluster.on_gpu(gpu)
    cluster.check_resources(cpu, None)
    with pytest.raises(ConfigError, match="gpus_per_trial: 4 is more than this machine's 1 GPUs"):
        cluster.check_resources(parse_space(dict(SPACE, gpus_per_trial=4, train=dict(SPACE["train"], device="cuda"))),
                               None)
    assert cluster.shared_trials(cpu) == min(2, os.cpu_count()) and cluster.shared_trials(gpu) == 4
    # two CPUs a trial: as many at once as this machine's CPUs hold (Ray schedules no more), not one per CPU
    wide = parse_space(dict(SPACE, concurrency=8, cpus_per_trial=2))
    assert cluster.shared_trials(wide) == max(1, min(8, os.cpu_count() // 2))
    assert cluster.gpu_share(cpu, 2) == 0.5 and cluster.gpu_share(gpu, 4) == 0.25
    res = lambda sp: tuner.trial_trainable(sp, 2, None, tmp_path)  # noqa: E731 -- what Tune asks Ray for
    from ray.tune.execution.placement_groups import PlacementGroupFactory

    def asks(sp):  # a trainable class (search.trainable.trial_class) asks through default_resource_request
        t = res(sp)
        r = (t.default_resource_request({}) if isinstance(t, type) else getattr(t, "_resources", None)) or {}
        r = r.required_resources if isinstance(r, PlacementGroupFactory) else r
        return dict(r)
    assert "GPU" not in asks(cpu) and "gpu" not in asks(cpu)
    assert (asks(gpu).get("GPU") or asks(gpu).get("gpu")) == 0.25
    assert alone.default_confirm(None, 4, cluster.on_gpu(cpu)) == 0  # trials shared cores, not a GPU


def _wait_group_gone(pgid, timeout=60):
    """Until no live process (a zombie is not) remains in process group ``pgid``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        live = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, IndexError):
                fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp
                if int(fields[2]) == pgid and fields[0] != "Z":
                    live.append(stat.parent.name)
        if not live:
            return
        time.sleep(0.1)
    raise AssertionError(f"processes of group {pgid} still alive {timeout}s after SIGKILL: {live}")


def test_sigkill_mid_search_then_resume_finishes_without_duplicates(tmp_path):
    with_store(tmp_path)  # a copy of the migrated template (the store's creation: elsewhere)
    space = dict(SPACE, trials=4, concurrency=1)  # one at a time: two trials left when two have finished
    space["params"] = {k: v for k, v in SPACE["params"].items() if k != "optim.lr"}
    space["train"] = dict(SPACE["train"], epochs=3)  # a trial killed between its epochs resumes from one
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    # one intra-op thread: on a shared 2-core machine a busy neighbour stalls torch's second thread
    # and the driver's in-process baseline slows down a hundredfold (the Ray trials use one already)
    env = child_env("MLFLOW_TRACKING_URI", "TRIACCEL_TUNE_DIR", OMP_NUM_THREADS="1")
    log = tmp_path / "search.log"  # a file, not a pipe nobody reads: a full pipe would stall the driver
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--name",
                                 "k"], cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # its own process group: the driver and its local Ray
    try:
        deadline = time.monotonic() + 900
        finished_before = []
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(1)
            if "triaccel search 'k':" not in log.read_text():
                continue  # the driver prints it once it has created the store: opening it sooner races that
            _, runs = trial_runs(tmp_path, "k")
            finished_before = [r for r in runs if r.info.status == "FINISHED"]
            if len(finished_before) >= 2:
                break
        assert proc.poll() is None, f"search ended before the kill ({proc.returncode}): {log.read_text()[-3000:]}"
        assert len(finished_before) >= 2, "search too slow to reach two finished trials"
        # the driver and its local Ray (trial workers included) die at once with no chance to clean
        # up, as the driver alone does moments later (Ray's reaper takes its group down with it)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        _wait_group_gone(proc.pid)  # nothing of it writes to the store any more
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    _, runs_at_kill = trial_runs(tmp_path, "k")
    assert len([r for r in runs_at_kill if r.info.status == "FINISHED"]) < 4, "search ended before the kill"
    before_end = {r.info.run_id: r.info.end_time for r in finished_before}

    r = cli("resume", "k", cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    c, runs = trial_runs(tmp_path, "k")
    tids = [x.data.tags["triaccel.trial_id"] for x in runs]
    assert len(runs) == 4 and len(set(tids)) == 4, tids  # no duplicate child runs
    assert all(x.info.status == "FINISHED" for x in runs)
    for x in runs:
        steps = [m.step for m in c.get_metric_history(x.info.run_id, "val_acc")]
        assert sorted(steps) == [1, 2, 3], (x.data.tags["triaccel.trial_id"], steps)  # none logged twice (3 epochs)
        if x.info.run_id in before_end:  # finished before the kill: not re-run
            assert x.info.end_time == before_end[x.info.run_id]
            lines = (tmp_path / "mlruns" / "tune" / "k" / x.data.tags["triaccel.trial_id"] / "result.json").read_text()
            # one result per epoch, never more (a re-run would append); Tune copies its result log to
            # storage in the background, so a kill can catch a finished trial's copy short
            assert len(lines.strip().splitlines()) <= 3
    trials = searcher_trials(tmp_path / "mlruns" / "tune" / "k")
    import optuna

    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 4 and len(trials) == 4  # Optuna's history: every trial once
    assert len({json.dumps(t.params, sort_keys=True) for t in complete}) == 4


def test_confirm_reruns_the_best_alone_and_export_prefers_it(searched):
    d, _ = searched
    r = cli("resume", "t1", "--confirm", "1", cwd=d)  # a finished search: nothing to resume, then the confirm runs
    assert r.returncode == 0, r.stderr[-2000:]
    c, confirms = trial_runs(d, "t1", role="confirm")
    _, runs = trial_runs(d, "t1")
    assert len(runs) == 6  # resuming a finished search re-ran nothing
    # the top trial, and the space's start point (every trial is feasible under SPACE's margin)
    # wherever it finished: sharing ranks configurations unlike running alone
    done = [x for x in runs if x.info.status == "FINISHED" and "efficiency" in x.data.metrics]
    top = max(done, key=lambda x: x.data.metrics["efficiency"]).info.run_id
    start = {x.info.run_id for x in done if x.data.tags.get("triaccel.start") == "true"}
    assert all(json.loads(x.data.tags["triaccel.values"])["triaccel.precision.tau_low"] == pytest.approx(2e-5)
               for x in done if x.info.run_id in start)
    confirmed = [x.data.tags["triaccel.confirms"] for x in confirms]
    assert sorted(confirmed) == sorted({top} | start), (confirmed, top, start)
    assert all(x.info.status == "FINISHED" and x.data.tags["shared_trials"] == "1" for x in confirms)
    r = cli("export", "t1", "--out", "confirmed.yaml", cwd=d)
    prov = yaml.safe_load((d / "confirmed.yaml").read_text())["provenance"]
    assert prov["confirmed_alone"] is True
    if prov["exported"] == "trial":  # the best of the confirm runs, by their figures alone
        best = max(confirms, key=lambda x: x.data.metrics["efficiency"])
        assert prov["mlflow_run_id"] == best.data.tags["triaccel.confirms"]
    assert prov["baseline"]["ratio"] == pytest.approx(prov["metrics"]["efficiency"]
                                                      / prov["baseline"]["metrics"]["efficiency"])
    # what the ratio is made of: the exported run's time and memory against the reference's
    assert prov["baseline"]["peak_mem_ratio"] == pytest.approx(prov["metrics"]["peak_mem_gib"]
                                                               / prov["baseline"]["metrics"]["peak_mem_gib"])
    if prov["exported"] == "trial":
        assert "the peak memory" in r.stdout


def test_ui_serves_the_trials_on_loopback_and_renders_in_a_browser(searched):
    import shutil
    import urllib.request

    d, _ = searched
    port = free_port()
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    server = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "ui", "--port", str(port)], cwd=d,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        # a start-up wait, not a timing check: on a loaded 2-core CI machine (a whole run 1.35x its usual
        # time, 2026-12-02) the server took over 60 s to answer, and this test failed there
        deadline = time.monotonic() + 240
        while True:
            try:
                if urllib.request.urlopen(base + "/health", timeout=2).read().strip() == b"OK":
                    break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(server.pid, signal.SIGKILL)  # the whole group: its workers hold the pipe open
                server.wait(timeout=30)
                pytest.fail(f"MLflow UI did not come up (exit {server.returncode}): {server.stdout.read()[-2000:]!r}")
            time.sleep(1)
        exp = json.loads(urllib.request.urlopen(
            base + "/api/2.0/mlflow/experiments/get-by-name?experiment_name=triaccel-search").read())["experiment"]
        req = urllib.request.Request(base + "/api/2.0/mlflow/runs/search", method="POST",
                                     data=json.dumps({"experiment_ids": [exp["experiment_id"]],
                                                      "filter": "tags.`triaccel.search` = 't1'",
                                                      "max_results": 100}).encode(),
                                     headers={"Content-Type": "application/json"})
        runs = json.loads(urllib.request.urlopen(req).read())["runs"]
        roles = sorted(next(t["value"] for t in r["data"]["tags"] if t["key"] == "triaccel.role") for r in runs)
        assert roles.count("parent") == 1 and roles.count("trial") == 6  # (+ a confirm run if that test ran)
        # a viewer, not MLflow's GenAI job runner too (it started seven workers on a database store)
        environ = Path(f"/proc/{server.pid}/environ").read_bytes().split(b"\0")
        assert b"MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false" in environ
        # it listens on loopback only
        out = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True).stdout if shutil.which("ss") else ""
        if out:
            assert any(f"127.0.0.1:{port}" in ln for ln in out.splitlines())
            assert not any(f"0.0.0.0:{port}" in ln or f"*:{port}" in ln for ln in out.splitlines())
        chromium = shutil.which("chromium")
        if chromium is None:
            pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
        shot = d / "ui.png"
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        "--no-first-run", "--disable-background-networking", "--disable-component-update",
                        "--disable-sync", "--disable-quic", f"--user-data-dir={d / 'chrome'}",
                        "--window-size=1500,1000", "--virtual-time-budget=20000", f"--screenshot={shot}",
                        f"{base}/#/experiments/{exp['experiment_id']}/runs"], capture_output=True, timeout=600)
        assert shot.is_file() and shot.stat().st_size > 20_000  # a rendered page, not a blank one
        from PIL import Image

        im = Image.open(shot).convert("L")
        assert len(set(im.getdata())) > 16  # text and widgets, not a flat error page
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def test_pareto_search_exports_a_front_member(tmp_path):
    with_store(tmp_path)  # a copy of the migrated template (the store's creation: elsewhere)
    space = dict(SPACE, objective="pareto", trials=2, concurrency=2)
    space["params"] = {k: v for k, v in SPACE["params"].items() if k != "optim.lr"}
    space["train"] = dict(SPACE["train"], epochs=1)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    r = cli("search", "--space", "space.yaml", "--name", "p", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    c, parents = trial_runs(tmp_path, "p", role="parent")
    assert "pareto_front.png" in {a.path for a in c.list_artifacts(parents[0].info.run_id)}
    r = cli("export", "p", "--out", "front0.yaml", "--pick", "pareto-0", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    prov = yaml.safe_load((tmp_path / "front0.yaml").read_text())["provenance"]
    _, runs = trial_runs(tmp_path, "p")
    best_acc = max(x.data.metrics["val_acc"] for x in runs)
    assert prov["pick"] == "pareto-0" and prov["metrics"]["val_acc"] == best_acc  # the front, best accuracy first
    r = cli("export", "p", "--out", "x.yaml", "--pick", "pareto-99", cwd=tmp_path)
    assert r.returncode == 2 and "the Pareto front has" in r.stderr


def test_a_trial_just_below_the_margin_gets_a_second_seed_beside_the_reference(tmp_path):
    """A single seed judges a config as accurate as the reference infeasible about one time in four:
    a trial within `second_look` pp beyond the margin is confirmed alone, then re-run alone at the
    reference's next seed, as the reference is, and the mean of the two paired gaps decides. Here a
    slow lr puts the one trial below the reference (margin 0, a band wide enough to take it)."""
    with_store(tmp_path)  # a copy of the migrated template (the store's creation: elsewhere)
    space = dict(SPACE, trials=1, concurrency=1, baseline={"batch_sizes": [64], "accuracy_margin": 0.0,
                                                           "second_look": 100.0})
    space["params"] = {"optim.lr": {"distribution": "categorical", "choices": [0.05, 0.002]}}
    space["start"] = [{"optim.lr": 0.002}]
    space["train"] = dict(SPACE["train"], epochs=1)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    r = cli("search", "--space", "space.yaml", "--name", "s2", "--confirm", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    _, trials = trial_runs(tmp_path, "s2")
    _, base = trial_runs(tmp_path, "s2", role="baseline")
    _, confirms = trial_runs(tmp_path, "s2", role="confirm")
    _, looks = trial_runs(tmp_path, "s2", role="recheck")
    (t,), (b,), (conf,) = trials, base, confirms
    assert conf.data.tags["triaccel.confirms"] == t.info.run_id and conf.data.params["seed"] == "0"
    gap1 = conf.data.metrics["val_acc"] - b.data.metrics["val_acc"]  # alone, at the trial's seed
    assert -100.0 <= gap1 < 0.0, gap1  # the setup: the trial is a near miss
    ref2 = [x for x in looks if x.data.tags.get("triaccel.baseline") == b.data.tags["triaccel.baseline"]]
    mine = [x for x in looks if x.data.tags.get("triaccel.confirms") == t.info.run_id]
    assert len(ref2) == 1 and len(mine) == 1 and len(looks) == 2, [x.data.tags for x in looks]
    # really run at the next seed (the config each logged), not only tagged so
    assert all(x.info.status == "FINISHED" and x.data.params["seed"] == "1" for x in looks)
    gap2 = mine[0].data.metrics["val_acc"] - ref2[0].data.metrics["val_acc"]
    mean = (gap1 + gap2) / 2
    verdict = "feasible" if mean >= 0.0 else "infeasible"  # margin 0
    assert f"d.acc {gap1:+.2f} at the first seed, {gap2:+.2f} at the next, mean {mean:+.2f}: {verdict}" \
        in r.stdout, r.stdout
    r = cli("export", "s2", "--out", "tuned.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    prov = yaml.safe_load((tmp_path / "tuned.yaml").read_text())["provenance"]
    # the reference's second seed never becomes the reference, whatever it scored
    assert prov["baseline"]["mlflow_run_id"] == b.info.run_id
    if mean >= 0:  # feasible on two seeds: judged by its figures alone at its own seed
        assert prov["exported"] == "trial" or prov["why"].startswith("nothing feasible beat the baseline: the best")
    else:
        assert prov["exported"] == "baseline" and "no trial kept validation accuracy" in prov["why"]
        assert "triaccel" not in yaml.safe_load((tmp_path / "tuned.yaml").read_text())  # static AMP: inert


def test_confirm_second_look_and_judge_runs_a_crash_cut_short_are_closed_killed(tmp_path):
    """A driver killed mid confirm, second look or judge left that run RUNNING beside the one `resume`
    ran again, for good; they are closed KILLED before the confirm step starts (as baselines are),
    and other searches' runs and finished runs are left as they are."""
    from triaccel.search.alone import close_cut_short
    from triaccel.search.state import open_store

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    c, exp = open_store(uri)
    ids = {}
    for search, role, done in [("a", "recheck", False), ("a", "confirm", False), ("a", "recheck", True),
                               ("a", "judge", False), ("a", "trial", False), ("b", "recheck", False)]:
        r = c.create_run(exp, tags={"triaccel.search": search, "triaccel.role": role})
        if done:
            c.set_terminated(r.info.run_id, status="FINISHED")
        ids[(search, role, done)] = r.info.run_id
    close_cut_short("a", uri)
    status = {k: c.get_run(v).info.status for k, v in ids.items()}
    assert status == {("a", "recheck", False): "KILLED", ("a", "confirm", False): "KILLED",
                      ("a", "recheck", True): "FINISHED", ("a", "judge", False): "KILLED", ("a", "trial", False): "RUNNING",
                      ("b", "recheck", False): "RUNNING"}, status


# what a search's driver does to reach Ray (search.runner: check_address, then init_ray), then the GCS it reached
_REACH_RAY = """
import ast, sys
import ray
from triaccel.search.cluster import check_address, init_ray
address = ast.literal_eval(sys.argv[1])
check_address(address)
init_ray(address)
print("GCS", ray.get_runtime_context().gcs_address)
ray.shutdown()
"""


@pytest.mark.ray_cluster
def test_address_joins_an_existing_cluster_and_a_plain_search_stays_local(tmp_path):
    """`ray start --head` as a user would: the address it prints, the loopback form and --address auto reach
    that cluster, and a driver without --address starts a Ray of its own (by the driver's own steps, not
    whole searches). A whole search at a printed address, token authentication on, runs its trials on the
    cluster in tests/test_team.py (two nodes)."""
    import shutil

    # the `ray` command; where Ray is on PYTHONPATH without its console script (the GPU machine's
    # unpacked site), the same CLI through the interpreter
    # this interpreter's own first: another `ray` on PATH (a pyenv shim) starts workers that cannot import triaccel
    own = Path(sys.executable).parent / "ray"
    ray_bin = str(own) if own.exists() else shutil.which("ray")
    ray_cmd = [ray_bin] if ray_bin else [sys.executable, "-c", "from ray.scripts.scripts import main; main()"]
    with_store(tmp_path)  # a copy of the migrated template (the store's creation: elsewhere)
    space = dict(SPACE, trials=1, concurrency=1)
    space["params"] = {k: v for k, v in SPACE["params"].items() if k != "optim.lr"}
    env = {k: v for k, v in child_env().items() if not k.startswith("RAY_AUTH")}  # the cluster's workers inherit it
    # a token on the machine (any earlier local ray.init writes one): `ray start` then turns token auth on
    subprocess.run([*ray_cmd, "get-auth-token", "--generate"], capture_output=True, timeout=600, env=env)
    # one GPU declared (Ray takes a node's word for it): a search that would train on it is refused from this
    # GPU-less machine; the CPU space's trials ask for none
    r = subprocess.run([*ray_cmd, "start", "--head", "--port=6391", "--num-cpus=2", "--num-gpus=1",
                        "--include-dashboard=false"],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    printed = re.search(r"--address='([^']+)'", r.stdout + r.stderr)  # what `ray start` tells the user to use
    assert printed, (r.stdout + r.stderr)[-2000:]
    try:
        port = printed.group(1).rsplit(":", 1)[1]
        # a search on the device it finds (auto), at --address as printed, from a machine with no GPU: its
        # baselines would train on this machine's CPU and its trials ask for no GPU, beside the cluster's;
        # refused before anything is written
        import torch

        if not torch.cuda.is_available():
            (tmp_path / "gpu.yaml").write_text(yaml.safe_dump(dict(space, train=dict(space["train"], device="auto"))))
            r = cli("search", "--space", "gpu.yaml", "--name", "gpu", "--address", printed.group(1), cwd=tmp_path)
            assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == (
                f"triaccel: error: --address {printed.group(1)}: the cluster has 1 GPU and this machine none; a "
                f"search's baselines and confirm runs train on the machine that runs it: run the search on a node "
                f"with a GPU (or set train.device: cpu to search on CPUs)"), r.stderr[-2000:]
            assert not (tmp_path / "mlruns" / "tune" / "gpu").exists()
        # the printed form (this node's IP), the loopback form (issue 14 case 14: with token authentication on,
        # as `ray start` turns it on wherever ~/.ray/auth_token exists, neither could be joined) and auto join
        # the same cluster, and no
        # --address starts a Ray of its own beside it: the steps a search takes to reach Ray, each in a
        # process of its own as a search's driver (a whole search per form added minutes, not coverage)
        for address, joins in ((printed.group(1), True), (f"127.0.0.1:{port}", True), ("auto", True), (None, False)):
            r = subprocess.run([sys.executable, "-c", _REACH_RAY, repr(address)], cwd=tmp_path, capture_output=True,
                               text=True, timeout=600, env=env)
            assert r.returncode == 0, (address, r.stderr[-3000:])
            gcs = next((ln.split()[-1] for ln in r.stdout.splitlines() if ln.startswith("GCS ")), None)
            assert gcs is not None and gcs.endswith(f":{port}") == joins, (address, r.stdout[-2000:])
    finally:
        subprocess.run([*ray_cmd, "stop", "--force"], capture_output=True, timeout=600)


def test_readme_main_job_runs_as_written(tmp_path):
    """README's first command: the shipped quickstart search, then export and train from it."""
    r = cli("search", "--space", str(Path(__file__).resolve().parents[1] / "spaces" / "quickstart.yaml"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sum(ln.startswith("trial ") for ln in r.stdout.splitlines()) == 8
    assert "reference baseline:" in r.stdout and " base " in r.stdout  # baselines lead the summary
    # the space's start point ran every epoch: ASHA never stops a start point (tests/test_schedulers.py)
    from triaccel.search.results import is_complete, trial_table

    c = mlflow_client(tmp_path)
    rows = trial_table(c, c.get_experiment_by_name("triaccel-search").experiment_id, "quickstart")
    start = [x for x in rows if x["tags"].get("triaccel.start") == "true"]  # the trial Optuna ran from it
    assert len(start) == 1 and is_complete(start[0], 4), [(x["values"], x["metrics"].get("epoch")) for x in rows]
    assert start[0]["values"]["triaccel.precision.tau_low"] == pytest.approx(1000.0)
    r = cli("export", "quickstart", "--out", "tuned.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    prov = yaml.safe_load((tmp_path / "tuned.yaml").read_text())["provenance"]
    b = prov["baseline"]
    assert prov["exported"] in ("trial", "baseline") and b["search_gpu_s"] > 0
    if prov["exported"] == "trial":  # never a trial below the accuracy margin or below the baseline's score
        assert b["val_acc_diff_pp"] >= -b["accuracy_margin_pp"] - 1e-9 and b["ratio"] > 1.0
    else:
        assert b["ratio"] == pytest.approx(1.0) and "beat the baseline" in prov["why"]
    r = cli("train", "--config", "tuned.yaml", "--set", "epochs=12", cwd=tmp_path)  # README's production line
    assert r.returncode == 0 and "test acc" in r.stdout, r.stderr[-2000:]
    assert "epoch  12/12" in r.stdout


def test_the_judge_pairs_trial_and_reference_by_seed_at_the_production_length(tmp_path):
    """production_epochs: the confirmed trial and the reference are re-run alone at that length, at the
    same seeds; export decides on the paired ratios' lower bound and writes the length judged. A static
    winner is written as the static run it is: mode amp, no triaccel section."""
    with_store(tmp_path)  # a copy of the migrated template (the store's creation: elsewhere)
    space = dict(SPACE, trials=1, concurrency=1, production_epochs=2, judge_seeds=2)
    space["params"] = {"optim.lr": {"distribution": "categorical", "choices": [0.05, 0.1]}}
    space["start"] = [{"optim.lr": 0.05}]
    space["train"] = dict(SPACE["train"], epochs=1)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    r = r_search = cli("search", "--space", "space.yaml", "--name", "j", "--confirm", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (t,), (b,) = trial_runs(tmp_path, "j")[1], trial_runs(tmp_path, "j", role="baseline")[1]
    _, judged = trial_runs(tmp_path, "j", role="judge")
    by = {(x.data.tags["triaccel.judges"], int(x.data.tags["triaccel.seed"])): x for x in judged}
    assert set(by) == {("baseline", 0), ("baseline", 1), (t.info.run_id, 0), (t.info.run_id, 1)}, set(by)
    # really trained at that length and seed (the config each run logged), alone
    assert all(x.info.status == "FINISHED" and x.data.params["epochs"] == "2" and x.data.params["seed"] == str(s)
               and x.data.tags["shared_trials"] == "1" for (_, s), x in by.items())
    ratios = [by[(t.info.run_id, s)].data.metrics["efficiency"] / by[("baseline", s)].data.metrics["efficiency"]
              for s in (0, 1)]
    assert "judged at 2 epochs (the production length)" in r.stdout, r.stdout
    assert r.stdout.rstrip().endswith("judged at 2 epochs: to train another length N, `triaccel resume j "
                                      "--production-epochs N` judges it there first"), r.stdout[-500:]
    assert re.search(r"ratio \d\.\d{3} ± \d\.\d{3} over 2 seeds, 95 % lower bound", r.stdout), r.stdout
    r = cli("export", "j", "--out", "tuned.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = yaml.safe_load((tmp_path / "tuned.yaml").read_text())
    prov, cand = doc["provenance"], doc["provenance"]["judge"]["candidates"][0]
    assert doc["epochs"] == 2 and prov["judge"]["seeds"] == [0, 1]
    assert cand["ratios"] == pytest.approx(ratios) and cand["mlflow_run_id"] == t.info.run_id
    mean, sd = sum(ratios) / 2, abs(ratios[0] - ratios[1]) / 2 ** 0.5
    assert cand["lower_bound_95"] == pytest.approx(mean - 6.314 * sd / 2 ** 0.5)
    # how the search's 1-epoch verdict held at 2 epochs: the trial's ratio there, and whether it changed side
    agree = prov["judge"]["rank_agreement"]
    assert (agree["search_epochs"], agree["production_epochs"], agree["runs"]) == (1, 2, 2), agree
    assert agree["flipped"] == ([t.info.run_id] if (cand["search_ratio"] > 1) != (mean > 1) else []), agree
    assert f"{cand['search_ratio']:.3f} at 1 epoch, then ratio" in r_search.stdout, r_search.stdout
    if cand["lower_bound_95"] > 1.0:
        assert prov["exported"] == "trial" and doc["mode"] == "triaccel"
    else:  # the static reference, as the baseline ran it
        assert prov["exported"] == "baseline" and prov["judge"]["exported"] == "baseline"
        assert doc["mode"] == "amp" and "triaccel" not in doc and prov["mlflow_run_id"] == b.info.run_id
        assert "lower bound" in prov["why"]
    # --pick baseline writes the reference static run whatever the verdict, with its judged figures; export
    # --epochs overrides the space's production length (the lr schedule stretches to it)
    r = cli("export", "j", "--out", "tuned3.yaml", "--epochs", "3", "--pick", "baseline", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = yaml.safe_load((tmp_path / "tuned3.yaml").read_text())
    prov = doc["provenance"]
    assert doc["epochs"] == 3 and doc["mode"] == "amp" and "triaccel" not in doc
    assert prov["exported"] == "baseline" and prov["mlflow_run_id"] == b.info.run_id and prov["pick"] == "baseline"
    assert prov["metrics"]["efficiency"] == pytest.approx(
        sum(by[("baseline", s)].data.metrics["efficiency"] for s in (0, 1)) / 2)
    assert "--pick baseline" in prov["why"] and "judged at 2 epochs" in prov["why"]
    # what was asked for is said as asked, never as the search's finding (it said "found nothing better")
    assert "as --pick baseline asked" in r.stdout and "found nothing better" not in r.stdout, r.stdout
    # a length the verdict was not measured at is said, with the command that judges it there
    how = "`triaccel resume j --production-epochs 3` judges it at 3"
    assert how in r.stderr and f"# Its verdict was measured at 2 epochs, not 3: {how}" in \
        (tmp_path / "tuned3.yaml").read_text(), r.stderr
    assert "not 2" not in (tmp_path / "tuned.yaml").read_text()
    # bench/judge_table.py reads the same judgement back from the store as a results file
    out = tmp_path / "judge.json"
    r = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "bench" / "judge_table.py"),
                        "--store", f"sqlite:///{tmp_path}/mlruns/mlflow.db", "--search", "j",
                        "--exported", t.data.tags["triaccel.trial_id"], "--out", str(out)],
                       capture_output=True, text=True, timeout=300, env=user_env())
    assert r.returncode == 0, r.stderr[-2000:]
    table = json.loads(out.read_text())
    assert table["paired_ratio_to_reference"]["exported"]["ratios"] == pytest.approx(ratios)
    assert table["paired_ratio_to_reference"]["exported"]["seeds"] == [0, 1]
    (static,) = [k for k in table["summary"] if k.startswith("static amp")]
    assert table["summary"][static]["efficiency"]["n"] == 2 and "B=" in static
    # what trained the runs, as their tags recorded it: a CPU (device: cpu), so no GPU is claimed, even where
    # this test runs on a GPU machine
    import torch

    assert table["env"]["torch"] == torch.__version__ and table["env"]["gpu"] is None
    assert table["env"]["git_rev_source"] == "the judge runs' git_revision tag"
    assert table["env"]["git_rev"] == by[("baseline", 0)].data.tags["git_revision"].removesuffix("-dirty")
    # judged again at the length the user trains: `resume --production-epochs 3` trains the top trial and the
    # reference alone at 3 epochs, paired by seed, beside the 2-epoch runs (which stay, and count only at 2);
    # the export then trains 3 epochs on the new verdict. The GPT export judged 2.6x static at 8 epochs was
    # 0.59 pp below static's accuracy at 16: a verdict does not carry over to another length.
    r = cli("resume", "j", "--production-epochs", "0", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == (
        "triaccel: error: --production-epochs 0: must be in [train.epochs (1), 100000]: the length the export "
        "is trained for, judged at that length"), r.stderr
    r = cli("resume", "j", "--production-epochs", "3", "--confirm", "0", cwd=tmp_path)
    assert r.returncode == 2 and "--production-epochs 3 with --confirm 0" in r.stderr, r.stderr
    r = cli("resume", "j", "--production-epochs", "3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "judged at 3 epochs from now on (was 2)" in r.stdout and "export the best" in r.stdout, r.stdout
    assert "re-running alone" not in r.stdout  # the judge alone: the confirm step is not run again
    _, judged = trial_runs(tmp_path, "j", role="judge")
    by = {(x.data.tags["triaccel.judges"], int(x.data.tags["triaccel.seed"]), x.data.params["epochs"]): x
          for x in judged if x.info.status == "FINISHED"}
    assert set(by) == {(who, s, e) for who in ("baseline", t.info.run_id) for s in (0, 1) for e in ("2", "3")}, set(by)
    r = cli("export", "j", "--out", "tuned4.yaml", cwd=tmp_path)
    assert r.returncode == 0 and "verdict was measured" not in r.stderr, r.stderr
    doc = yaml.safe_load((tmp_path / "tuned4.yaml").read_text())
    judge = doc["provenance"]["judge"]
    assert doc["epochs"] == 3 and judge["production_epochs"] == 3
    # what it says is what it wrote: 3 epochs, resume's production length, not "the search's budget" of 1
    assert "it trains 3 epochs, the search's production_epochs (it scored 1)" in r.stdout, r.stdout
    assert "the search's budget" not in r.stdout + (tmp_path / "tuned4.yaml").read_text()
    # the search's cost counts the eight judge runs (each alone: its wall time), not only its trial and baseline
    walls = sum(x.data.metrics["wall_s"] for x in judged)
    assert doc["provenance"]["baseline"]["search_gpu_s"] > walls, (doc["provenance"]["baseline"], walls)
    ratios = [by[(t.info.run_id, s, "3")].data.metrics["efficiency"] / by[("baseline", s, "3")].data.metrics["efficiency"]
              for s in (0, 1)]
    assert judge["candidates"][0]["ratios"] == pytest.approx(ratios)
    r = cli("resume", "j", cwd=tmp_path)  # the search keeps its new length: nothing more runs
    assert r.returncode == 0 and "has finished; nothing was left to run" in r.stdout, r.stdout
    # the results table reads one length at a time
    r = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "bench" / "judge_table.py"),
                        "--store", f"sqlite:///{tmp_path}/mlruns/mlflow.db", "--search", "j", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, env=user_env())
    assert r.returncode != 0 and "was judged at 2, 3 epochs: give --epochs" in r.stderr, r.stderr[-2000:]
