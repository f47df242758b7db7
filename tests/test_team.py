"""A service a team runs: one MLflow server on PostgreSQL for everyone, and a Ray cluster of two nodes.

Real parts throughout: a real PostgreSQL (initdb into a temporary folder, started on a free port),
a real `mlflow server` subprocess on it with a shared artifact folder, real searches through the
CLI (real local Ray, real Optuna, real training on the digits set), and a real two-node Ray cluster
(`ray start --head` and a second `ray start --address`).

PostgreSQL is found on PATH or in /usr/lib/postgresql/*/bin (Debian's packages; `.ci/run` installs
them). Without it, or without psycopg2, these tests skip with the reason, except under CI=true,
where they fail: CI must run them.
"""
import contextlib
import glob
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from _harness import DIGITS_SPACE, child_env, free_port, searcher_trials

pytestmark = pytest.mark.slow

# the smallest search that exercises the service: one baseline, a few 1-2 epoch trials of the digits
# CNN on the CPU; a wide margin keeps every trial feasible (the margin is tested elsewhere)
SPACE = dict(DIGITS_SPACE, name="team", concurrency=1, seed=7,
             train=dict(DIGITS_SPACE["train"], epochs=1, optim={"lr": 0.05, "warmup_epochs": 0.5}))


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _missing(reason: str):
    """CI must run these tests: there a missing service fails them; elsewhere they skip with the reason."""
    if _in_ci():
        pytest.fail(f"{reason} (CI=true: .ci/run installs it)")
    pytest.skip(reason)


def _wait_http(url: str, proc, timeout: float, log: Path | None = None):
    """Until ``url`` answers 200 (a start-up wait, not a timing check: a loaded 2-core CI machine is slow)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):
            if urllib.request.urlopen(url, timeout=2).status == 200:
                return
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            pytest.fail(f"{url} did not come up (exit {proc.poll()}): {tail}")
        time.sleep(0.5)


def env_for(uri: str | None, **extra) -> dict:
    """The environment of a user's search: MLFLOW_TRACKING_URI names the team's server; one torch thread
    (on a shared 2-core machine a busy neighbour stalls a second thread a hundredfold)."""
    env = child_env("MLFLOW_TRACKING_URI", "TRIACCEL_TUNE_DIR")
    env["OMP_NUM_THREADS"] = "1"
    if uri:
        env["MLFLOW_TRACKING_URI"] = uri
    env.update(extra)
    return env


def cli(*args, cwd, env, timeout=900):
    return subprocess.run([sys.executable, "-m", "triaccel.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def no_traceback(text: str) -> bool:
    return "Traceback (most recent call last)" not in text


# --------------------------------------------------------------------------- PostgreSQL
def postgres_bin() -> Path | None:
    """The folder of pg_ctl/initdb/postgres: PATH first, else Debian's /usr/lib/postgresql/<version>/bin
    (the newest), which is not on PATH."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb", path=str(Path(found).resolve().parent)):
        return Path(found).resolve().parent
    def version(p):
        m = re.search(r"/postgresql/(\d+)", p)
        return int(m.group(1)) if m else 0
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        if all((Path(d) / b).exists() for b in ("pg_ctl", "initdb", "postgres")):
            return Path(d)
    return None


class Postgres:
    """A PostgreSQL cluster in a temporary folder, on a free loopback port, trust auth (local tests only).

    postgres refuses to run as root: as root it runs as the `postgres` user (Debian's packages create
    it), else as `nobody`, through runuser; the folder is given to that user."""

    def __init__(self, bindir: Path):
        self.bindir = bindir
        self.port = free_port()
        self.user = "triaccel"
        self.root = Path(tempfile.mkdtemp(prefix="triaccel-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            owner = next((u for u in ("postgres", "nobody") if _has_user(u)), None)
            if owner is None or not shutil.which("runuser"):
                _missing("running as root with neither a `postgres` nor a `nobody` user (or no runuser) to run PostgreSQL as")
            pw = pwd.getpwnam(owner)
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
            self.as_user = ["runuser", "-u", owner, "--"]

    def _run(self, *cmd, timeout=120):
        r = subprocess.run([*self.as_user, *cmd], capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise AssertionError(f"{cmd[0]} failed ({r.returncode}): {r.stdout[-1000:]}{r.stderr[-2000:]}{log}")
        return r

    def start(self):
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", self.user, "--auth=trust", "-E", "UTF8",
                  "--no-instructions")
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "120", "-o",
                  f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=200", "start",
                  timeout=180)

    def create_db(self, name: str) -> str:
        """A new database; its SQLAlchemy URI as `mlflow server --backend-store-uri` takes it."""
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user=self.user, dbname="postgres")
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
        return f"postgresql+psycopg2://{self.user}@127.0.0.1:{self.port}/{name}"

    def query(self, db: str, sql: str):
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user=self.user, dbname=db)
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                return cur.fetchall()
        finally:
            conn.close()

    def stop(self):
        with contextlib.suppress(Exception):
            subprocess.run([*self.as_user, str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w",
                            "stop"], capture_output=True, timeout=120)
        shutil.rmtree(self.root, ignore_errors=True)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


