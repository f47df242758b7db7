"""Controller trajectories as files a person would rather look at than read.

``write_trajectory`` saves, per control window: JSON (everything), a long CSV (one row per
window and layer), and three plots: batch size and memory over steps; a layer x window
heatmap of precision; per-layer lambda and lr scale. A search trial writes the JSON and CSV with
every epoch's checkpoint and leaves the plots to the driver (``plots_from_json``), which draws
them once per trial when it logs the trial to MLflow: drawing them at every epoch would cost a trial
about 0.45 s an epoch (2-core CPU), several times the quickstart's epoch.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

LEVEL_CODE = {"fp16": 0, "bf16": 1, "fp32": 2}


def write_trajectory(traj: list[dict], names: list[str], folder: Path, plots: bool = True) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    p = folder / "trajectory.json"
    p.write_text(json.dumps({"layers": names, "windows": traj}))
    out.append(p)
    p = folder / "trajectory.csv"
    with p.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["window", "step", "epoch", "t_s", "batch_size", "micro_batch", "peak_mem_gib", "usage_frac",
                    "batch_action", "layer", "dtype", "variance_ema", "lambda", "lr_scale"])
        for r in traj:
            for i, name in enumerate(names):
                w.writerow([r["window"], r["step"], r["epoch"], r.get("t_s", ""), r["batch_size"], r["micro_batch"],
                            f"{r['peak_mem_gib']:.5f}", f"{r.get('usage_frac', float('nan')):.4f}",
                            r.get("batch_action", ""), name, r["levels"][i], f"{r['variance'][i]:.4e}",
                            f"{r['lam'][i]:.4e}", f"{r['lr_scale'][i]:.5f}"])
    out.append(p)
    if traj and plots:
        out += _plots(traj, names, folder)
    return out


def plots_from_json(trajectory_json: Path, folder: Path) -> list[Path]:
    """The plots of a trajectory.json that ``write_trajectory(..., plots=False)`` wrote."""
    data = json.loads(Path(trajectory_json).read_text())
    folder.mkdir(parents=True, exist_ok=True)
    return _plots(data["windows"], data["layers"], folder) if data["windows"] else []


def _save(fig, path: Path) -> None:
    """``fig`` as a PNG cropped to what it draws (labels included): one layout pass, where
    tight_layout and then savefig drew the figure twice, most of a search driver's time per trial."""
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.05)
    plt.close(fig)


def _plots(traj, names, folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    steps = [r["step"] for r in traj]
    files = []

    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.step(steps, [r["batch_size"] for r in traj], where="post", label="batch size B", color="tab:blue")
    ax.step(steps, [r["micro_batch"] for r in traj], where="post", label="micro-batch", color="tab:cyan", ls="--")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("examples")
    ax2 = ax.twinx()
    ax2.plot(steps, [r["peak_mem_gib"] for r in traj], color="tab:red", label="window peak memory")
    ax2.set_ylabel("GiB", color="tab:red")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title("Memory-elastic batch")
    files.append(folder / "batch_memory.png")
    _save(fig, files[-1])

    grid = np.array([[LEVEL_CODE[lv] for lv in r["levels"]] for r in traj]).T
    fig, ax = plt.subplots(figsize=(8, max(2.5, 0.22 * len(names) + 1)))
    cmap = matplotlib.colors.ListedColormap(["#4daf4a", "#377eb8", "#e41a1c"])
    im = ax.imshow(grid, aspect="auto", cmap=cmap, vmin=-0.5, vmax=2.5, interpolation="nearest",
                   extent=(steps[0] - 0.5, steps[-1] + 0.5, len(names) - 0.5, -0.5))
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=6)
    ax.set_xlabel("optimizer step")
    cb = fig.colorbar(im, ticks=[0, 1, 2])
    cb.ax.set_yticklabels(["FP16", "BF16", "FP32"])
    ax.set_title("Per-layer precision")
    files.append(folder / "precision_heatmap.png")
    _save(fig, files[-1])

    lam = np.array([r["lam"] for r in traj])
    lrs = np.array([r["lr_scale"] for r in traj])
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
    for i in range(len(names)):
        a1.plot(steps, lam[:, i], lw=0.8)
        a2.plot(steps, lrs[:, i], lw=0.8)
    a1.set_yscale("symlog", linthresh=1e-3)
    a1.set_title("lambda_max per layer (smoothed)")
    a2.set_title("lr scale eta_l / eta_0 per layer")
    for a in (a1, a2):
        a.set_xlabel("optimizer step")
    files.append(folder / "curvature_lr.png")
    _save(fig, files[-1])
    return files
