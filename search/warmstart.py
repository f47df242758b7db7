"""``--warm-start NAME``: the best feasible trials of an earlier search become start points of a new one.

The earlier search's best K feasible trials (by measured efficiency, as its summary ranks them)
are mapped onto the new space, key by key, and appended to its ``start`` points: Optuna runs
them first, as the space's own (``tuner._constrained_optuna``), and they persist in the saved
space, so ``resume`` runs them too. Across spaces only the keys both search survive:

- a key the new space does not search is left out (the new space's train settings hold);
- a number outside the new bounds is clipped to the nearest bound (an int onto its grid);
- a categorical value the new space does not offer is left out, Optuna samples it;
- an ordered key (``above: OTHER``) no longer above its partner after clipping is left out.

A point that keeps no key, or repeats one already to run, is dropped. Every point changed or
dropped is one line on stderr naming the source trial and what happened to it. The sampler's
seed moves on by the earlier search's trial count, so a search of the same space does not draw
the earlier one's points again.
"""
from __future__ import annotations

import math
import sys

from triaccel.errors import ConfigError
from triaccel.search.space import EPS, SearchSpace

DEFAULT_K = 3


def _clip(p, v):
    """(value within p's range, note) or (None, why it was left out)."""
    if p.choices is not None:
        return (v, "") if v in p.choices else (None, f"{v!r} not among the choices")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None, f"{v!r} is not a number"
    x = min(max(float(v), p.low), p.high)
    if p.distribution == "int":
        step = p.step or 1
        x = int(p.low + round((x - p.low) / step) * step)
        x = int(min(x, p.high - (p.high - p.low) % step))
    return x, ("" if x == v else f"{v:g} clipped to {x:g}")


def map_point(values: dict, space: SearchSpace) -> tuple[dict, list[str]]:
    """An earlier trial's values as a (partial) start point of ``space``, and what changed."""
    point, notes = {}, []
    dropped = sorted(k for k in values if k not in space.params)
    if dropped:
        notes.append(f"not searched here: {', '.join(dropped)}")
    for k, p in space._ordered():  # an ordered key after its partner
        if k not in values:
            continue
        x, note = _clip(p, values[k])
        if x is not None and p.above:
            other = point.get(p.above)
            if other is None:
                x, note = None, f"its partner {p.above} is not in the point"
            elif not x >= (other * (1 + EPS) if other > 0 else other + EPS):
                x, note = None, f"{x:g} not above {p.above} ({other:g})"
        if x is None:
            notes.append(f"{k} left out ({note})")
        else:
            point[k] = x
            if note:
                notes.append(f"{k} {note}")
    return point, notes


def best_rows(name: str, k: int) -> tuple[list[dict], int]:
    """The earlier search's top ``k`` feasible trials (best measured efficiency first), and its trial count."""
    from triaccel.search.state import open_store, read_outcome, read_state, saved_space, state_store

    try:
        state = read_state(name)
    except ConfigError as e:
        raise ConfigError(f"--warm-start {name}: {e}") from None
    old = saved_space(state)
    uri = state_store(state)
    open_store(uri, write=False)
    o = read_outcome(name, old, uri)
    return [x.row for x in o.feasible[:k]], o.trials


def warm_start(space: SearchSpace, name: str, k: int) -> SearchSpace:
    """``space`` with the earlier search's best points appended to its start points, validated again."""
    if k < 1:
        raise ConfigError(f"--warm-start-k: invalid value {k} (a number of trials, >= 1)")
    rows, trials = best_rows(name, k)
    if not rows:
        raise ConfigError(f"--warm-start {name}: that search has no feasible finished trial to start from")
    starts = list(space.raw.get("start") or [])
    added = 0
    for r in rows:
        point, notes = map_point(r["values"], space)
        what = f"--warm-start {name}: trial {r['trial_id']}"
        if not point:
            print(f"{what} dropped: it shares no usable key with this space ({'; '.join(notes)})", file=sys.stderr)
            continue
        if point in starts:
            print(f"{what} dropped: the same point is already a start point", file=sys.stderr)
            continue
        if notes:
            print(f"{what} kept with changes: {'; '.join(notes)}", file=sys.stderr)
        starts.append(point)
        added += 1
    # the sampler's seed moves on by the earlier search's trials: with the same space and seed the random
    # sampler would draw the earlier search's points again, the ones run as start points among them
    seed = (space.seed + trials) % 2**32
    print(f"warm start: {added} of the best {len(rows)} feasible trials of search '{name}' run first; "
          f"sampler seed {seed} (the space's {space.seed} + its {trials} trials)", flush=True)
    return space.with_options(start=starts, seed=seed)