@pytest.fixture(scope="module")
def postgres():
    bindir = postgres_bin()
    if bindir is None:
        _missing("PostgreSQL's binaries (pg_ctl, initdb, postgres) are neither on PATH nor in /usr/lib/postgresql/*/bin")
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        _missing("psycopg2 is not installed (pip install -e '.[team]')")
    pg = Postgres(bindir)
    try:
        pg.start()
        yield pg
    finally:
        pg.stop()


# as docs/team.md runs it: no GenAI job runner (seven huey worker processes a tracking server never uses)
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


class MlflowServer:
    """`mlflow server` as docs/team.md runs it: PostgreSQL backend, a shared artifact folder, proxied artifacts."""

    def __init__(self, backend_uri: str, artifacts: Path, logdir: Path):
        self.backend_uri = backend_uri
        self.artifacts = artifacts
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.logdir = logdir
        self.proc = None
        self.starts = 0

    def start(self):
        self.starts += 1
        self.log = self.logdir / f"mlflow-server-{self.starts}.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", self.backend_uri,
                 "--artifacts-destination", str(self.artifacts), "--host", "127.0.0.1", "--port", str(self.port),
                 "--workers", "1"], stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}, **SERVER_ENV})
        _wait_http(self.uri + "/health", self.proc, 300, self.log)

    def stop(self, sig=signal.SIGTERM):
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)  # the server and its uvicorn workers
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=60)
        _wait_port_free(self.port)
        self.proc = None

    def logs(self) -> str:
        return "".join(p.read_text() for p in sorted(self.logdir.glob("mlflow-server-*.log")))


def _wait_port_free(port, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return
        time.sleep(0.2)


@contextlib.contextmanager
def mlflow_server(postgres, db: str, tmp: Path):
    artifacts = tmp / "shared-artifacts"
    artifacts.mkdir()
    server = MlflowServer(postgres.create_db(db), artifacts, tmp)
    try:
        server.start()
        yield server
    finally:
        server.stop()


def runs_of(uri: str, name: str, role: str | None = None):
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    exp = c.get_experiment_by_name("triaccel-search")
    if exp is None:
        return c, []
    f = f"tags.`triaccel.search` = '{name}'" + (f" and tags.`triaccel.role` = '{role}'" if role else "")
    return c, c.search_runs([exp.experiment_id], filter_string=f, max_results=1000)


def assert_complete(uri: str, name: str, trials: int, epochs: int):
    """Every trial once, finished, each epoch logged once; one parent; one baseline."""
    c, runs = runs_of(uri, name, "trial")
    tids = [r.data.tags["triaccel.trial_id"] for r in runs]
    assert len(runs) == trials and len(set(tids)) == trials, (name, tids)
    assert all(r.info.status == "FINISHED" for r in runs), (name, [r.info.status for r in runs])
    for r in runs:
        steps = [m.step for m in c.get_metric_history(r.info.run_id, "val_acc")]
        assert sorted(steps) == list(range(1, epochs + 1)), (name, r.data.tags["triaccel.trial_id"], steps)
    _, parents = runs_of(uri, name, "parent")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED", (name, [p.info.status for p in parents])
    _, baselines = runs_of(uri, name, "baseline")
    assert len(baselines) == 1, (name, len(baselines))
    return runs


# --------------------------------------------------------------------------- one server, two searches
@pytest.fixture(scope="module")
def team_server(postgres, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("team")
    with mlflow_server(postgres, "mlflow_team", tmp) as server:
        yield server, tmp


@pytest.fixture(scope="module")
def two_searches(team_server):
    """Two team members start a search at the same moment, each from their own folder (their own Tune
    state), both logging to the team's server: the server's database was migrated once, at its start."""
    server, tmp = team_server
    procs = {}
    for name in ("alice", "bob"):
        d = tmp / name
        d.mkdir()
        (d / "space.yaml").write_text(yaml.safe_dump(dict(SPACE, name=name)))
        log = open(d / "search.log", "w")
        procs[name] = (subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml",
                                         "--name", name, "--confirm", "0"], cwd=d, stdout=log,
                                        stderr=subprocess.STDOUT, env=env_for(server.uri)), log, d)
    for name, (p, log, d) in procs.items():
        try:
            p.wait(timeout=900)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
    out = {name: (p.returncode, (d / "search.log").read_text()) for name, (p, _, d) in procs.items()}
    return server, tmp, out


