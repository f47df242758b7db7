"""§3.2 curvature controller: smoothed per-layer lambda_max -> per-layer lr scale and promotion.

    eta_l = eta_0 / (1 + alpha * lambda_l),   lambda_l = EMA over refreshes of max(0, max_i lambda_i(H_l))

Negative curvature is clipped at 0 (eta/(1+alpha*lambda) would exceed eta_0 and can blow up
for lambda -> -1/alpha); the EMA damps the noise of a few-iteration estimate. The estimates
come from ``triaccel.curvature`` (Hessian power iteration, or the Fisher proxy) every
``every`` optimizer steps; this class only turns numbers into decisions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from triaccel.config import CurvatureConfig


@dataclass(frozen=True)
class CurvatureDecision:
    lam: tuple  # smoothed lambda_max per layer
    lr_scale: tuple  # eta_l / eta_0 per layer
    promote: tuple  # lambda_l > tau_curv


class CurvatureController:
    def __init__(self, cfg: CurvatureConfig, n_layers: int):
        self.cfg = cfg
        self.lam: list[float | None] = [None] * n_layers
        self.refreshes = 0

    def due(self, step: int) -> bool:
        """Refresh on the first step and then every ``every`` optimizer steps."""
        return step == 1 or step % self.cfg.every == 0

    def update(self, topk: Sequence[Sequence[float]]) -> CurvatureDecision:
        if len(topk) != len(self.lam):
            raise ValueError(f"expected {len(self.lam)} layers, got {len(topk)}")
        e = self.cfg.ema
        for i, eig in enumerate(topk):
            lam = max(0.0, max(eig)) if len(eig) else 0.0
            self.lam[i] = lam if self.lam[i] is None else e * self.lam[i] + (1 - e) * lam
        self.refreshes += 1
        return self.decision()

    def decision(self) -> CurvatureDecision:
        lam = tuple(0.0 if x is None else x for x in self.lam)
        return CurvatureDecision(lam, tuple(1.0 / (1.0 + self.cfg.alpha * x) for x in lam),
                                 tuple(x > self.cfg.tau_curv for x in lam))

    def state_dict(self) -> dict:
        return {"lam": list(self.lam), "refreshes": self.refreshes}

    def load_state_dict(self, s: dict) -> None:
        self.lam, self.refreshes = list(s["lam"]), s["refreshes"]
