"""How a search stops: Ctrl-C and SIGTERM around Tune's fit(), an MLflow server that stops answering
(bounded HTTP retries), a full disk, any other failure. Each ends as one line saying how to continue,
with the search's runs still RUNNING in MLflow closed KILLED."""
from __future__ import annotations

import contextlib
import os

from triaccel.errors import (Interrupted, TriAccelError, disk_full, interrupted, stop_done, stop_on_ctrl_c,
                             stop_on_sigterm)
from triaccel.search.state import again, close_running


# MLflow's client retries an unreachable server 7 times with a doubling back-off (about 4 minutes a call):
# with those defaults a server that dies mid-search hangs the search for 8.5 minutes. A search
# rides through a server restarted within about 15 s (1+2+4+8) and stops with one line after that.
HTTP_RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "4", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}


def bounded_http_retries() -> None:
    """The search's MLflow client gives up on a dead server in seconds (a user's own settings win)."""
    for k, v in HTTP_RETRIES.items():
        os.environ.setdefault(k, v)


def server_gone(e: BaseException, uri: str) -> str | None:
    """Why the MLflow server of an http(s) store no longer answers, if that is what ``e`` says."""
    if not uri.startswith(("http://", "https://")):
        return None
    import requests

    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
            return type(e).__name__
        text = str(e)
        if "Max retries exceeded" in text or "Connection refused" in text:
            return "connection refused" if "Connection refused" in text else "no answer"
        e = e.__cause__ or e.__context__
    return None


def tune_saw_a_signal(handler) -> bool | None:
    """Whether a stop signal reached Tune's fit(), from the SIGINT handler in place as fit() returns:
    Tune's own (``_setup_signal_catching``) is still there unless a SIGINT or SIGUSR1 reached it (it puts
    the previous handler back then). None where Tune installs none (TUNE_DISABLE_SIGINT_HANDLER)."""
    if os.environ.get("TUNE_DISABLE_SIGINT_HANDLER", "0") not in ("", "0"):
        return None
    return "signal_interrupt_tune_run" not in getattr(handler, "__qualname__", "")


@contextlib.contextmanager
def own_signals():
    """Around Tune's fit(): afterwards Ctrl-C and SIGTERM act as they did before it. Tune installs its own SIGINT
    handler for fit() and leaves it in place when fit() returns normally (ray/tune/tune.py,
    _setup_signal_catching), so a Ctrl-C or SIGTERM during the confirm runs would only set an event nobody
    reads: the search would run on, print its summary, close its parent run FINISHED and exit 0. The SIGINT
    handler from before fit() is put back (a caller's own, or SIG_IGN in a background job, stays theirs).
    Yields a namespace whose ``stopped`` says afterwards whether a stop signal reached Tune
    (``tune_saw_a_signal``; None where that is not known, as off the main thread)."""
    import signal
    import threading
    from types import SimpleNamespace

    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGINT) if main else None
    watch = SimpleNamespace(stopped=None)
    try:
        yield watch
    finally:
        if main:
            watch.stopped = tune_saw_a_signal(signal.getsignal(signal.SIGINT))
        if main and before is not None:
            signal.signal(signal.SIGINT, before)
            stop_on_sigterm()


@contextlib.contextmanager
def interruptible(name: str, uri: str, rest: str = ""):
    """Ctrl-C or SIGTERM anywhere in a search (baselines, trials, confirm runs) ends it as stopped,
    never as finished: its runs still RUNNING in MLflow (the parent included) are closed KILLED, and
    the error says how to continue. The parent run is FINISHED only by ``finish``. Both signals are
    taken from here on (from Python as from the CLI); a stop request still standing when the search
    ends is spent with it. ``rest``: the resume hint's arguments (a re-judge names its own length)."""
    stop_on_ctrl_c()
    stop_on_sigterm()
    try:
        yield
    except (KeyboardInterrupt, Interrupted) as e:
        _stopped(name, uri, f" ({e})" if isinstance(e, Interrupted) else "", rest)
    except Exception as e:  # noqa: BLE001 -- MLflow, sqlite, Ray and the OS each say "full" their own way
        gone = None if isinstance(e, TriAccelError) else server_gone(e, uri)  # a check's own line stays as it is
        if gone:  # the runs cannot be closed on a server that is down: resume closes and continues them
            raise TriAccelError(f"search '{name}' stopped: the MLflow server at {uri} stopped answering ({gone}); "
                                f"start it again, then `{again('resume', name, rest)}` continues the search") from None
        full = disk_full(e)  # first: a full disk met while stopping is what to fix (and the store may be on it)
        if full is None and interrupted(e):  # Ctrl-C or SIGTERM that landed inside a library call, wrapped in its error
            _stopped(name, uri, "", rest)
        if full is not None:
            raise TriAccelError(f"search '{name}' stopped: a disk it writes is full ({full}); free space, then "
                                f"`{again('resume', name, rest)}` continues it") from None
        raise failed(name, uri, e, rest) from None
    finally:
        stop_done()


def failed(name: str, uri: str, e: Exception, rest: str = "") -> TriAccelError:
    """Any other end of a search that is no user's stop (a store locked for too long, Ray that could not
    start, an error in Tune): its runs still RUNNING are closed KILLED where the store lets them be (a
    parent left RUNNING read as a search still going), and the cause is one line saying how to continue."""
    from triaccel.errors import _chain
    from triaccel.store_lock import StoreLocked

    with contextlib.suppress(Exception):
        close_running(name, uri)
    cause = next((x for x in _chain(e) if isinstance(x, TriAccelError)), None)
    if cause is not None and not isinstance(cause, StoreLocked):
        return cause  # a check's own line (an unusable --address), as it was
    text = str(cause or e).strip()
    why = text.splitlines()[0][:300] if text else type(e).__name__
    # the cause may be the user's code, failing the same way every time: resuming first is no use
    return TriAccelError(f"search '{name}' stopped: {why}; once its cause is fixed, `{again('resume', name, rest)}` "
                         f"continues it")


def _stopped(name: str, uri: str, left: str, rest: str = "") -> None:
    close_running(name, uri)
    raise Interrupted(f"search '{name}' stopped before it finished{left}: `{again('resume', name, rest)}` "
                      f"continues it") from None