def test_two_searches_at_once_on_one_server_lose_and_duplicate_nothing(two_searches, postgres):
    server, tmp, out = two_searches
    for name, (rc, text) in out.items():
        assert rc == 0 and no_traceback(text), (name, rc, text[-3000:])
        assert "View run" not in text, text[-2000:]  # one line per trial, not MLflow's links for each run
    runs = {name: assert_complete(server.uri, name, SPACE["trials"], SPACE["train"]["epochs"]) for name in out}
    # nothing but these two searches' runs, each in its own search: no run lost to the other, none twice
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=server.uri)
    exps = [e for e in c.search_experiments() if e.name == "triaccel-search"]
    assert len(exps) == 1  # both created it at once: one experiment, not a failure in either
    every = c.search_runs([exps[0].experiment_id], max_results=1000)
    assert len(every) == 2 * (1 + 1 + SPACE["trials"])  # parent, baseline, trials of each
    assert len({r.info.run_id for r in every}) == len(every)
    mine = {name: {r.info.run_id for r in rs} for name, rs in runs.items()}
    assert not (mine["alice"] & mine["bob"])
    # the database: migrated to one schema version, by the server alone
    assert len(postgres.query("mlflow_team", "SELECT version_num FROM alembic_version")) == 1
    assert no_traceback(server.logs()), server.logs()[-3000:]
    # artifacts went through the server into the shared folder (the parent's summary plot, the trials' files)
    assert any(p.is_file() for p in server.artifacts.rglob("*")), "no artifact reached the shared folder"


def test_the_ui_reads_both_searches(two_searches):
    server, _, out = two_searches
    base = server.uri
    page = urllib.request.urlopen(base + "/", timeout=30)
    assert page.status == 200 and b"<html" in page.read().lower()
    # what the UI's runs table asks the server (its ajax-api), for each search
    exp = json.loads(urllib.request.urlopen(
        base + "/ajax-api/2.0/mlflow/experiments/get-by-name?experiment_name=triaccel-search",
        timeout=30).read())["experiment"]
    for name in out:
        req = urllib.request.Request(base + "/ajax-api/2.0/mlflow/runs/search", method="POST",
                                     data=json.dumps({"experiment_ids": [exp["experiment_id"]],
                                                      "filter": f"tags.`triaccel.search` = '{name}'",
                                                      "max_results": 100}).encode(),
                                     headers={"Content-Type": "application/json"})
        runs = json.loads(urllib.request.urlopen(req, timeout=30).read())["runs"]
        roles = sorted(next(t["value"] for t in r["data"]["tags"] if t["key"] == "triaccel.role") for r in runs)
        assert roles == sorted(["parent", "baseline"] + ["trial"] * SPACE["trials"]), (name, roles)
        # a trial's metric history, as the UI's charts read it
        trial = next(r for r in runs if any(t["key"] == "triaccel.role" and t["value"] == "trial"
                                            for t in r["data"]["tags"]))
        hist = json.loads(urllib.request.urlopen(
            base + f"/ajax-api/2.0/mlflow/metrics/get-history?run_id={trial['info']['run_id']}&metric_key=val_acc",
            timeout=30).read())["metrics"]
        assert [m["step"] for m in hist] == list(range(1, SPACE["train"]["epochs"] + 1))


