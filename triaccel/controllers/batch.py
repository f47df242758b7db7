"""§3.3 memory-elastic batch controller.

    B <- B + delta_up    if usage < rho_low  * MemMax
    B <- B - delta_down  if usage > rho_high * MemMax   (at most delta_down: see below)

``usage`` is the window's allocator peak (bytes); MemMax the run's budget. Additions that
keep it from oscillating or running into the wall:
- an online least-squares fit peak ~ a + b * micro_batch predicts the peak of a bigger batch;
  the controller does not grow into a predicted peak above rho_high * MemMax;
- the same fit bounds a shrink: the batch steps down by delta_down at most, and no further
  than the largest size predicted to fit under rho_high (the fixed step overshot on the H200:
  96 -> 32 where about 48 fitted, tripling the epoch time);
- a micro-batch that ran out of memory is a ceiling the controller never grows back to;
- ``cooldown`` windows after each change, so the next measurement sees the new size;
- ``device_pressure`` (the whole device nearly full, from NVML, when trials share a GPU)
  blocks growth.

Modes: ``paper``: the batch per update B changes (the trainer rescales the lr by ``lr_rule``);
``constant``: B stays, only the micro-batch (the memory-relevant size) is elastic, and exact
accumulation keeps the optimisation unchanged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from triaccel.config import BatchConfig


@dataclass(frozen=True)
class BatchDecision:
    batch: int  # examples per optimizer update
    micro_batch: int  # examples per forward/backward
    action: str  # "grow" | "shrink" | "hold" | "cooldown" | "ceiling" | "predicted" | "pressure"
    usage_frac: float  # window peak / budget


class BatchController:
    def __init__(self, cfg: BatchConfig, batch: int, micro_batch: int, budget_bytes: float):
        if budget_bytes <= 0:
            raise ValueError("budget_bytes must be > 0")
        self.cfg = cfg
        self.batch, self.micro = batch, micro_batch
        self.budget = float(budget_bytes)
        self.ceiling: int | None = None  # smallest micro-batch that ran out of memory
        self.cool = 0
        self.obs: list[tuple[int, float]] = []  # (micro_batch, peak bytes)

    @property
    def elastic(self) -> int:
        return self.batch if self.cfg.mode == "paper" else self.micro

    def _fit(self) -> tuple[float, float] | None:
        """Least-squares peak ~ a + b * micro_batch over recent windows (the worst peak per size)."""
        pts = {}
        for m, p in self.obs[-20:]:
            pts[m] = max(p, pts.get(m, 0.0))
        if len(pts) < 2:
            return None
        xs, ys = list(pts), list(pts.values())
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        vx = sum((x - mx) ** 2 for x in xs)
        if vx == 0:
            return None
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / vx
        return my - b * mx, b

    def _predict(self, size: int) -> float | None:
        fit = self._fit()
        return None if fit is None else fit[0] + fit[1] * size

    def _largest_fitting(self, limit: float) -> int | None:
        fit = self._fit()
        if fit is None or fit[1] <= 0:
            return None
        return int((limit - fit[0]) // fit[1])

    def update(self, peak_bytes: float, device_pressure: bool = False) -> BatchDecision:
        c = self.cfg
        frac = peak_bytes / self.budget
        self.obs.append((self.micro, float(peak_bytes)))
        size = self.elastic
        if self.cool > 0:
            self.cool -= 1
            return self._decide(size, "cooldown", frac)
        if frac > c.rho_high:
            # delta_down is the largest step: where the fit knows a size that fits under rho_high,
            # stop there instead of overshooting (96 -> 64 -> 32 when about 43 fits).
            target = size - c.delta_down
            fits = self._largest_fitting(c.rho_high * self.budget)
            if fits is not None:
                target = max(target, min(size - 1, fits))
            return self._decide(max(c.min_batch, target), "shrink", frac)
        if frac < c.rho_low:
            grown = min(c.max_batch, size + c.delta_up)
            if self.cfg.mode == "constant":
                grown = min(grown, self.batch)
            if device_pressure:
                return self._decide(size, "pressure", frac)
            if self.ceiling is not None and grown >= self.ceiling:
                grown = self.ceiling - 1
                if grown <= size:
                    return self._decide(size, "ceiling", frac)
            pred = self._predict(grown if c.mode == "constant" else min(grown, self.micro_cap(grown)))
            if pred is not None and pred > c.rho_high * self.budget:
                return self._decide(size, "predicted", frac)
            return self._decide(grown, "grow" if grown != size else "hold", frac)
        return self._decide(size, "hold", frac)

    def micro_cap(self, batch: int) -> int:
        return batch if self.ceiling is None else min(batch, self.ceiling - 1)

    def _decide(self, size: int, action: str, frac: float) -> BatchDecision:
        if self.cfg.mode == "paper":
            if size != self.batch:
                self.cool = self.cfg.cooldown
            self.batch = size
            self.micro = self.micro_cap(size)
        else:
            if size != self.micro:
                self.cool = self.cfg.cooldown
            self.micro = size
        return BatchDecision(self.batch, max(1, self.micro), action, frac)

    def on_oom(self, micro_batch: int) -> None:
        """A micro-batch of this size ran out of memory: never grow back to it."""
        self.ceiling = micro_batch if self.ceiling is None else min(self.ceiling, micro_batch)
        self.micro = max(1, micro_batch // 2)
        if self.cfg.mode == "paper":
            self.batch = max(self.cfg.min_batch, min(self.batch, self.ceiling - 1))
        self.cool = self.cfg.cooldown

    def lr_factor(self, initial_batch: int) -> float:
        """Paper mode: the lr follows the batch by ``lr_rule``; constant mode: 1."""
        if self.cfg.mode != "paper" or self.cfg.lr_rule == "none":
            return 1.0
        r = self.batch / initial_batch
        return r if self.cfg.lr_rule == "linear" else math.sqrt(r)

    def state_dict(self) -> dict:
        return {"batch": self.batch, "micro": self.micro, "ceiling": self.ceiling, "cool": self.cool,
                "obs": list(self.obs[-20:])}

    def load_state_dict(self, s: dict) -> None:
        self.batch, self.micro, self.ceiling, self.cool = s["batch"], s["micro"], s["ceiling"], s["cool"]
        self.obs = [tuple(o) for o in s["obs"]]
