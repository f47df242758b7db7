"""How the printed lines say a peak of memory (no torch: a search's driver prints them too)."""
from __future__ import annotations


def mem_text(gib: float) -> str:
    """A peak as a printed line says it: GiB to three decimals from 0.1 GiB up, MiB to three figures
    below, where a CPU run's small model (a few MiB) read "0.000 GiB" beside an efficiency in the millions."""
    if not gib == gib or gib >= 0.1:  # NaN (a result without the metric) prints as it is
        return f"{gib:.3f} GiB"
    return f"{gib * 1024:.3g} MiB"


def mem_column(gibs) -> tuple[str, float]:
    """A table's peak-memory column: its header and the factor from GiB, one unit for every row (MiB where
    every peak is below 0.1 GiB, as ``mem_text`` says them)."""
    finite = [g for g in gibs if g == g]
    return ("MiB", 1024.0) if finite and max(finite) < 0.1 else ("GiB", 1.0)