# --------------------------------------------------------------------------- a PostgreSQL store used directly
def test_first_clients_of_a_new_postgres_store_do_not_race_and_a_bad_one_is_one_line(postgres, tmp_path):
    """Without a server (MLFLOW_TRACKING_URI=postgresql+psycopg2://...) every process is a first client of the
    database: three at once on a new one all work (MLflow alone: one fails with a duplicate key while both
    create the tables), and the schema is migrated once. A database that cannot be reached is one line."""
    uri = postgres.create_db("mlflow_direct")
    code = "from triaccel.tracking import client; client(%r).search_experiments(); print('usable')" % uri
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=env_for(None)) for _ in range(3)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 and "usable" in o and no_traceback(o) for p, o in zip(procs, outs)), outs
    assert len(postgres.query("mlflow_direct", "SELECT version_num FROM alembic_version")) == 1
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    bad = f"postgresql+psycopg2://{postgres.user}@127.0.0.1:{free_port()}/mlflow"
    r = cli("search", "--space", "space.yaml", cwd=tmp_path, env=env_for(bad), timeout=300)
    said = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode != 0 and len(said) == 1 and said[0].startswith("triaccel: error: MLFLOW_TRACKING_URI"), said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.yaml"]  # nothing written


# --------------------------------------------------------------------------- the server restarted mid-search
def test_a_server_restart_mid_search_ends_in_one_line_or_rides_through_and_resume_finishes(postgres, tmp_path):
    space = dict(SPACE, name="restart", trials=3, train=dict(SPACE["train"], epochs=2))  # 2 at once, 1 to come
    with mlflow_server(postgres, "mlflow_restart", tmp_path) as server:
        (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
        log = tmp_path / "search.log"
        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml",
                                     "--name", "rs", "--confirm", "0"], cwd=tmp_path, stdout=out,
                                    stderr=subprocess.STDOUT, env=env_for(server.uri), start_new_session=True)
        try:
            deadline = time.monotonic() + 900
            while time.monotonic() < deadline and proc.poll() is None:
                time.sleep(1)
                _, runs = runs_of(server.uri, "rs", "trial")
                if any(r.info.status == "FINISHED" for r in runs):
                    break  # mid-search: a trial done, others to come
            assert proc.poll() is None, f"search ended before the restart: {log.read_text()[-3000:]}"
            server.stop()
            time.sleep(5)  # down long enough for the search to notice
            server.start()
            proc.wait(timeout=900)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        text = log.read_text()
        assert no_traceback(text), text[-4000:]
        if proc.returncode != 0:
            # it ended in one line naming the server and the way on (stderr is in the log)
            errors = [ln for ln in text.splitlines() if ln.startswith("triaccel: ")]
            assert errors and "resume" in text, text[-3000:]
        r = cli("resume", "rs", "--confirm", "0", cwd=tmp_path, env=env_for(server.uri))
        assert r.returncode == 0 and no_traceback(r.stdout + r.stderr), (proc.returncode, text[-2000:],
                                                                       r.stdout[-2000:], r.stderr[-3000:])
        assert_complete(server.uri, "rs", space["trials"], space["train"]["epochs"])
        assert no_traceback(server.logs()), server.logs()[-3000:]


# --------------------------------------------------------------------------- a two-node Ray cluster
def _ray_cmd() -> list[str]:
    """The `ray` of this interpreter: its nodes start their workers with the interpreter that ran `ray start`,
    and only this one imports this triaccel (a `ray` on PATH, a pyenv shim, runs another Python)."""
    own = Path(sys.executable).parent / "ray"
    return [str(own)] if own.exists() else [sys.executable, "-c", "from ray.scripts.scripts import main; main()"]


def _mentions(proc: Path, text: bytes) -> bool:
    """Whether a process names ``text`` in its command line or holds a file under it open (Ray's agents
    retitle themselves, ray::DashboardAgent, but keep their log files in the session folder open)."""
    if text in (proc / "cmdline").read_bytes():
        return True
    for fd in (proc / "fd").iterdir():
        with contextlib.suppress(OSError):
            if text in os.readlink(fd).encode():
                return True
    return False


