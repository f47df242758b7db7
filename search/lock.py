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
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
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
    """The driver that holds the search's lock now, as its record names it ({pid, host, command, since}), or
    None: the record is read, never the lock taken (a listing must not refuse a driver starting that
    instant). A record names a live driver where its pid runs on this host; one of another host is taken
    as live (its process cannot be seen from here)."""
    try:
        info = json.loads((folder / LOCK_FILE).read_text() or "{}")
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or not {"pid", "host", "command"} <= info.keys():
        return None
    if info["host"] != socket.gethostname():
        return info
    try:
        os.kill(int(info["pid"]), 0)
    except ProcessLookupError:
        return None
    except (PermissionError, ValueError, OverflowError):
        return info if not isinstance(info["pid"], str) else None
    return info
