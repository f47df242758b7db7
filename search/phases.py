"""The search's time by phase: baselines, trials, confirm.

Each phase's wall seconds (the time it held the device) add up on the search's parent run as
metrics ``phase_s.<phase>``, across ``resume`` and ``extend``; the summary prints them and
``export`` copies them into the provenance as ``device_s_by_phase``.
"""
from __future__ import annotations

import contextlib
import time

PHASES = ("baselines", "trials", "confirm")
PREFIX = "phase_s."


def _parent(c, exp: str, name: str) -> str | None:
    found = c.search_runs([exp], filter_string=f"tags.`triaccel.search` = '{name}' and tags.`triaccel.role` = 'parent'",
                          max_results=1)
    return found[0].info.run_id if found else None


def add(c, exp: str, name: str, phase: str, seconds: float) -> None:
    """Add ``seconds`` to the phase's total on the parent run (none yet: nothing ran to time)."""
    from triaccel.tracking import log_metrics

    parent = _parent(c, exp, name)
    if parent is None:
        return
    hist = c.get_metric_history(parent, PREFIX + phase)
    last = max(hist, key=lambda m: m.step) if hist else None
    log_metrics(c, parent, {PREFIX + phase: (last.value if last else 0.0) + seconds},
                step=(last.step + 1) if last else 0)


@contextlib.contextmanager
def timed(uri: str, name: str, phase: str):
    """Time the block as ``phase`` of search ``name``, stopped or not (a resume adds the rest)."""
    from triaccel.search.state import open_store

    t0 = time.perf_counter()
    try:
        yield
    finally:
        with contextlib.suppress(Exception):  # a store gone down must not hide why the phase ended
            c, exp = open_store(uri)
            add(c, exp, name, phase, time.perf_counter() - t0)


def read(c, exp: str, name: str) -> dict:
    """Seconds by phase, every phase named (0.0 for one that never ran)."""
    parent = _parent(c, exp, name)
    m = c.get_run(parent).data.metrics if parent else {}
    return {p: round(float(m.get(PREFIX + p, 0.0)), 1) for p in PHASES}


def words(by_phase: dict) -> str:
    total = sum(by_phase.values())
    return ("time by phase (wall seconds holding the device): " +
            ", ".join(f"{p} {s:.0f} s" for p, s in by_phase.items()) + f"; {total:.0f} s in all")
