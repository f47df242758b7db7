"""One driver per search: an exclusive lock on ``driver.lock`` in the search's Tune folder.

``search``, ``resume`` and ``extend`` hold it from before they write anything until the process ends; a second
driver of the same search (a ``resume`` while the search runs, two ``resume``s at once) is refused
in one line naming the holder. The lock is ``fcntl.flock``: the kernel releases it when the
holding process dies, however it dies (kill -9 included), so a dead driver never leaves it held;
the pid, host and start time written into the file only name the holder in the message, they are
never what decides. The Tune folder may be on storage shared by several machines: on Linux NFS
(v3 with lockd, v4) flock is emulated with POSIX byte-range locks and so holds across machines; on
a file system without working locks (some FUSE mounts, NFS mounted ``nolock``) it only guards one
machine. The file's descriptor is close-on-exec, so Ray's processes started by the driver do not
inherit (and keep) the lock.
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
from pathlib import Path

from triaccel.errors import ConfigError

LOCK_FILE = "driver.lock"


def _holder(fd: int) -> str:
    """Who holds the lock, as its holder recorded it (empty if it wrote nothing yet)."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        info = json.loads(os.read(fd, 4096).decode() or "{}")
        return (f"pid {info['pid']} on {info['host']} ({info['command']}, since {info['since']})"
                if isinstance(info, dict) and {"pid", "host", "command", "since"} <= info.keys() else "")
    except (OSError, ValueError):
        return ""


def _take(fd: int, tries: int = 5) -> None:
    """The exclusive lock, or BlockingIOError once another holds it for a second: `triaccel searches` probes
    the lock with a shared one for an instant, which must not refuse a driver starting then."""
    import time

    for i in range(tries):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if i == tries - 1:
                raise
            time.sleep(0.2)


@contextlib.contextmanager
def driver_lock(name: str, folder: Path, command: str, refused: str | None = None):
    """Hold the search's driver lock for the block; refuse at once (ConfigError) if another holds it,
    with ``refused`` as the message where given."""
    path = folder / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise ConfigError(f"{path}: cannot open the search's lock file ({e.strerror or e})") from None
    try:
        try:
            _take(fd)
        except BlockingIOError:
            who = _holder(fd) or "another process"
            if refused:
                raise ConfigError(refused) from None
            from triaccel.search.state import again  # state imports this module

            next_step = again("extend", name, "--trials N") if command == "extend" else again("resume", name)
            raise ConfigError(f"search '{name}' is being run by {who}: one search has one driver at a time; "
                              f"wait for it to end (or stop it), then `{next_step}`") from None
        except OSError as e:  # a file system that cannot lock at all: say so rather than run two drivers
            raise ConfigError(f"{path}: cannot lock it ({e.strerror or e}); the search's Tune folder "
                              f"(TRIACCEL_TUNE_DIR) must be on a file system with file locks") from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                "since": datetime.datetime.now().isoformat(timespec="seconds")}
        with contextlib.suppress(OSError):  # the record only names the holder; the lock is what counts
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
        try:
            yield
        finally:  # a process that lives on (a notebook's) must not read as this search's driver
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # closing releases the lock


def running_driver(folder: Path) -> dict | None:
    """The driver running the search now, as its record names it ({pid, host, command, since}; {} where it
    wrote none yet), or None. The lock decides, as it does for a second driver: a shared lock taken and
    dropped at once is refused exactly while a driver holds it, on any host that shares the folder's locks
    (a driver killed however it died holds nothing). Where locks cannot be taken, None."""
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
            except (OSError, ValueError):
                info = {}
            return info if isinstance(info, dict) else {}
        except OSError:
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
