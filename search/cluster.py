"""Ray for a search: a new local instance or a cluster joined at ``--address`` (checked in seconds
before ``ray.init``, which would retry a bad address for minutes), and what each trial asks of it."""
from __future__ import annotations

import contextlib
import math
import os
import sys
from pathlib import Path

from triaccel.errors import ConfigError, TriAccelError
from triaccel.search.space import SearchSpace


def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:
        return 0


def on_gpu(space: SearchSpace) -> bool:
    """Its trials train on a GPU: the machine has one and the space's train.device is not cpu. A CPU space
    on a GPU machine must not ask each trial for a share of a GPU it never uses: its trials would run a
    GPU's worth at a time instead of a core each, and be measured as GPU-sharing trials."""
    # the device first: a CPU space's driver then never imports torch to count GPUs it will not use
    return str(space.train.get("device", "auto")).strip().lower() != "cpu" and gpu_count() > 0


def shared_trials(space: SearchSpace) -> int:
    """How many trials run at once on one device (recorded with every measurement): as many as its share
    admits, on a GPU; on CPUs, as many as this machine's CPUs hold at cpus_per_trial each (a cluster's
    CPU nodes are judged by the driver's machine: each trial's gpu_share is then a guess)."""
    if on_gpu(space):
        return max(1, min(space.concurrency, int(math.floor(1 / space.gpus_per_trial + 1e-9))))
    fit = int(math.floor((os.cpu_count() or 1) / max(space.cpus_per_trial, 1e-9) + 1e-9))
    return max(1, min(space.concurrency, fit))


def gpu_share(space: SearchSpace, shared: int) -> float:
    """The share of the device a trial holds: its GPU fraction, or 1/shared on a CPU machine."""
    return space.gpus_per_trial if on_gpu(space) else 1.0 / max(1, shared)


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
    if on_gpu(space) and space.gpus_per_trial > (gpus := gpu_count()):
        raise ConfigError(f"{space.source}: gpus_per_trial: {space.gpus_per_trial:g} is more than this machine's "
                          f"{gpus} GPUs: no trial could start")


def check_driver_device(space: SearchSpace, address: str | None, runtime_env: dict | None = None) -> None:
    """A search at ``address`` from a machine with no GPU, on a cluster with GPUs, is refused before anything
    is written or trained: its baselines and confirm runs train in this process, on this machine's CPU, and
    its trials would ask for no GPU (``on_gpu`` is this machine's answer), so the whole search would run on
    CPUs beside idle GPUs. Joins the cluster to ask it (``init_ray``; later calls find it joined)."""
    if address in (None, "", "local") or str(space.train.get("device", "auto")).strip().lower() == "cpu" \
            or gpu_count() > 0:
        return
    import ray

    init_ray(address, runtime_env=runtime_env)
    gpus = float(ray.cluster_resources().get("GPU", 0))
    if gpus > 0:
        raise ConfigError(f"--address {address}: the cluster has {gpus:g} GPU{'s' * (gpus != 1)} and this machine "
                          f"none; a search's baselines and confirm runs train on the machine that runs it: run the "
                          f"search on a node with a GPU (or set train.device: cpu to search on CPUs)")


REACH_WAIT_S = 120  # how long each node has to answer (a new worker process on a loaded node takes seconds)
REACH_SAY_S = 10  # a wait longer than this is said (a node that died but is still listed answers never)


