"""Reading a search back from MLflow: the trial table, the Pareto front, the pick to export."""
from __future__ import annotations

import json

from triaccel.errors import ConfigError

TAG_SEARCH, TAG_ROLE = "triaccel.search", "triaccel.role"


def trial_table(c, exp_id: str, search: str, role: str = "trial") -> list[dict]:
    runs = c.search_runs([exp_id], filter_string=f"tags.`{TAG_SEARCH}` = '{search}' and tags.`{TAG_ROLE}` = '{role}'",
                         max_results=10000)
    rows = []
    for r in runs:
        rows.append({"run_id": r.info.run_id, "status": r.info.status, "metrics": dict(r.data.metrics),
                     "values": json.loads(r.data.tags.get("triaccel.values", "{}")),
                     "trial_id": r.data.tags.get("triaccel.trial_id"), "tags": dict(r.data.tags),
                     "confirms": r.data.tags.get("triaccel.confirms")})
    return rows


def dominates(a: dict, b: dict) -> bool:
    ka = (a["val_acc"], -a["epoch_time_last5_s"], -a["peak_mem_gib"])
    kb = (b["val_acc"], -b["epoch_time_last5_s"], -b["peak_mem_gib"])
    return all(x >= y for x, y in zip(ka, kb)) and any(x > y for x, y in zip(ka, kb))


def pareto_front(rows: list[dict]) -> list[dict]:
    """Non-dominated trials (max val_acc, min epoch time, min peak memory), best accuracy first."""
    ok = [r for r in rows if all(k in r["metrics"] for k in ("val_acc", "epoch_time_last5_s", "peak_mem_gib"))]
    front = [r for r in ok if not any(dominates(o["metrics"], r["metrics"]) for o in ok if o is not r)]
    return sorted(front, key=lambda r: -r["metrics"]["val_acc"])


def pick(rows: list[dict], confirms: list[dict], objective: str, how: str) -> tuple[dict, dict]:
    """(trial row, measured metrics): the best trial, or entry N of the Pareto front.

    Where a trial was re-measured alone (``--confirm``), the confirmed figures decide and are
    exported: figures taken while trials shared the GPU are distorted by the sharing.
    """
    done = [r for r in rows if r["status"] == "FINISHED" and "efficiency" in r["metrics"]]
    if not done:
        raise ConfigError("no finished trial to export")
    confirmed = {c["confirms"]: c for c in confirms if c["status"] == "FINISHED" and "efficiency" in c["metrics"]}

    def measured(r):
        return confirmed[r["run_id"]]["metrics"] if r["run_id"] in confirmed else r["metrics"]

    if how == "best":
        if objective == "pareto":
            front = pareto_front([{**r, "metrics": measured(r)} for r in done])
            best = max(front, key=lambda r: r["metrics"]["efficiency"])
            r = next(x for x in done if x["run_id"] == best["run_id"])
        else:
            pool = [r for r in done if r["run_id"] in confirmed] or done
            r = max(pool, key=lambda r: measured(r)["efficiency"])
        return r, measured(r)
    if how.startswith("pareto-"):
        try:
            i = int(how.split("-", 1)[1])
        except ValueError:
            raise ConfigError(f"--pick {how}: expected best or pareto-N") from None
        front = pareto_front([{**r, "metrics": measured(r)} for r in done])
        if not 0 <= i < len(front):
            raise ConfigError(f"--pick {how}: the Pareto front has {len(front)} trials (pareto-0 .. pareto-{len(front) - 1})")
        r = next(x for x in done if x["run_id"] == front[i]["run_id"])
        return r, measured(r)
    raise ConfigError(f"--pick {how}: expected best or pareto-N")
