"""Stop requests (triaccel.errors): a SIGTERM or Ctrl-C whose KeyboardInterrupt Python drops still
stops the work. Python ignores an exception raised while it runs a weakref callback or ``__del__``
(it prints "Exception ignored in ..." and goes on); torch's compile caches run such callbacks all
through a run. The handlers record the request and the loops end at their next safe point. Real
handlers, real signals, a real Trainer on the CPU (the search end to end: test_search_signals.py)."""
import os
import signal
import sys
import weakref

import pytest

from conftest import small_cfg
from triaccel import errors
from triaccel.trainer import Callback, Trainer


@pytest.fixture
def handlers(monkeypatch):
    """The process's handlers and stop state as they were, afterwards."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.setattr(errors, "TERMINATED", False)
    monkeypatch.setattr(errors, "_STOP", False)
    monkeypatch.setattr(errors, "_REPORT", None)
    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", dropped.append)  # where Python reports what it ignored
    try:
        yield dropped
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


def _signal_inside_a_weakref_callback(sig):
    """Send ``sig`` to this process from a weakref callback, which then runs on, so that Python
    runs the handler inside the callback."""
    class Thing:
        pass

    def callback(ref):
        os.kill(os.getpid(), sig)
        for _ in range(100_000):  # the handler runs at one of these bytecode boundaries
            pass

    thing = Thing()
    ref = weakref.ref(thing, callback)
    del thing  # the callback runs now
    return ref


def test_a_sigterm_dropped_in_a_weakref_callback_still_ends_the_next_run(handlers):
    errors.stop_on_sigterm()
    _signal_inside_a_weakref_callback(signal.SIGTERM)  # no exception here: Python dropped it
    assert errors.stop_requested() and handlers == []  # recorded, and no "Exception ignored in" traceback
    t = Trainer(small_cfg(epochs=2), log=lambda *a: None).setup()
    with pytest.raises(KeyboardInterrupt):
        t.fit()
    assert t.step_count == 0 and t.epoch == 0  # not a step trained after the stop
    assert errors.TERMINATED  # the CLI exits 143


def test_a_ctrl_c_dropped_mid_run_ends_it_at_the_next_step_and_the_next_run_trains(handlers):
    """Ctrl-C through the project's SIGINT handler, landing in a weakref callback at step 3 of a
    run: the run ends at step 4's start, and the stop, carried out, does not stop the next run."""
    errors.stop_on_ctrl_c()

    class CtrlCAtStep3(Callback):
        def on_step_end(self, trainer, info):
            if info.step == 3:
                self.ref = _signal_inside_a_weakref_callback(signal.SIGINT)

    t = Trainer(small_cfg(epochs=2), callbacks=[CtrlCAtStep3()], log=lambda *a: None).setup()
    with pytest.raises(KeyboardInterrupt):
        t.fit()
    assert handlers == []  # the dropped KeyboardInterrupt was the stop: nothing on the user's terminal
    assert t.step_count == 3 and not t.history.epochs and not errors.TERMINATED
    assert not errors.stop_requested()
    again = Trainer(small_cfg(epochs=1), log=lambda *a: None).setup()
    again.fit()
    assert again.epoch == 1


def test_a_dropped_exception_that_is_not_a_stop_is_still_reported(handlers):
    """The hook that keeps a dropped stop quiet passes on every other dropped exception, and a
    KeyboardInterrupt dropped when no stop stands, to the hook that was in place."""
    errors.stop_on_sigterm()

    class Thing:
        pass

    def fails(ref, exc):
        raise exc

    for exc in (ValueError("a bug in a finalizer"), KeyboardInterrupt()):
        thing = Thing()
        ref = weakref.ref(thing, lambda r, exc=exc: fails(r, exc))
        del thing
    assert [type(u.exc_value) for u in handlers] == [ValueError, KeyboardInterrupt] and ref is not None
    assert sys.unraisablehook is errors._quiet_dropped_stop