def _kill_cluster(temp: Path, groups: list[int], timeout=60):
    """SIGKILL this cluster's processes: the process groups its `ray start`s began, and any process that
    names its temp folder, until none is left. Not `ray stop --force`: that stops every Ray of the machine,
    other tests' and other users' too."""
    for g in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(g, signal.SIGKILL)
    text = str(temp).encode()

    def matching():
        found = []
        for proc in Path("/proc").glob("[0-9]*"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                pid = int(proc.name)
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp
                if pid != os.getpid() and fields[0] != "Z" and (int(fields[2]) in groups or _mentions(proc, text)):
                    found.append(pid)
        return found

    deadline = time.monotonic() + timeout
    while (pids := matching()) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
    assert not matching(), f"Ray processes of {temp} outlived SIGKILL: {matching()}"


class TwoNodeCluster:
    """`ray start --head` and a second `ray start --address` on this host: two raylets, one CPU each, each
    with its own custom resource (node_a, node_b) so the test can tell them apart."""

    def __init__(self):
        # a short folder: Ray's socket paths under it must stay below the OS's 107 characters
        self.temp = Path(tempfile.mkdtemp(prefix="tri-ray-", dir="/tmp"))
        self.port = free_port()
        self.address = None
        self.env = {k: v for k, v in child_env().items() if not k.startswith("RAY_AUTH")}  # its workers inherit it
        self.groups: list[int] = []

    def _ray(self, *args, timeout=180, hide: Path | None = None, read_only: Path | None = None):
        # its own process group, which the daemons it leaves behind keep: stop() ends them by it. ``hide``: the
        # node's processes run in a mount namespace of their own, an empty tmpfs over that folder (a node whose
        # disk lacks a folder the others share); ``read_only``: that folder bound read-only there
        wrap = []
        if hide or read_only:
            mount = ('mount -t tmpfs tmpfs "$0"' if hide else 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0"')
            wrap = ["unshare", "-m", "sh", "-c", f'{mount} && exec "$@"', str(hide or read_only)]
        p = subprocess.Popen([*wrap, *_ray_cmd(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=self.env, start_new_session=True)
        self.groups.append(p.pid)
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, (args, out[-2000:], err[-3000:])
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)

    def start(self, hide: Path | None = None, read_only: Path | None = None, head_cpus: int = 1,
              second: bool = True):
        """``hide``: node_b without that folder; ``read_only``: a third node, node_c, that has it read-only;
        ``second=False``: the head alone (``add_node`` adds one later), with ``head_cpus`` CPUs."""
        # a token on the machine (any earlier local ray.init writes one): `ray start` then turns token auth
        # on, as it will for a user, and the search joins through it
        subprocess.run([*_ray_cmd(), "get-auth-token", "--generate"], capture_output=True, timeout=120, env=self.env)
        r = self._ray("start", "--head", f"--port={self.port}", f"--num-cpus={head_cpus}",
                      "--resources={\"node_a\": 1}", "--include-dashboard=false", f"--temp-dir={self.temp}",
                      "--disable-usage-stats")
        printed = re.search(r"--address='([^']+)'", r.stdout + r.stderr)
        assert printed, (r.stdout + r.stderr)[-2000:]
        self.address = printed.group(1)
        if (Path.home() / ".ray" / "auth_token").is_file():
            self.env["RAY_AUTH_MODE"] = "token"  # the head turned token auth on: a joining node sends the token
        if second:
            self.add_node("node_b", hide=hide)
        if read_only:
            self.add_node("node_c", read_only=read_only)

    def add_node(self, resource: str, hide: Path | None = None, read_only: Path | None = None):
        """One more node of one CPU, told apart by the custom resource ``resource``."""
        self._ray("start", f"--address={self.address}", "--num-cpus=1", f"--resources={{\"{resource}\": 1}}",
                  f"--temp-dir={self.temp}", "--disable-usage-stats", hide=hide, read_only=read_only)

    def nodes(self) -> dict:
        """{node id: its resources} of the live nodes, as Ray's GCS lists them."""
        env = dict(self.env)
        if (Path.home() / ".ray" / "auth_token").is_file():
            env["RAY_AUTH_MODE"] = "token"
        code = ("import json, ray; ray.init(address=%r, include_dashboard=False, logging_level='ERROR');"
                "print('NODES=' + json.dumps({n['NodeID']: n['Resources'] for n in ray.nodes() if n['Alive']}))"
                % self.address)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith("NODES=")), None)
        assert line, (r.stdout[-2000:], r.stderr[-3000:])
        return json.loads(line[len("NODES="):])

    def stop(self):
        _kill_cluster(self.temp, self.groups)
        shutil.rmtree(self.temp, ignore_errors=True)


@pytest.fixture
def two_nodes():
    cluster = TwoNodeCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _can_hide() -> bool:
    """Whether this machine lets a process mount a folder of its own (``unshare -m``: CAP_SYS_ADMIN)."""
    if not shutil.which("unshare"):
        return False
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run(["unshare", "-m", "mount", "-t", "tmpfs", "tmpfs", d], capture_output=True, timeout=60)
    return r.returncode == 0


def search_on(address: str, name: str, cwd: Path, log: Path) -> subprocess.Popen:
    """``triaccel search`` of cwd's space.yaml on the cluster at ``address`` (no confirm runs), in its own process
    group, printing into ``log``: a file, not a pipe nobody reads (a full pipe would stall the driver)."""
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "triaccel.cli", "search", "--space", "space.yaml", "--name",
                                 name, "--confirm", "0", "--address", address], cwd=cwd, stdout=out,
                                stderr=subprocess.STDOUT, env=env_for(None), start_new_session=True)


