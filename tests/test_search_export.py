"""`triaccel export` (search/export.py): paths it cannot write, exports at once, a read-only store,
a static export. Real subprocesses, real local Ray, a real sqlite MLflow store."""
import os
import subprocess
import sys

import pytest
import yaml

from _harness import SPACE, cli, free_port, user_env, with_store

ONE_TRIAL = dict(SPACE, trials=1, concurrency=1)


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """A working folder holding one finished 1-trial search, 'x', that every export here reads.
    Each test writes its files under a folder of its own: export reads the search through the
    working folder's mlruns/, so the tests run there."""
    d = with_store(tmp_path_factory.mktemp("export"))  # a copy of the migrated template
    (d / "space.yaml").write_text(yaml.safe_dump(ONE_TRIAL))
    r = cli("search", "--space", "space.yaml", "--name", "x", cwd=d)
    assert r.returncode == 0, r.stderr[-3000:]
    return d


@pytest.mark.slow
def test_export_to_a_path_it_cannot_write_is_one_line_and_writes_nothing(searched):
    """--out in a folder that does not exist (it was created), a folder, a path under /proc or a
    device: one line naming --out, exit 2, nothing written; a good path still exports."""
    tmp_path, space = searched, ONE_TRIAL
    (tmp_path / "adir").mkdir()
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "mlruns" not in p.parts)
    for out, extra, line in [
        ("nodir/tuned.yaml", [], "--out nodir/tuned.yaml: no such folder nodir"),
        ("adir", [], "--out 'adir': names a folder, not a file; give a file path such as adir/tuned.yaml"),
        ("new/", [], "--out 'new/': names a folder, not a file; give a file path such as new/tuned.yaml"),
        ("", [], "--out '': names a folder, not a file; give a file path such as tuned.yaml"),
        ("/proc/tuned.yaml", [], "--out /proc/tuned.yaml: cannot write "),
        ("/dev/null", ["--force"], "--out /dev/null: is not a regular file; export writes a YAML file"),
    ]:
        r = cli("export", "x", "--out", out, *extra, cwd=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (out, r.stderr[-2000:])
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"triaccel: error: {line}"), (out, lines)
    # case 10: an existing file, the search's own space included, is not replaced without --force
    r = cli("export", "x", "--out", "space.yaml", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "triaccel: error: --out space.yaml: exists; choose another path or add --force to replace it"], r.stderr
    assert yaml.safe_load((tmp_path / "space.yaml").read_text()) == space
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "mlruns" not in p.parts) == before
    assert not os.path.exists("/proc/tuned.yaml") and os.path.exists("/dev/null")
    r = cli("export", "x", "--out", "adir/tuned.yaml", cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "adir" / "tuned.yaml").is_file(), r.stderr[-2000:]


