"""The search's closing table: every trial, with readable columns and the score said once."""
from __future__ import annotations

from triaccel.search.space import NEAR, START


def headers(keys: list[str]) -> list[str]:
    """Each searched key's column: its last part (grow_factor), or the last two where two keys share it."""
    last = [k.split(".")[-1] for k in keys]
    return [".".join(k.split(".")[-2:]) if last.count(t) > 1 else t for k, t in zip(keys, last)]


def cell(v) -> str:
    """A searched value: numbers to 3 digits, categorical choices as they are."""
    return f"{v:.3g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def print_table(o, space) -> None:
    """Baselines, then every trial: the ranked ones, those ASHA stopped early, those that failed."""
    from triaccel.search.cli import SCORE
    from triaccel.search.results import fmt
    from triaccel.search.tags import TAG_DOMINATED
    from triaccel.units import mem_column

    keys = list(space.params)
    names = headers(keys)
    rows = [x.row for x in o.ranked] + list(o.stopped) + list(o.failed)
    width = [max([len(n)] + [len(cell(r["values"].get(k))) for r in rows]) for k, n in zip(keys, names)]
    vals = lambda r: "  ".join(cell(r["values"].get(k)).rjust(w) for k, w in zip(keys, width))  # noqa: E731
    unit, per_gib = mem_column([b["metrics"].get("peak_mem_gib", float("nan")) for b in o.baselines]
                               + [x.measured.get("peak_mem_gib", float("nan")) for x in o.ranked])
    places = 3 if unit == "GiB" else 2  # six characters either way: MiB reach 102.40
    print(f"{'rank':>5} {'run':>22} {'eff':>8} {'x base':>6} {'val%':>6} {'d.acc':>6} {'s/ep':>6} {unit:>6}  "
          + "  ".join(n.rjust(w) for n, w in zip(names, width)))
    for b in o.baselines:
        m = b["metrics"]
        r = m["efficiency"] / o.reference["metrics"]["efficiency"]
        print(f"{'base':>5} {b['tags'].get('triaccel.baseline', '?'):>22} {m['efficiency']:8.2f} {r:6.2f} "
              f"{m['val_acc']:6.2f} {'':>6} {m['epoch_time_last5_s']:6.2f} {m['peak_mem_gib'] * per_gib:6.{places}f}")
    for b in o.dominated:
        print(f"{'base':>5} {b['tags'].get('triaccel.baseline', '?'):>22} stopped after epoch "
              f"{int(b['metrics'].get('epoch', 0))}: {b['tags'][TAG_DOMINATED]}")
    for i, x in enumerate(o.ranked):
        m = x.measured
        tags = x.row.get("tags", {})
        start = ("s" if tags.get(START) == "true" else "") + ("n" if tags.get(NEAR) else "")
        rank = f"{i + 1}{'' if x.feasible else '!'}{'*' if x.confirmed else ''}{'+' if x.gaps else ''}{start}"
        print(f"{rank:>5} {x.row['trial_id']:>22} {m['efficiency']:8.2f} {fmt(x.ratio):>6} {m.get('val_acc', 0):6.2f} "
              f"{fmt(x.gap, '+.2f'):>6} {m.get('epoch_time_last5_s', 0):6.2f} {m.get('peak_mem_gib', 0) * per_gib:6.{places}f}  "
              f"{vals(x.row)}")
    for r in o.stopped:
        print(f"{'-':>5} {r['trial_id']:>22} stopped early at epoch {int(r['metrics'].get('epoch', 0))} (ASHA)  "
              f"{vals(r)}")
    for r in o.failed:
        why = r["tags"].get("failure_reason", "failed")
        print(f"{'-':>5} {r['trial_id']:>22} failed: {why[:80]}  {vals(r)}")
    if o.ranked or o.stopped or o.failed:
        print(f"  ({SCORE} x base: eff / the reference baseline's; d.acc: validation accuracy minus the reference's "
              f"at the same epoch; !: more than {space.margin:g} pp below it, infeasible, never exported; "
              f"*: re-measured alone; s: a start point of the space; n: drawn near the best trial so far)")


def print_summary(name: str, space, uri: str, o, j):
    """The search's closing lines: counts, the table, reused baselines, second looks, the judge's verdict,
    what ``export`` writes, device time by phase. Returns the pick (None where nothing can be exported)."""
    from triaccel.errors import TriAccelError
    from triaccel.search import baseline_cache, phases
    from triaccel.search.judge import final_pick, summary_lines
    from triaccel.search.state import again, open_store

    print(f"\nsearch '{name}': {len(o.ranked)} finished ({len(o.feasible)} feasible), {len(o.stopped)} stopped early, "
          f"{len(o.failed)} failed, {o.trials} trials in MLflow")
    print_table(o, space)
    for line in baseline_cache.reused_lines(o.baselines):  # where a reused baseline's figures came from
        print(line)
    for x in o.ranked:
        if x.gaps:
            print(f"  second look {x.row['trial_id']} (+): d.acc {x.gaps[0]:+.2f} at the first seed, {x.gaps[1]:+.2f} "
                  f"at the next, mean {x.gap:+.2f}: {'feasible' if x.feasible else 'infeasible'}")
    for line in summary_lines(j, o) if j is not None else ():
        print(line)
    p = None
    try:
        p = final_pick(o, space, j)
    except TriAccelError:
        pass
    if p is not None and p.kind == "baseline":
        print(f"{p.reason}: `export` writes the static baseline {p.row['tags'].get('triaccel.baseline')}")
    print(phases.words(phases.read(*open_store(uri), name)))
    browse = uri if uri.startswith(("http://", "https://")) else "triaccel ui"  # a server: its own UI
    print(f"export the best: {again('export', name, '--out tuned.yaml')}    browse: {browse}")
    if j is not None:  # a verdict holds at its own length only
        print(f"judged at {j.epochs} epochs: to train another length N, "
              f"`{again('resume', name, '--production-epochs N')}` judges it there first")
    return p
