"""Learning-rate schedule: linear warm-up, then cosine decay to zero, counted in examples.

Counting examples rather than optimizer steps keeps the schedule right when the
memory-elastic controller changes the batch size mid-run. The trainer advances it only on
updates that happened: a step the GradScaler skipped does not move it (the guide's rule).
Nearly stateless, in timm's manner: the state is one integer.
"""
from __future__ import annotations

import math


class WarmupCosine:
    def __init__(self, total_examples: int, warmup_examples: int):
        if total_examples <= 0:
            raise ValueError("total_examples must be > 0")
        self.total = int(total_examples)
        self.warmup = int(min(max(warmup_examples, 0), total_examples))
        self.done = 0  # examples of completed (not skipped) updates

    def factor(self, n_update: int) -> float:
        """lr multiplier for the update that will consume ``n_update`` examples."""
        s = self.done
        if s < self.warmup:
            return min(1.0, (s + n_update) / self.warmup)
        span = max(1, self.total - self.warmup)
        prog = min(1.0, (s - self.warmup) / span)
        return 0.5 * (1.0 + math.cos(math.pi * prog))

    def step(self, n_update: int) -> None:
        self.done += int(n_update)

    def state_dict(self) -> dict:
        return {"done": self.done}

    def load_state_dict(self, s: dict) -> None:
        self.done = int(s["done"])
