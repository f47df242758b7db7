"""Ray for a search (search/cluster.py): an address where no cluster answers or something else does,
--address auto without a cluster, a local Ray that cannot start. Real subprocesses, a real sqlite
MLflow store."""
import contextlib
import socket
import subprocess
import sys
import time

import pytest
import yaml

from _harness import SPACE, child_env, cli, free_port, runs, user_env


@pytest.mark.slow
@pytest.mark.parametrize("address,why", [
    ("127.0.0.1:{port}", "cannot join a Ray cluster there (nothing answers on 127.0.0.1:{port}: Connection refused)"),
    ("ray://127.0.0.1:{port}", "cannot join a Ray cluster there (nothing answers on 127.0.0.1:{port}: "
                               "Connection refused)"),
    ("headnode", "expected HOST:PORT, ray://HOST:PORT or auto"),
])
def test_address_where_no_cluster_answers_fails_in_seconds_and_writes_nothing(tmp_path, address, why):
    port = free_port()
    address, why = address.format(port=port), why.format(port=port)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    t0 = time.monotonic()
    r = cli("search", "--space", "space.yaml", "--address", address, cwd=tmp_path, timeout=600)
    # ray.init alone retried such an address for minutes (over 200 s); 90 s leaves room for the
    # imports of a process started beside two other test processes on a loaded 2-core machine
    assert time.monotonic() - t0 < 90
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [f"triaccel: error: --address {address}: {why}"]
    assert not (tmp_path / "mlruns").exists()  # no search state: the same command works once the cluster runs


@pytest.mark.slow
def test_address_where_something_else_answers_fails_in_seconds(tmp_path):
    """A port that accepts connections but is not Ray (here a real HTTP server): ray.init retried it
    for minutes; the search says so in one line, before anything is written."""
    port = free_port()
    srv = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "0.0.0.0"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            time.sleep(0.2)
        (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
        t0 = time.monotonic()
        r = cli("search", "--space", "space.yaml", "--address", f"127.0.0.1:{port}", cwd=tmp_path, timeout=600)
        assert time.monotonic() - t0 < 90  # as above: ray.init retried for minutes
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert r.stderr.strip().splitlines() == [
            f"triaccel: error: --address 127.0.0.1:{port}: cannot join a Ray cluster there (something answers on "
            f"127.0.0.1:{port}, but not Ray: no gRPC server)"]
        assert not (tmp_path / "mlruns").exists()
    finally:
        srv.kill()
        srv.wait()


@pytest.mark.slow
@pytest.mark.ray_cluster
def test_address_auto_without_a_cluster_fails_before_the_baselines(tmp_path):
    """--address auto where no `ray start` cluster runs: one line, before the baselines train (it used
    to fail only after them, in ray.init)."""
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    env = child_env("RAY_ADDRESS")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--address", "auto"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert time.monotonic() - t0 < 90  # as above: ray.init retried for minutes
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    (line,) = r.stderr.strip().splitlines()
    # no cluster at all, or a stale record of one that has stopped: either way, said at once
    assert line.startswith("triaccel: error: --address auto") and (
        "no running Ray cluster found" in line or "nothing answers" in line), line
    assert not (tmp_path / "mlruns").exists()  # no baseline ran, no state written


@pytest.mark.slow
def test_ray_that_cannot_start_is_one_line_and_leaves_no_run_running(tmp_path):
    """Under `ulimit -f 2000` Ray cannot start: Ray's raw traceback, exit 1, the parent run left RUNNING."""
    space = dict(SPACE, baseline={"batch_sizes": [64]})
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    r = subprocess.run(["bash", "-c", f"ulimit -f 2000; exec {sys.executable} -m triaccel.cli search --space "
                                      f"space.yaml --name u"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=600, env=user_env())
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("triaccel: error: Ray could not start on this machine ("), line
    _, all_runs = runs(tmp_path, "u")
    assert all_runs and not [x for x in all_runs if x.info.status == "RUNNING"]
