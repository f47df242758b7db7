"""tests/run_gpu.sh's SHARD=i/n, run on a throw-away tree of tests (python3's pip made a no-op:
the script reinstalls the package it is run from)."""
import os
import shutil
import stat
import subprocess
import sys

import pytest

from conftest import ROOT


def _tree(tmp_path, bad: bool):
    (tmp_path / "tests").mkdir()
    shutil.copy(ROOT / "tests" / "run_gpu.sh", tmp_path / "tests" / "run_gpu.sh")
    (tmp_path / "tests" / "test_ok.py").write_text("".join(f"def test_{c}():\n    pass\n" for c in "abc"))
    if bad:  # a file that fails to import: a collection error
        (tmp_path / "tests" / "test_bad.py").write_text("import no_such_module_here\n\ndef test_x():\n    pass\n")
    shim = tmp_path / "bin"
    shim.mkdir()
    py = shim / "python3"
    py.write_text(f'#!/bin/sh\n[ "$1 $2" = "-m pip" ] && exit 0\nexec "{sys.executable}" "$@"\n')
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "out").mkdir()
    return tmp_path


def _env(*drop):
    """This process's environment without the script's switches and without pytest-xdist's worker
    variables: run under xdist (the GPU machine's `GPU_WORKERS=6 PART=rest`), the nested pytest
    inherited PYTEST_XDIST_WORKER and its 'not in a worker' check failed (2026-12-02)."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PART", "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST", *drop) and not k.startswith("PYTEST_XDIST_")}


def _run(root, shard, args="tests"):
    env = _env("GPU_WORKERS")
    env.update(PATH=f"{root / 'bin'}:{env['PATH']}", OUT=str(root / "out"), SHARD=shard, PYTEST_ARGS=args)
    return subprocess.run(["bash", str(root / "tests" / "run_gpu.sh")], env=env, capture_output=True, text=True,
                          timeout=600)


def test_shard_reports_a_collection_error(tmp_path):
    """A file that fails to import fails the shard (as it fails the unsharded run), not dropped
    from the selection with the other tests passing and exit 0."""
    r = _run(_tree(tmp_path, bad=True), "1/2")
    assert r.returncode != 0, r.stdout + r.stderr
    assert "test_bad.py" in r.stdout + r.stderr


@pytest.mark.parametrize("shard", ["3", "0/2", "3/2", "1/0", "1/2/3"])
def test_shard_must_be_i_of_n(tmp_path, shard):
    r = _run(_tree(tmp_path, bad=False), shard)
    assert r.returncode == 2 and "SHARD must be i/n" in r.stderr, r.stdout + r.stderr


def test_shards_split_the_tests(tmp_path):
    root = _tree(tmp_path, bad=False)
    r1, r2 = _run(root, "1/2"), _run(root, "2/2")
    assert r1.returncode == 0 and "2 passed" in r1.stdout, r1.stdout + r1.stderr
    assert r2.returncode == 0 and "1 passed" in r2.stdout, r2.stdout + r2.stderr


def test_out_folder_that_does_not_exist_yet_is_made(tmp_path):
    """OUT=$OUT/cuda on the GPU machine: the script wrote its log into a folder nobody made and
    printed 'no summary' for a part whose tests never ran (2026-12-01)."""
    root = _tree(tmp_path, bad=False)
    env = _env("GPU_WORKERS", "SHARD")
    env.update(PATH=f"{root / 'bin'}:{env['PATH']}", OUT=str(root / "out" / "part" / "cuda"), PYTEST_ARGS="tests")
    r = subprocess.run(["bash", str(root / "tests" / "run_gpu.sh")], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and "3 passed" in r.stdout, r.stdout + r.stderr
    assert (root / "out" / "part" / "cuda" / "gpu_tests.log").is_file()


@pytest.mark.parametrize("alone_fails", [False, True])
def test_workers_run_side_by_side_then_the_cluster_tests_alone(tmp_path, alone_fails):
    """GPU_WORKERS=N: pytest-xdist over everything but the ``ray_cluster`` tests, which then run
    alone (beside another test's Ray, `--address auto` joins it); one summary line names both
    passes, and a failure in the second fails the run."""
    pytest.importorskip("xdist")
    root = _tree(tmp_path, bad=False)
    (root / "tests" / "test_cluster.py").write_text(
        "import os\nimport pytest\n\n\n@pytest.mark.ray_cluster\ndef test_alone():\n"
        "    assert os.environ.get('PYTEST_XDIST_WORKER') is None  # not in a worker\n"
        f"    assert {not alone_fails}\n")
    env = _env("SHARD")
    env.update(PATH=f"{root / 'bin'}:{env['PATH']}", OUT=str(root / "out"), PYTEST_ARGS="tests", GPU_WORKERS="2")
    r = subprocess.run(["bash", str(root / "tests" / "run_gpu.sh")], env=env, capture_output=True, text=True,
                       timeout=600)
    first, _, alone = r.stdout.partition(" with 2 workers; alone: ")
    assert alone and "3 passed" in first and "failed" not in first, r.stdout + r.stderr
    if alone_fails:
        assert r.returncode != 0 and alone.startswith("1 failed, 3 deselected"), r.stdout
    else:
        assert r.returncode == 0 and alone.startswith("1 passed, 3 deselected"), r.stdout
    env["GPU_WORKERS"] = "many"
    r = subprocess.run(["bash", str(root / "tests" / "run_gpu.sh")], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 2 and "GPU_WORKERS must be a number" in r.stderr


@pytest.mark.parametrize("args,rc,says", [
    ("tests -m ray_cluster", 2, "leave -m out of PYTEST_ARGS"),  # it replaced both passes' -m: ran twice
    ("tests -mgpu", 2, "leave -m out of PYTEST_ARGS"),
    ("tests -k nomatch", 5, "no tests ran"),  # nothing selected in either pass was exit 0
])
def test_workers_refuse_a_selection_they_cannot_keep_or_that_selects_nothing(tmp_path, args, rc, says):
    pytest.importorskip("xdist")
    root = _tree(tmp_path, bad=False)
    (root / "tests" / "test_cluster.py").write_text(
        "import pytest\n\n\n@pytest.mark.ray_cluster\ndef test_alone():\n    pass\n")
    env = _env("SHARD")
    env.update(PATH=f"{root / 'bin'}:{env['PATH']}", OUT=str(root / "out"), PYTEST_ARGS=args, GPU_WORKERS="2")
    r = subprocess.run(["bash", str(root / "tests" / "run_gpu.sh")], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == rc and says in r.stdout + r.stderr, r.stdout + r.stderr
