"""§3.2 curvature controller: smoothed per-layer lambda_max -> per-layer lr scale and promotion.

    eta_l = eta_0 / (1 + alpha * lambda_l),   lambda_l = EMA over refreshes of max(0, max_i lambda_i(H_l))

``lr_rule: normalized`` makes alpha and tau_curv scale-free: with r_l = lambda_l / median_l
lambda_l, eta_l = eta_0 / (1 + alpha * max(0, r_l - 1)), floored at ``min_lr_scale``: a layer
at or below the median curvature keeps eta_0, the sharpest are damped, none starves. The same
alpha then means the same for the Hessian probe and the Fisher proxy (whose values differ by
orders of magnitude) and across models, and the promotion compares r_l with tau_curv.

Negative curvature is clipped at 0 (eta/(1+alpha*lambda) would exceed eta_0 and can blow up
for lambda -> -1/alpha); the EMA damps the noise of a few-iteration estimate. The estimates
come from ``triaccel.curvature`` (Hessian power iteration, or the Fisher proxy) every
``every`` optimizer steps; this class only turns numbers into decisions.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from triaccel.config import CurvatureConfig
from triaccel.controllers.stats import WindowStats


@dataclass(frozen=True)
class CurvatureDecision:
    lam: tuple  # smoothed lambda_max per layer
    lr_scale: tuple  # eta_l / eta_0 per layer
    promote: tuple  # tau_curv exceeded by the lr rule's quantity: r_l (normalized) or lambda_l (paper)


class CurvatureController:
    def __init__(self, cfg: CurvatureConfig, n_layers: int):
        self.cfg = cfg
        self.lam: list[float | None] = [None] * n_layers
        self.refreshes = 0

    def due(self, step: int) -> bool:
        """Refresh on the first step and then every ``every`` optimizer steps."""
        return step == 1 or step % self.cfg.every == 0

    def decide(self, stats: WindowStats) -> CurvatureDecision:
        """Reads ``topk`` of a curvature refresh: each layer's top-k eigenvalue estimates."""
        topk = stats.topk
        if topk is None or len(topk) != len(self.lam):
            raise ValueError(f"expected {len(self.lam)} layers, got {0 if topk is None else len(topk)}")
        e = self.cfg.ema
        for i, eig in enumerate(topk):
            lam = max(0.0, max(eig)) if len(eig) else 0.0
            self.lam[i] = lam if self.lam[i] is None else e * self.lam[i] + (1 - e) * lam
        self.refreshes += 1
        return self._decision()

    def _decision(self) -> CurvatureDecision:
        c = self.cfg
        lam = tuple(0.0 if x is None else x for x in self.lam)
        if c.lr_rule == "paper":
            return CurvatureDecision(lam, tuple(1.0 / (1.0 + c.alpha * x) for x in lam),
                                     tuple(x > c.tau_curv for x in lam))
        pos = sorted(x for x in lam if x > 0)
        med = statistics.median(pos) if pos else 0.0
        r = tuple(x / med if med > 0 else 0.0 for x in lam)
        scale = tuple(max(c.min_lr_scale, 1.0 / (1.0 + c.alpha * max(0.0, x - 1.0))) for x in r)
        return CurvatureDecision(lam, scale, tuple(x > c.tau_curv for x in r))

    def state_dict(self) -> dict:
        return {"lam": list(self.lam), "refreshes": self.refreshes}

    def load_state_dict(self, s: dict) -> None:
        self.lam, self.refreshes = list(s["lam"]), s["refreshes"]
