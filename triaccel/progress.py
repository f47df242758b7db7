"""Progress bars for long work (image decoding, epochs): tqdm, shown only on a terminal.

Quiet when stderr is not a terminal (logs, CI, Ray trials, `| tee`), and for work that ends
within ``TRIACCEL_PROGRESS_DELAY`` seconds (default 2): a bar appears only once something
has taken that long. ``TRIACCEL_PROGRESS=0`` turns bars off, ``=1`` forces them on.
"""
from __future__ import annotations

import os
import sys

from tqdm.auto import tqdm


def enabled() -> bool:
    force = os.environ.get("TRIACCEL_PROGRESS")
    if force in ("0", "1"):
        return force == "1"
    return sys.stderr.isatty()


def delay() -> float:
    """``TRIACCEL_PROGRESS_DELAY`` in seconds; a value that is not one is a one-line error naming the
    variable (not a ValueError from the first bar, mid-run). The CLI checks it first."""
    from triaccel.errors import ConfigError

    raw = os.environ.get("TRIACCEL_PROGRESS_DELAY") or "2"  # set but empty: the default, as unset
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 <= value < float("inf"):
        raise ConfigError(f"TRIACCEL_PROGRESS_DELAY: must be a number of seconds >= 0, got {raw!r}")
    return value


def bar(total: int, desc: str, unit: str = "it"):
    return tqdm(total=total, desc=desc, unit=unit, leave=False, disable=not enabled(), dynamic_ncols=True,
                delay=delay(), mininterval=0.5, file=sys.stderr)