def check_nodes_reach(folder: Path, address: str | None, fix: str) -> None:
    """On a joined cluster, every node reaches the Tune folder ``folder`` at the same path, and can write
    there: the nodes write the trials' checkpoints there, and a node that cannot fails each trial it runs at
    its first epoch's end, after the baselines have trained. One Ray task per live node (asking for no CPU:
    a busy node answers too) reads a marker this process has just written there, and writes and removes a
    file of its own; a node that cannot is named, ``fix`` says what to do, and a node that does not answer
    in ``REACH_WAIT_S`` is not judged. The names carry a fresh token, so that checks of two drivers at once
    never meet. The caller has joined the cluster (``init_ray``) with its runtime env."""
    if address in (None, "", "local"):
        return  # a local Ray's nodes are this machine
    import secrets

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0, max_retries=0)
    def reach(marker: str, token: str, own: str) -> str:
        try:
            if Path(marker).read_text() != token:
                return "(another file)"
            Path(own).write_text(token)
            Path(own).unlink()
            return token
        except OSError as e:
            return f"({e.strerror or type(e).__name__})"

    token = secrets.token_hex(8)
    marker = folder / f".triaccel_reach-{token}"
    folder.mkdir(parents=True, exist_ok=True)  # another driver of this name, refused, may have removed it
    marker.write_text(token)
    try:
        refs = {reach.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
            str(marker), token, str(folder / f".triaccel_reach-{token}-{n['NodeID'][:12]}")): n
            for n in ray.nodes() if n.get("Alive")}
        done, left = ray.wait(list(refs), num_returns=len(refs), timeout=REACH_SAY_S)
        if left:
            print(f"triaccel: waiting up to {REACH_WAIT_S} s for {len(left)} of the cluster's {len(refs)} nodes to "
                  f"say whether they reach {folder}", file=sys.stderr, flush=True)
            done, left = ray.wait(list(refs), num_returns=len(refs), timeout=REACH_WAIT_S - REACH_SAY_S)
        bad = []
        for ref in done:
            with contextlib.suppress(Exception):  # a node lost meanwhile: not judged
                if (got := ray.get(ref)) != token:
                    n = refs[ref]
                    bad.append(f"{n['NodeManagerAddress']} (node {n['NodeID'][:12]}: {got})")
    finally:
        marker.unlink(missing_ok=True)
    if bad:
        raise ConfigError(f"{folder}: the search's Tune folder cannot be used at that path from Ray node"
                          f"{'s' * (len(bad) > 1)} {', '.join(bad)}; every node writes trials' checkpoints there: "
                          f"{fix}")


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


# the cluster address this process joined (init_ray), if it joined one: there, other jobs' work can share
# this node; a local Ray runs only this search's trials, and never beside its runs alone
_JOINED: list[str] = []
# the label Ray gives every node (2.49 and later): a placement group pinned by it reserves that node
NODE_LABEL = "ray.io/node-id"
ALONE_WAIT_NOTE_S = 10.0  # how long the reservation may take before the console says what it waits for


@contextlib.contextmanager
def this_node_alone(gpu: bool):
    """A run measured alone (a baseline, a confirm or judge run) trains in this process, on this node. On a
    joined cluster, a teammate's trial or another search's could be scheduled onto the same GPU meanwhile,
    and slow the run that every trial is scored against. For as long as the block runs, a placement group
    pinned to this node holds every GPU it offers the cluster (every CPU, for a CPU run): nothing else is
    scheduled here, and the block starts only once the work already here has ended (said on the console
    after ALONE_WAIT_NOTE_S). Yields this node's id where it holds it, else None: a local Ray or none at all
    (nothing else runs here), or a node that offers the cluster none of that resource."""
    if not _JOINED:
        yield None
        return
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from triaccel.errors import check_stop

    if not ray.is_initialized():  # shut down since (a notebook's earlier search): nothing joined now
        yield None
        return
    node = ray.get_runtime_context().get_node_id()
    info = next((n for n in ray.nodes() if n.get("NodeID") == node), {})
    kind = "GPU" if gpu else "CPU"
    amount = (info.get("Resources") or {}).get(kind, 0.0)
    if not amount or NODE_LABEL not in (info.get("Labels") or {}):
        yield None
        return
    pg = placement_group([{kind: amount}], strategy="STRICT_PACK", name=f"triaccel-alone-{os.getpid()}",
                         bundle_label_selector=[{NODE_LABEL: node}])
    try:
        if not pg.wait(timeout_seconds=ALONE_WAIT_NOTE_S):
            print(f"waiting for this node's {amount:g} {kind}{'s' if amount != 1 else ''} (Ray node {node[:12]}): "
                  f"other work on the cluster holds them, and a run measured alone trains beside none",
                  flush=True)
            while not pg.wait(timeout_seconds=1.0):
                check_stop()  # Ctrl-C and SIGTERM stop the wait as they stop a run
        yield node
    finally:
        with contextlib.suppress(Exception):  # a cluster gone meanwhile has released it
            remove_placement_group(pg)


def init_ray(address: str | None, quiet: bool = True, runtime_env: dict | None = None) -> None:
    """Ray, local or joined at ``address``; ``runtime_env`` ships the user's code to every worker
    (triaccel.userref.runtime_env_for)."""
    import logging

    import ray

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "0")  # experiment state after every event: crash-safe
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # the loggers a search keeps: tuner.new_tuner
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
        if address != "local":  # "local" starts a new instance, as no address does
            _JOINED[:] = [address]
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
