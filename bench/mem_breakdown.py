"""Where a captured static step's peak memory goes, and what the score does across small batches
(issue 12: at B=96 the captured step's peak was 0.52 GiB against 0.40 eager, and only part of
the difference was the graphs' pool).

    python3 bench/mem_breakdown.py --data-dir /tmp/cifar --out bench/results/mem_breakdown/h200_mem_breakdown.json

For each ``--batches`` B: the shipped static config (``configs/cifar10_jpeg_resnet18.yaml``),
``--dtype`` AMP, captured, ``--epochs`` epochs (after one untimed warm-up run): the run's
figures (efficiency, epoch time, peak, the pool the meter adds) and then the allocator's live
blocks at the last epoch's end, grouped by pool and by the code that allocated them (the
allocator's history records each block's stack), the largest first. ``--cublas-workspace-mib 4``
sets the run's ``cublas_workspace_mib`` (the committed results before it existed were made with
``CUBLAS_WORKSPACE_CONFIG=:4096:1`` in the environment, which is the same size).
"""
from __future__ import annotations

import argparse
import collections
import copy
import gc
import os
import sys
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402
from search_vs_static import warm_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20


def where(frames: list[dict]) -> str:
    """The first frame of ours (triaccel/, kernels/) or torch's nn modules, else the innermost Python one."""
    py = [f for f in frames if f.get("filename", "").endswith(".py")]
    for f in py:
        fn = f["filename"]
        if "/triaccel/" in fn or "/kernels/" in fn:
            return f"{fn.split('/')[-2]}/{fn.split('/')[-1]}:{f['line']} {f['name']}"
    for f in py:
        if "/torch/" in f["filename"]:
            return f"torch/{f['filename'].split('/torch/')[-1]}:{f['line']} {f['name']}"
    c = [f for f in frames if f.get("name")]
    return c[0]["name"][:80] if c else "?"


def live_blocks(graph_pool) -> dict:
    segs = torch.cuda.memory_snapshot()
    by_pool = collections.defaultdict(lambda: {"segments": 0, "reserved_mib": 0.0, "allocated_mib": 0.0})
    by_site = collections.Counter()
    for s in segs:
        pid = tuple(s.get("segment_pool_id", (0, 0)))
        name = "graphs" if graph_pool is not None and pid == tuple(graph_pool) else ("default" if pid == (0, 0) else str(pid))
        p = by_pool[name]
        p["segments"] += 1
        p["reserved_mib"] += s["total_size"] / MiB
        p["allocated_mib"] += s["allocated_size"] / MiB
        for b in s["blocks"]:
            if b["state"] == "active_allocated":
                by_site[(name, where(b.get("frames", [])))] += b["size"]
    top = [{"pool": k[0], "site": k[1], "mib": round(v / MiB, 2)} for k, v in by_site.most_common(25)]
    return {"pools": dict(by_pool), "live_by_site": top}


def run(base: dict, batch: int, dtype: str, epochs: int, checkpointing: bool = False,
        workspace_mib: int | None = None) -> dict:
    from triaccel.config import TrainConfig, from_dict
    from triaccel.control import build_trainer
    from triaccel.trainer import Callback

    d = copy.deepcopy(base)
    d.update(mode="amp", amp_dtype=dtype, batch_size=batch, capture=True, epochs=epochs, seed=0, evaluate_test=False,
             checkpointing=checkpointing, cublas_workspace_mib=workspace_mib)
    d["tracking"] = {"enabled": False}

    class Snapshot(Callback):  # the live blocks at the last epoch's end, while the run's graphs and workspaces live
        blocks: dict = {}

        def on_epoch_end(self, trainer, metrics):
            if trainer.epoch == trainer.cfg.epochs:
                self.blocks = live_blocks(trainer.graphs.pool if trainer.graphs is not None else None)
                self.blocks["cublas_workspace_config"] = os.environ.get("CUBLAS_WORKSPACE_CONFIG")

    snap = Snapshot()
    torch.cuda.memory._record_memory_history(max_entries=200000)
    t = build_trainer(from_dict(TrainConfig, d), callbacks=[snap], log=lambda *a: None)
    s = t.fit()
    out = {k: s[k] for k in ("val_acc", "epoch_time_last5_s", "peak_mem_gib", "efficiency")}
    last = t.history.epochs[-1]
    out.update(graph_pool_gib=last.get("graph_pool_gib"), peak_reserved_gib=last.get("peak_reserved_gib"),
               peak_alloc_raw_gib=last.get("peak_alloc_raw_gib"), captures=t.graphs.captures if t.graphs else None,
               allocated_now_mib=torch.cuda.memory_allocated() / MiB,
               params_mib=sum(p.numel() * p.element_size() for p in t.model.parameters()) / MiB)
    out.update(snap.blocks)
    torch.cuda.memory._record_memory_history(enabled=None)
    del t
    gc.collect()
    torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="48,64,96,128,192")
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--checkpointing", action="store_true", help="activation checkpointing per block")
    ap.add_argument("--cublas-workspace-mib", type=int, default=None,
                    help="the run's cublas_workspace_mib (default: torch's workspace, whatever the shipped config says)")
    args = ap.parse_args()
    base = yaml.safe_load((ROOT / "configs" / "cifar10_jpeg_resnet18.yaml").read_text())
    base["data"]["data_dir"] = args.data_dir
    base.setdefault("optim", {})["warmup_epochs"] = 1
    warm_run({**base, "mode": "amp", "amp_dtype": args.dtype, "batch_size": 96, "capture": True, "tracking": {"enabled": False}}, 1)
    res = {"what": __doc__.split("\n\n")[0], "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
           "cublas_workspace_mib": args.cublas_workspace_mib,
           "dtype": args.dtype, "epochs": args.epochs, "checkpointing": args.checkpointing, "runs": {}}
    for b in [int(x) for x in args.batches.split(",")]:
        r = run(base, b, args.dtype, args.epochs, args.checkpointing, args.cublas_workspace_mib)
        res["runs"][str(b)] = r
        print(f"B={b}: eff {r['efficiency']:.1f} val {r['val_acc']:.2f} epoch {r['epoch_time_last5_s']:.3f}s "
              f"peak {r['peak_mem_gib']:.3f} GiB pool(extra) {r['graph_pool_gib']} pools {r['pools']}", flush=True)
        for row in r["live_by_site"][:6]:
            print(f"   {row['pool']:8s} {row['mib']:8.2f} MiB  {row['site']}")
        write(args.out, res)


if __name__ == "__main__":
    main()
