"""Riding through a sqlite MLflow store that another process holds locked.

sqlite lets one writer at a time; a reader or writer elsewhere (the MLflow UI, a backup, a second
search, `sqlite3` in a shell) can hold the file locked for seconds. MLflow has sqlite wait 20 s
(busy_timeout) and then raises "database is locked", which, unhandled, would end `train` with a traceback
and a run left RUNNING, and fill a search with a traceback per callback. Every MLflow call of this project goes
through ``client()``, whose client retries such a call for up to ``wait_s()`` seconds in all
(TRIACCEL_STORE_LOCK_WAIT_S, default 60) and then raises ``StoreLocked``: one line naming the store.
"""
from __future__ import annotations

import os
import time

from triaccel.errors import ConfigError, TriAccelError

DEFAULT_WAIT_S = 60.0


class StoreLocked(TriAccelError):
    """The store stayed locked by another process for longer than the stated bound."""


def wait_s() -> float:
    raw = os.environ.get("TRIACCEL_STORE_LOCK_WAIT_S", "")
    if not raw.strip():
        return DEFAULT_WAIT_S
    try:
        v = float(raw)
    except ValueError:
        v = -1.0
    if not 0 <= v <= 86400:  # NaN fails too
        raise ConfigError(f"TRIACCEL_STORE_LOCK_WAIT_S={raw!r}: must be seconds in [0, 86400]")
    return v


def is_locked(e: BaseException) -> bool:
    """Whether ``e`` (or what it was raised from) is sqlite's "database is locked"."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if "database is locked" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


class RetryingClient:
    """An MlflowClient whose calls ride through a locked sqlite store, for ``wait_s()`` seconds in all."""

    def __init__(self, inner, uri: str):
        self._inner, self._uri = inner, uri

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if not callable(attr) or not self._uri.startswith("sqlite:"):
            return attr

        def call(*args, **kw):
            deadline = time.monotonic() + wait_s()
            pause = 0.5
            while True:
                try:
                    return attr(*args, **kw)
                except Exception as e:  # noqa: BLE001 -- only the lock is retried; the rest is raised as it is
                    if not is_locked(e):
                        raise
                    if time.monotonic() >= deadline:
                        raise StoreLocked(f"the MLflow store {self._uri} stayed locked by another process for more "
                                          f"than {wait_s():g} s (TRIACCEL_STORE_LOCK_WAIT_S); stop what holds it "
                                          f"(an open sqlite3 shell, a backup) and try again") from None
                    time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                    pause = min(pause * 2, 5.0)

        return call