def wait_said(log: Path, proc: subprocess.Popen, text: str, timeout: float = 300) -> str:
    """The log once it holds ``text``, or the process has ended, or ``timeout`` s have passed (a start-up wait)."""
    deadline = time.monotonic() + timeout
    while text not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    return log.read_text()


@pytest.mark.ray_cluster
def test_a_node_that_cannot_reach_the_tune_folder_is_refused_before_the_baselines(tmp_path):
    """A cluster node without the folder the others share (its own disk there) failed every trial it ran at
    its first epoch's end, after the baselines had trained; so did one that has it read-only. Now the search
    is refused before anything is written or trained, naming both nodes; the nodes that do reach the folder
    pass the same check in the two-node test below."""
    if not _can_hide():
        pytest.skip("this machine does not let a process mount a folder of its own (unshare -m)")
    (tmp_path / "mlruns").mkdir()
    cluster = TwoNodeCluster()
    try:
        cluster.start(hide=tmp_path / "mlruns", read_only=tmp_path / "mlruns")
        nodes = cluster.nodes()
        node_b, node_c = (next(i for i, res in nodes.items() if key in res) for key in ("node_b", "node_c"))
        (tmp_path / "space.yaml").write_text(yaml.safe_dump(dict(DIGITS_SPACE, trials=1)))  # a baseline first
        r = cli("search", "--space", "space.yaml", "--name", "far", "--address", cluster.address, cwd=tmp_path,
                env=env_for(None))
    finally:
        cluster.stop()
    last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    assert r.returncode == 2 and last.startswith(
        f"triaccel: error: {tmp_path / 'mlruns' / 'tune' / 'far'}: the search's Tune folder cannot be used at that "
        f"path from Ray nodes ") and last.endswith("(--storage on a shared disk)"), (r.stdout[-2000:], r.stderr[-3000:])
    assert f"(node {node_b[:12]}: (No such file or directory))" in last, last
    assert f"(node {node_c[:12]}: (Read-only file system))" in last, last
    assert last.count("(node ") == 2, last  # the head reaches it
    assert sorted(p.name for p in (tmp_path / "mlruns").iterdir()) == [], "the refused search left files behind"


@pytest.mark.ray_cluster
def test_a_node_that_joins_after_the_check_without_the_folder_fails_its_trial_before_it_trains(tmp_path):
    """The search checks the nodes alive as it starts (the test above). A node that joined later without the
    shared folder ran trials that failed only at their first checkpoint, an epoch of training later, in Ray's
    many-line storage message. Now such a trial fails as it starts, in one line naming its node, and trains
    nothing; the search goes on as it does past any failed trial."""
    if not _can_hide():
        pytest.skip("this machine does not let a process mount a folder of its own (unshare -m)")
    (tmp_path / "mlruns").mkdir()
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(dict(SPACE, name="late", trials=1, concurrency=1)))
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    log = tmp_path / "search.log"
    cluster = TwoNodeCluster()
    proc = None
    try:
        cluster.start(head_cpus=0, second=False)  # no trial can run on the head: the trial waits for a node
        proc = search_on(cluster.address, "late", tmp_path, log)
        said = wait_said(log, proc, "triaccel search 'late':")  # printed after the check of every node
        assert proc.poll() is None and "triaccel search 'late':" in said, said[-3000:]
        cluster.add_node("node_b", hide=tmp_path / "mlruns")
        node_b = next(i for i, res in cluster.nodes().items() if "node_b" in res)
        rc = proc.wait(timeout=600)
    finally:
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        cluster.stop()
    said = log.read_text()
    folder = tmp_path / "mlruns" / "tune" / "late"
    line = next((ln for ln in said.splitlines() if " FAILED " in ln), "")
    assert line.split(" FAILED ", 1)[-1].startswith(
        f"StorageError: Ray node {node_b[:12]} at ") and f"does not reach the search's Tune folder {folder} " in line, \
        said[-3000:]
    assert rc == 1 and no_traceback(said), (rc, said[-3000:])  # a failed trial ends no search; all failed: 1
    assert "nothing feasible beat the baseline: every trial failed" in said, said[-3000:]
    _, runs = runs_of(uri, "late", "trial")
    assert len(runs) == 1 and runs[0].info.status == "FAILED", [r.info.status for r in runs]
    # its run says where it failed: the node could write no file naming itself to the storage it lacks
    assert runs[0].data.tags.get("failure_reason", "").startswith(f"StorageError: Ray node {node_b[:12]} at "), \
        runs[0].data.tags
    assert "val_acc" not in runs[0].data.metrics and "epoch" not in runs[0].data.metrics, runs[0].data.metrics
    assert not list(folder.glob("*/checkpoint_*")), "the trial on the late node saved a checkpoint"


