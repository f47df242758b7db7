"""What does the precision controller's plan budget buy under compile? (issue 31; ea6d80e)

    python3 bench/plan_budget.py --out $OUT/h200_plan_budget.json

Each new precision plan of a compiled forward is a graph of its own, compiled when first met. In the
GPT space's default search (H200, 2026-12-04) two sampled trials at B0 = 32 with a compiled forward ran
23-28 s epochs against 0.3 s, until ASHA stopped them. This trains one of them (``--trial``, the
dotted settings of trial 21daa855 by default) from the space's own ``train`` section, alone, at each
``--budgets`` value of ``triaccel.precision.plan_budget`` (a huge value: no budget, the behaviour
before ea6d80e), seed by seed, in this process after a discarded one-epoch warm-up run.
Written (after every run) to ``--out``: per run the epoch times, compile seconds and graphs, the
precision plan's changes (step, fp16, bf16, fp32 layers), validation accuracy, peak memory and
efficiency; then per budget the mean +- std over seeds.
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402
from search_vs_static import stats, train, warm_run  # noqa: E402

from triaccel.config_io import set_dotted  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# trial 21daa855 of bench/results/lm/h200_lm_search.log: B0 32, bf16 layers and masters, compiled forward
TRIAL_21DAA855 = ("batch_size=32,amp_dtype=bf16,checkpointing=false,triaccel.precision.tau_low=0.614,"
                  "triaccel.precision.tau_high=0.995,triaccel.precision.optimizer_state=bf16,"
                  "triaccel.precision.half=bf16,triaccel.precision.master_weights=bf16,"
                  "triaccel.curvature.tau_curv=477,triaccel.curvature.alpha=0.00312,triaccel.batch.grow_factor=1.75,"
                  "triaccel.batch.rho_high=0.791,triaccel.batch.delta_down=64,triaccel.batch.lr_rule=none,"
                  "compile=default")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--space", default=str(ROOT / "spaces" / "shakespeare_gpt.yaml"))
    ap.add_argument("--trial", default=TRIAL_21DAA855, metavar="KEY=VALUE[,KEY=VALUE]")
    ap.add_argument("--budgets", default="0.05,1e9", help="plan_budget values, comma-separated")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--warm-epochs", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    d = copy.deepcopy(yaml.safe_load(Path(args.space).read_text())["train"])
    for item in filter(None, args.trial.split(",")):
        key, _, val = item.partition("=")
        set_dotted(d, key.strip(), yaml.safe_load(val))
    d["epochs"] = args.epochs
    res = {"command": " ".join(sys.argv), "space": args.space, "trial": args.trial, "runs": {}}
    warm_run(d, args.warm_epochs)
    budgets = [float(b) for b in args.budgets.split(",")]
    for seed in [int(s) for s in args.seeds.split(",")]:
        for b in budgets:
            run = copy.deepcopy(d)
            set_dotted(run, "triaccel.precision.plan_budget", b)
            label = f"plan_budget {b:g}"
            print(f"--- {label} seed {seed}", flush=True)
            r = train(run, seed)
            print(f"    epochs {['%.2f' % t for t in r['epoch_times']]}  compile {r['compile_s']}  "
                  f"graphs {r['compiled_graphs']}  plans {len(r.get('plan_changes', []))}  "
                  f"val {r['val_acc']:.2f}  eff {r['efficiency']:.2f}", flush=True)
            res["runs"].setdefault(label, {})[str(seed)] = r
            res["summary"] = {lab: {k: stats([s[k] for s in per.values()])
                                    for k in ("epoch_time_last5_s", "efficiency", "val_acc", "peak_mem_gib")}
                              for lab, per in res["runs"].items()}
            write(args.out, res)


if __name__ == "__main__":
    main()
