"""Errors that the CLI turns into one clear line and a non-zero exit (never a traceback)."""


class TriAccelError(Exception):
    """Base class: a user-facing problem (bad input, missing data), not a bug."""


class ConfigError(TriAccelError):
    """A config or search-space value is wrong; the message names the key (and file)."""


class Interrupted(TriAccelError):
    """The user stopped the work (Ctrl-C) before it finished; the message says how to continue it."""


class DataError(TriAccelError):
    """A dataset cannot be found or read; the message names the path or file."""


def stop_on_sigterm() -> None:
    """SIGTERM (``kill``, a batch scheduler, a container stopping) ends the work as Ctrl-C does:
    runs closed KILLED, Tune's state saved, the line saying how to continue. Without it Python
    dies at once (MLflow runs left RUNNING) and, once Ray is up, Ray's own handler aborts the
    driver with a stack dump (exit 134). Called at start-up and again after ``ray.init``, which
    installs its own handlers."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def on_term(signum, frame):
        global TERMINATED
        TERMINATED = True
        handler = signal.getsignal(signal.SIGINT)  # Tune's graceful stop while trials run
        if callable(handler) and handler is not signal.default_int_handler:
            handler(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)


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