@pytest.mark.ray_cluster
def test_a_search_on_two_nodes_uses_both_and_resumes_after_its_driver_is_killed(two_nodes, tmp_path):
    trials, epochs = 6, 2
    space = dict(SPACE, name="cluster", trials=trials, concurrency=2, train=dict(SPACE["train"], epochs=epochs))
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    # refused by its store after the nodes' check made its Tune folder: that folder went too (a teammate's
    # walk found an empty mlruns/tune/NAME after every such refusal, where the doc says nothing is left)
    dead = f"http://127.0.0.1:{free_port()}"
    r = cli("search", "--space", "space.yaml", "--name", "refused", "--address", two_nodes.address, cwd=tmp_path,
            env=env_for(dead))
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith(
        f"triaccel: error: MLFLOW_TRACKING_URI: no MLflow server answers at {dead}"), r.stderr[-2000:]
    assert not (tmp_path / "mlruns").exists(), sorted(str(p) for p in (tmp_path / "mlruns").rglob("*"))
    log = tmp_path / "search.log"
    proc = search_on(two_nodes.address, "c", tmp_path, log)
    try:
        deadline = time.monotonic() + 900
        finished = []
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(1)
            if "triaccel search 'c':" not in log.read_text():
                continue  # the driver prints it once it has created the store: opening it sooner races that
            _, runs = runs_of(uri, "c", "trial")
            finished = [r for r in runs if r.info.status == "FINISHED"]
            if len(finished) >= 2:
                break
        assert proc.poll() is None, f"search ended before the kill ({proc.returncode}): {log.read_text()[-3000:]}"
        assert len(finished) >= 2, "search too slow to reach two finished trials"
        os.killpg(proc.pid, signal.SIGKILL)  # the driver alone: the cluster, and the trials on it, are not its
        proc.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before_end = {r.info.run_id: r.info.end_time for r in finished}
    time.sleep(5)  # the cluster notices its driver gone and ends that job's trial actors

    r = cli("resume", "c", "--address", two_nodes.address, cwd=tmp_path, env=env_for(None))
    assert r.returncode == 0 and no_traceback(r.stdout + r.stderr), (r.stdout[-2000:], r.stderr[-3000:])
    runs = assert_complete(uri, "c", trials, epochs)
    for x in runs:
        if x.info.run_id in before_end:  # finished before the kill: not re-run
            assert x.info.end_time == before_end[x.info.run_id]
    import optuna

    study = searcher_trials(tmp_path / "mlruns" / "tune" / "c")
    complete = [t for t in study if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == trials and len(study) == trials  # Optuna's history: every trial once
    # the trials ran on both nodes: each run names its node, and the two nodes are the cluster's two
    nodes = two_nodes.nodes()
    assert len(nodes) == 2, nodes
    where = [x.data.tags.get("triaccel.ray_node_id") for x in runs]
    assert all(where) and set(where) <= set(nodes), (where, nodes)
    kinds = {next(k for k in nodes[n] if k in ("node_a", "node_b")) for n in where}
    assert kinds == {"node_a", "node_b"}, (where, nodes)


# a teammate's job on the cluster: one actor holding the CPU of each node until the file argv[2] exists
TEAMMATE = """
import os, sys, time
import ray
ray.init(address=sys.argv[1], include_dashboard=False, logging_level="ERROR")
@ray.remote(num_cpus=1)
class Busy:
    def ready(self):
        return True
held = [Busy.options(resources={k: 1}).remote() for k in ("node_a", "node_b")]
ray.get([h.ready.remote() for h in held])
print("HELD", flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.2)
"""


@pytest.mark.ray_cluster
def test_a_baseline_on_a_cluster_waits_for_a_teammates_work_on_its_node_and_holds_the_node(two_nodes, tmp_path):
    """The baselines train in the driver, on its Ray node. A teammate's work on that node (here: every CPU
    of both nodes) would share the device with the run every trial is scored against; the baseline now
    waits, saying so, until that work ends, and holds the node (its MLflow run names it) while it trains."""
    env = dict(two_nodes.env)
    if (Path.home() / ".ray" / "auth_token").is_file():
        env["RAY_AUTH_MODE"] = "token"
    release = tmp_path / "release"
    mate = subprocess.Popen([sys.executable, "-c", TEAMMATE, two_nodes.address, str(release)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    space = dict(SPACE, name="held", trials=1, concurrency=1)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    log = tmp_path / "search.log"
    proc = None
    try:
        assert mate.stdout.readline().strip() == "HELD", mate.stdout.read()[-2000:]
        proc = search_on(two_nodes.address, "h", tmp_path, log)
        said = wait_said(log, proc, "waiting for this node's")
        assert "waiting for this node's 1 CPU (Ray node " in said, said[-3000:]
        assert runs_of(uri, "h", "baseline")[1] == [], "a baseline started beside the teammate's work"
        time.sleep(3)
        assert proc.poll() is None and runs_of(uri, "h", "baseline")[1] == [], log.read_text()[-3000:]
        released = time.time()
        release.touch()
        mate.wait(timeout=60)
        assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]
    finally:
        release.touch()
        for p in (proc, mate):
            if p is not None and p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert no_traceback(log.read_text()), log.read_text()[-3000:]
    _, baselines = runs_of(uri, "h", "baseline")
    assert len(baselines) == 1 and baselines[0].info.status == "FINISHED", baselines
    assert baselines[0].info.start_time >= released * 1000, (baselines[0].info.start_time, released)
    assert baselines[0].data.tags.get("triaccel.alone_on_node") in two_nodes.nodes(), baselines[0].data.tags
    assert_complete(uri, "h", 1, 1)


# --------------------------------------------------------------------------- --storage URIs
def test_storage_takes_a_uri_pyarrow_opens_and_refuses_others_in_one_line(tmp_path):
    """A search with its state at a local:// URI (pyarrow's other name for the local file system), listed
    from another folder through file://; an unknown scheme and pyarrow's in-memory mock:// are one line
    each, exit non-zero, nothing written."""
    work, other, state = tmp_path / "w", tmp_path / "o", tmp_path / "state"
    work.mkdir()
    other.mkdir()
    space = dict(SPACE, name="st", trials=1, concurrency=1)
    (work / "space.yaml").write_text(yaml.safe_dump(space))
    store = f"sqlite:///{tmp_path}/mlflow.db"
    for uri, why in (("nosuch://x", "not a file system pyarrow can open"), ("mock:///tune", "mount it")):
        r = cli("search", "--space", "space.yaml", "--name", "st", "--storage", uri, cwd=work, env=env_for(store))
        said = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode != 0 and len(said) == 1 and no_traceback(r.stderr), (uri, r.stderr[-2000:])
        assert said[0].startswith(f"triaccel: error: --storage {uri}: ") and why in said[0], said
        assert sorted(p.name for p in work.iterdir()) == ["space.yaml"] and not state.exists()  # nothing written
        assert not Path(f"{tmp_path}/mlflow.db").exists()
    r = cli("search", "--space", "space.yaml", "--name", "st", "--confirm", "0", "--storage", f"local://{state}",
            cwd=work, env=env_for(store))
    assert r.returncode == 0, r.stderr[-3000:]
    assert (state / "st").is_dir() and not (work / "mlruns" / "tune").exists()  # the state went to the URI
    r = cli("searches", "--storage", f"file://{state}", cwd=other, env=env_for(store))
    assert r.returncode == 0 and "st" in {ln.split()[0] for ln in r.stdout.splitlines()[1:] if ln.strip()}, r.stdout
    assert_complete(store, "st", 1, SPACE["train"]["epochs"])
