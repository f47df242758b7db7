"""``triaccel searches``: every saved search with its progress and what ``export`` would write."""
from __future__ import annotations

import contextlib

from triaccel.errors import ConfigError
from triaccel.search.lock import running_driver
from triaccel.search.state import (list_names, open_store, read_outcome, read_state, saved_space, search_finished,
                                   state_store, tune_root)


def list_searches() -> list[dict]:
    from triaccel.search.judge import final_pick, judged

    out = []
    for name in list_names():
        try:
            st = read_state(name)
        except ConfigError as e:  # one damaged state does not hide the other searches
            out.append({"name": name, "space": "?", "created": "?", "error": str(e)})
            continue
        # the space file by its absolute path (a path as typed, ../space.yaml, means nothing from another folder)
        item = {"name": name, "space": st.get("source_path") or st["source"], "created": st.get("created", "?"),
                "trials": planned_trials(name, st["space"].get("trials")),
                "driver": running_driver(tune_root() / name)}
        try:
            space = saved_space(st)
            open_store(state_store(st), write=False)  # listing only reads
            o = read_outcome(name, space, state_store(st))
            # done: every trial that has ended, ASHA's early stops included (they are not left to run)
            item.update(finished=len(o.ranked) + len(o.stopped) + len(o.failed), failed=len(o.failed),
                        feasible=len(o.feasible),
                        search_finished=search_finished(name, state_store(st)))
            # what `export` would write (results.pick), not the best trial: where nothing feasible beats the
            # baseline, export writes the baseline, and the listing must not show a trial's score or '-'
            with contextlib.suppress(ConfigError):  # nothing to export yet
                j = judged(name, space, state_store(st), o)  # at the production length, where judged
                chosen = final_pick(o, space, j)
                ref = (j.mean_metrics("baseline") if j is not None else o.reference["metrics"])["efficiency"] \
                    if o.reference is not None else None
                item.update(best=chosen.measured["efficiency"], exports=chosen.kind,
                            ratio=chosen.measured["efficiency"] / ref if ref else None)
        except Exception as e:  # a store that moved: still list the search
            item["error"] = str(e)[:300]
        out.append(item)
    return out


def planned_trials(name: str, trials):
    """The search's trials and those each ``extend`` added (as its Tune state planned them): what the
    finished count is out of."""
    from triaccel.search.state import extension_folders

    extensions = extension_folders(name)
    if not extensions or not isinstance(trials, int):
        return trials
    from triaccel.search.tuner import planned_by_tune  # imports Ray: only for a search extended

    return trials + sum(planned_by_tune(f) or 0 for f in extensions)