@pytest.mark.slow
def test_a_store_that_has_gone_is_one_line_for_export_and_resume(searched, tmp_path):
    """The store the search recorded has gone (a server that stopped): one line naming it, not the train key.
    A copy of the search's state in a folder of its own, recording a server nothing answers at."""
    import json
    import shutil

    port = free_port()
    state = json.loads((searched / "mlruns" / "tune" / "x" / "triaccel_search.json").read_text())
    shutil.copytree(searched / "mlruns" / "tune" / "x", tmp_path / "mlruns" / "tune" / "x")
    (tmp_path / "mlruns" / "tune" / "x" / "triaccel_search.json").write_text(
        json.dumps(dict(state, tracking_uri=f"http://127.0.0.1:{port}")))
    for args in (["export", "x", "--out", "again.yaml"], ["resume", "x"]):
        r = cli(*args, cwd=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert r.stderr.strip().splitlines() == [
            f"triaccel: error: the search's MLflow store (recorded when it started): no MLflow server answers at "
            f"http://127.0.0.1:{port} ([Errno 111] Connection refused)"], args
    assert not (tmp_path / "again.yaml").exists()


@pytest.mark.slow
def test_exports_at_once_without_force_replace_nothing(searched):
    """Four `export --out tuned.yaml` at once without --force all passed the exists check and all
    exited 0, each replacing the last; and a user's own tuned.yaml.tmp was overwritten and deleted
    (the fixed temporary name). Now one export writes the file, the others say it exists."""
    out_dir = searched / "at_once"
    out_dir.mkdir()
    (out_dir / "tuned.yaml.tmp").write_text("mine\n")
    procs = [subprocess.Popen([sys.executable, "-m", "triaccel.cli", "export", "x", "--out", "at_once/tuned.yaml"],
                              cwd=searched, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=user_env())
             for _ in range(4)]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    assert sorted(rc for rc, _ in results) == [0, 2, 2, 2], results
    for rc, err in results:
        if rc:
            assert "Traceback" not in err and err.strip().splitlines() == [
                "triaccel: error: --out at_once/tuned.yaml: exists (written meanwhile by another process); choose "
                "another path or add --force to replace it"], err
    assert (out_dir / "tuned.yaml.tmp").read_text() == "mine\n"
    assert yaml.safe_load((out_dir / "tuned.yaml").read_text())["provenance"]["search"] == "x"
    assert sorted(p.name for p in out_dir.iterdir()) == ["tuned.yaml", "tuned.yaml.tmp"]
    for out in ("space.yaml/tuned.yaml", "space.yaml/a/tuned.yaml"):  # a parent that is a file: was "no such folder"
        r = cli("export", "x", "--out", out, cwd=searched)
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [
            f"triaccel: error: --out {out}: space.yaml is a file, not a folder"], r.stderr[-2000:]


@pytest.mark.slow
def test_export_from_a_read_only_store(searched):
    """A finished search's store on a read-only disk (an archive, a shared mount): export, which only
    reads it, failed in one line (the store's lock file could not be made) and `searches` showed no
    figures. Now both read it; a resume there (Tune's restore: a pyarrow traceback) is one line.
    Needs a read-only bind mount (root in a sandbox that allows it); the store is writable again after."""
    tmp_path = searched
    (tmp_path / "read_only").mkdir()
    store = tmp_path / "mlruns"
    if subprocess.run(["mount", "--bind", str(store), str(store)], capture_output=True).returncode:
        pytest.skip("cannot bind-mount here")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(store)], capture_output=True).returncode:
            pytest.skip("cannot make a bind mount read-only here")
        r = cli("export", "x", "--out", "read_only/tuned.yaml", cwd=tmp_path)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
        assert yaml.safe_load((tmp_path / "read_only" / "tuned.yaml").read_text())["provenance"]["search"] == "x"
        r = cli("searches", cwd=tmp_path)
        assert r.returncode == 0 and " finished " in r.stdout and "cannot" not in r.stdout, r.stdout
        r = cli("resume", "x", cwd=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
        assert r.stderr.strip().splitlines() == [
            f"triaccel: error: {store / 'tune' / 'x'}: cannot write there (a read-only disk or no permission): "
            f"resume continues the search in that folder"]
    finally:
        subprocess.run(["umount", str(store)], capture_output=True)


def test_a_static_export_and_the_summary_columns_read_plainly():
    from triaccel.search.summary import headers

    assert headers(["triaccel.batch.grow_factor", "optim.lr"]) == ["grow_factor", "lr"]
    assert headers(["triaccel.batch.rho_high", "triaccel.precision.rho_high"]) == ["batch.rho_high",
                                                                                   "precision.rho_high"]


def test_the_export_evaluates_the_test_split_and_says_so_where_the_space_said_false():
    """The trials and baselines never evaluate the test split; the exported production run does, at its end. A
    space's `evaluate_test: false` (the shipped spaces write it: the search never looks at the test set) was
    turned true without a word: the export's header says so now, for a trial and for the baseline alike."""
    from triaccel.search.export import exported_config, test_said_false
    from triaccel.search.results import Pick
    from triaccel.search.space import parse_space

    for written in (None, False, True):
        train = dict(SPACE["train"], **({} if written is None else {"evaluate_test": written}))
        space = parse_space(dict(SPACE, train=train, baseline={"batch_sizes": [64]}), source="s.yaml")
        for pick in (Pick("trial", {"values": {"triaccel.precision.tau_low": 1e-6}}, {}, ""),
                     Pick("baseline", {"tags": {"triaccel.baseline": "amp-bf16-B64"}}, {}, "")):
            cfg, _, _ = exported_config(space, pick, None)
            assert cfg.evaluate_test is True, (written, pick.kind)
        assert test_said_false(space) is (written is False)


def test_the_printed_train_command_runs_as_pasted_with_a_space_in_the_path():
    """`train with \`triaccel train --config exp 2.yaml\`` was printed for --out "exp 2.yaml": pasted, it was
    `unrecognized arguments: 2.yaml`."""
    import shlex
    from pathlib import Path

    from triaccel.search.export import train_command

    said = train_command({}, Path("my dir/exp 2.yaml"))
    assert shlex.split(said) == ["triaccel", "train", "--config", "my dir/exp 2.yaml"]
    assert train_command({}, Path("tuned.yaml")) == "triaccel train --config tuned.yaml"
