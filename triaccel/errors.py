"""Errors that the CLI turns into one clear line and a non-zero exit (never a traceback), and the
stop requests (SIGTERM, Ctrl-C) that end the work at its next safe point."""


class TriAccelError(Exception):
    """Base class: a user-facing problem (bad input, missing data), not a bug."""


class ConfigError(TriAccelError):
    """A config or search-space value is wrong; the message names the key (and file)."""


class Interrupted(TriAccelError):
    """The user stopped the work (Ctrl-C) before it finished; the message says how to continue it."""


class DataError(TriAccelError):
    """A dataset cannot be found or read; the message names the path or file."""


# A stop asked for (SIGTERM; Ctrl-C through _on_int) and not yet carried out. The handlers raise
# KeyboardInterrupt at once as well, but Python drops an exception raised while it runs a weakref
# callback or ``__del__`` (it reports it through sys.unraisablehook, "Exception ignored in ...", and
# goes on): torch's compile caches run such callbacks all through a run. The long loops read this at
# their safe points (check_stop), so a stop whose exception was dropped still ends the work there,
# and _quiet_dropped_stop keeps the dropped exception's traceback off the user's terminal.
_STOP = False


def request_stop(signum: int) -> None:
    """Record a stop request (and, for SIGTERM, that the CLI exits 143)."""
    import signal

    global _STOP, TERMINATED
    _STOP = True
    if signum == signal.SIGTERM:
        TERMINATED = True


def stop_requested() -> bool:
    return _STOP


def check_stop() -> None:
    """A safe point (a training step, the gap between runs): KeyboardInterrupt while a stop stands."""
    if _STOP:
        raise KeyboardInterrupt


def stop_done() -> None:
    """The stop reached the code that ends the work (the KeyboardInterrupt is on its way out, or has
    been reported): a later run in this process (a notebook's next cell) is not stopped by it."""
    global _STOP
    _STOP = False


_REPORT = None  # the sys.unraisablehook in place before _quiet_dropped_stop


def _quiet_dropped_stop(unraisable) -> None:
    """sys.unraisablehook: a KeyboardInterrupt dropped while a stop stands is the stop itself, which
    check_stop carries out; it is not reported. Anything else goes to the hook that was in place."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _STOP:
        return None
    return _REPORT(unraisable)


def _install_quiet_dropped_stop() -> None:
    import sys

    global _REPORT
    if sys.unraisablehook is not _quiet_dropped_stop:
        _REPORT, sys.unraisablehook = sys.unraisablehook, _quiet_dropped_stop


def _on_int(signum, frame):
    request_stop(signum)
    raise KeyboardInterrupt


def _on_term(signum, frame):
    request_stop(signum)
    import signal

    handler = signal.getsignal(signal.SIGINT)  # Tune's graceful stop while trials run
    if callable(handler) and handler not in (signal.default_int_handler, _on_int):
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


def stop_on_ctrl_c() -> None:
    """Ctrl-C raises KeyboardInterrupt as Python's own handler does, and records the request
    (check_stop). Only where Python's handler is in place: an ignored SIGINT (a background job) or a
    caller's own handler stays as it is."""
    import signal
    import threading

    _install_quiet_dropped_stop()  # also where _on_int is in place already (an earlier run in this process)
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_int)


def stop_on_sigterm() -> None:
    """SIGTERM (``kill``, a batch scheduler, a container stopping) ends the work as Ctrl-C does:
    runs closed KILLED, Tune's state saved, the line saying how to continue. Without it Python
    dies at once (MLflow runs left RUNNING) and, once Ray is up, Ray's own handler aborts the
    driver with a stack dump (exit 134). Called at start-up and again after ``ray.init``, which
    installs its own handlers."""
    import signal
    import threading

    _install_quiet_dropped_stop()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_term)


def _chain(e: BaseException | None):
    """``e`` and the exceptions it was raised from or during, each once."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def interrupted(e: BaseException | None) -> bool:
    """Whether ``e`` is, or was caused by, a KeyboardInterrupt: Ctrl-C, or SIGTERM as the CLI
    maps it, that landed inside a library call which wrapped it in its own error (MLflow's SQL
    layer does; unrecognised, the run would stay RUNNING and the CLI exit 1 with a traceback)."""
    return any(isinstance(x, KeyboardInterrupt) for x in _chain(e))


TERMINATED = False  # set when SIGTERM arrived: the CLI exits 143 (128 + SIGTERM), not 130


def disk_full(e: BaseException) -> str | None:
    """What a disk-full error says (its first line), looking through its causes; None for any other.
    A store or Tune folder that fills mid-search otherwise surfaces as MLflow's or Tune's traceback, exit 1."""
    import errno

    for x in _chain(e):
        text = str(x).strip().splitlines()[0][:160] if str(x).strip() else type(x).__name__
        if isinstance(x, OSError) and x.errno in (errno.ENOSPC, errno.EDQUOT):
            return text
        if "database or disk is full" in str(x) or "No space left on device" in str(x):
            return "database or disk is full" if "database or disk is full" in str(x) else text
    return None
