"""The training loss and accuracy counts, the paper's efficiency score (§4.2) and the per-run
summaries built on it."""
from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F


def example_loss_sum(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy summed over the examples, each example's loss the mean over its target
    positions: classification (logits [B, C], targets [B]) and sequences (logits [B, T, V], targets
    [B, T]: a language model's next tokens) alike. Divided by the example count it is the mean loss
    per position, so the trainer's exact accumulation (per-example sums over the window's examples)
    holds for both."""
    loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), reduction="sum")
    return loss if y.dim() == 1 else loss / y[0].numel()


def correct_count(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Target positions where the arg-max logit is the target: top-1 accuracy's numerator, per
    image for a classifier, per next token for a language model (divide by ``y.numel()``)."""
    return (out.argmax(-1) == y).sum()


def efficiency_score(acc_pct: float, epoch_time_s: float, peak_vram_gb: float) -> float:
    """Score = Acc(%) / (Time(s) x Memory) x 100, with Memory = peak VRAM in GB x 100.

    The paper (§4.2) writes Memory as "Memory Usage (%)" but its Table 1 is reproduced only
    when Memory is the tabulated peak VRAM in GB times 100: for ResNet-18 FP32,
    77.0 / (21.0 x 35) x 100 = 10.48. ``epoch_time_s`` is the mean epoch wall time of the
    last five epochs (``last5_mean``). Higher is better.
    """
    if epoch_time_s <= 0 or peak_vram_gb <= 0:
        raise ValueError(f"epoch_time_s and peak_vram_gb must be > 0, got {epoch_time_s}, {peak_vram_gb}")
    return acc_pct / (epoch_time_s * peak_vram_gb * 100.0) * 100.0


def last5_mean(values: list[float]) -> float:
    """Mean of the last five values (fewer if the run is shorter), as the paper averages epoch time."""
    if not values:
        raise ValueError("no values")
    return statistics.fmean(values[-5:])


def steady_epoch_time(epoch_times: list[float]) -> float:
    """The epoch time the score uses: the mean of the last five epochs (§4.2), never counting the
    first epoch of a run that has more than one. The first epoch holds one-off costs (cuDNN
    autotuning of every new shape, the memory-elastic batch's exploration), as its peak memory
    does, which ``run_peak`` leaves out too. For runs of six epochs or more this is exactly the
    paper's last-five mean; for shorter ones (a 4-epoch search) it stops a one-off cost of several
    seconds from deciding the ranking (an H200: static AMP B=512 runs 0.9 s epochs after a 4 s first one).
    """
    return last5_mean(epoch_times[1:] if len(epoch_times) > 1 else epoch_times)


def run_peak(epoch_peaks: list[float]) -> float:
    """The run's peak memory: the largest epoch peak after the first epoch.

    The first epoch also holds one-off allocations (cuDNN autotuning workspaces, lazily
    created optimizer state), reported apart as ``peak_mem_first_epoch_gib``, just as
    first-step time is reported apart from step time. A one-epoch run uses its only epoch.
    """
    return max(epoch_peaks[1:]) if len(epoch_peaks) > 1 else epoch_peaks[0]
