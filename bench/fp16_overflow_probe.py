"""Does static fp16 AMP recover from the non-finite losses that stop a run as diverged? (issue 31)

    python3 bench/fp16_overflow_probe.py --space spaces/cifar10_efficientnet_b0.yaml --data-dir /tmp/cifar \
        --spec fp16:96:captured:compiled --epochs 8 --seeds 0 --out $OUT/fp16_probe.json

The static run of ``--spec`` (bench/search_vs_static.py's static runs) trains with the trainer's
divergence check off: each step's non-finite loss is counted and left out of the epoch's loss, as a
plain PyTorch loop with a GradScaler would go on (the scaler skips the update). Reported per epoch:
non-finite losses, skipped updates, validation accuracy; a run that recovers ends near the bf16 run's
accuracy, one that does not stays at chance with every update skipped.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402
from search_vs_static import fit_alone, read_space, static_runs  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--space", required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--spec", default="fp16:96:captured:compiled")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    args.imagefolder, args.tuned = True, None  # read_space: the JPEG pack as an ImageFolder
    from triaccel.trainer import Trainer

    space = read_space(args)
    label, d = static_runs(space, args.epochs)(args.spec)
    d.setdefault("data", {})["data_dir"] = args.data_dir
    counts = {}
    step = Trainer.train_step

    def counted_step(self, idx):
        loss, info = step(self, idx)
        bad = ~torch.isfinite(loss)
        if self.epoch not in counts:  # one device counter an epoch, added to without a sync
            counts[self.epoch] = torch.zeros((), dtype=torch.int64, device=loss.device)
        counts[self.epoch] += bad
        return torch.where(bad, torch.zeros_like(loss), loss), info

    Trainer.train_step = counted_step
    Trainer._check_finite = lambda self, loss_sum: None
    res = {"what": __doc__.split("\n\n")[0], "spec": args.spec, "label": label, "runs": []}
    for seed in (int(s) for s in args.seeds.split(",")):
        counts.clear()
        t, s, wall = fit_alone(d, seed)
        run = {"seed": seed, "val_acc": s["val_acc"], "efficiency": s["efficiency"], "wall_s": wall,
               "per_epoch": [{"epoch": e["epoch"], "val_acc": e["val_acc"], "skipped_steps": e["skipped_steps"],
                              "nonfinite_losses": int(counts.get(i, 0)), "train_loss": e["train_loss"]}
                             for i, e in enumerate(t.history.epochs)]}
        print(run, flush=True)
        res["runs"].append(run)
        write(args.out, res)


if __name__ == "__main__":
    main()
