"""§3.1 precision controller: per-layer FP16 / BF16 / FP32 from the gradient-variance EMA.

    level_l = FP16 if v_l < tau_low;  BF16 if tau_low <= v_l < tau_high;  FP32 if v_l >= tau_high

with four additions that keep it stable, safe and worth its cost:
- hysteresis: to move up across a threshold tau, v must reach tau*(1+h); to move down it must
  fall below tau*(1-h), so a layer sitting on a threshold does not flip every window;
- minimum dwell: after a change a layer keeps its level for ``min_dwell`` windows;
- promotions: a layer the curvature controller flags (``WindowStats.promote``: tau_curv exceeded
  by the quantity its lr_rule uses, lambda / median lambda by default) runs one level higher for
  that window (§3.2); a layer whose fp16 gradients overflowed where the GradScaler's scale has
  fallen to ``overflow_scale`` (1: the gradients themselves past fp16's range) is moved to BF16 at
  once, dwell or not (safety beats stability). Overflows above that scale are the scaler finding
  its scale, and its skipped step is all they need;
- a plan budget: where a plan not run before is not affordable (``WindowStats.new_plan``, from
  ``PlanBudget``), the window's moves are held and the plan stays, an overflow's move excepted. Plans
  already run cost nothing again (their compiled graphs are cached), so moving back to one is free.

``scale: relative`` divides each variance by this window's median over layers before the
thresholds apply, so a tau range means the same for every model (the paper's absolute tau
depends on the model, the loss scale and the stage of training).

The EMA itself (v <- beta v + (1-beta) Var[grad]) is updated on the device every step by the
gradient-statistics kernel; this class receives v once per control window (``WindowStats``).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from triaccel.config import PrecisionConfig
from triaccel.controllers.stats import WindowStats

LEVELS = ("fp16", "bf16", "fp32")


@dataclass(frozen=True)
class PrecisionDecision:
    levels: tuple  # effective level name per layer
    base: tuple  # level from the variance alone (with hysteresis and dwell)
    reasons: tuple  # per layer: "", "curvature", "overflow", "held"
    changed: int  # layers whose effective level changed this window
    held: int = 0  # layers whose move the plan budget held (reason "held")
    new_plan: bool = False  # the effective plan is one not run before in this process


def _level(v: float, lo: float, hi: float) -> int:
    return 0 if v < lo else (1 if v < hi else 2)


class PrecisionController:
    def __init__(self, cfg: PrecisionConfig, n_layers: int, initial: str = "bf16"):
        self.cfg = cfg
        self.base = [LEVELS.index(initial)] * n_layers
        self.effective = list(self.base)
        self.last_change = [-(10 ** 9)] * n_layers  # window index of each layer's last base change
        self.plans = {tuple(self.effective)}  # the effective plans run in this process

    def decide(self, stats: WindowStats) -> PrecisionDecision:
        """Reads ``variance``, ``overflow`` and ``promote`` of a control window (``window`` counts dwell)."""
        c, h = self.cfg, self.cfg.hysteresis
        n, window, variance = len(self.base), stats.window, stats.variance
        if variance is None or len(variance) != n:
            raise ValueError(f"expected {n} variances, got {0 if variance is None else len(variance)}")
        overflow, promote = stats.overflow, stats.promote
        if overflow is not None and stats.loss_scale is not None and stats.loss_scale > c.overflow_scale:
            overflow = None  # the scaler finding its scale, not a layer past fp16's range
        reasons = [""] * n
        before = list(self.base), list(self.last_change)
        new_eff = []
        if c.scale == "relative":
            pos = sorted(v for v in variance if v > 0)
            med = statistics.median(pos) if pos else 0.0
            variance = [v / med if med > 0 else 0.0 for v in variance]
        for i, v in enumerate(variance):
            cur = self.base[i]
            if c.overflow_promote and overflow is not None and overflow[i] and cur == 0:
                self.base[i], self.last_change[i] = 1, window
                reasons[i] = "overflow"
            elif window - self.last_change[i] >= c.min_dwell:
                up = _level(v, c.tau_low * (1 + h), c.tau_high * (1 + h))  # level v has clearly reached
                down = _level(v, c.tau_low * (1 - h), c.tau_high * (1 - h))  # level v has not clearly left
                target = up if cur < up else (down if cur > down else cur)
                if target != cur:
                    self.base[i], self.last_change[i] = target, window
            eff = self.base[i]
            if promote is not None and promote[i] and eff < 2:
                eff += 1
                reasons[i] = reasons[i] or "curvature"
            new_eff.append(eff)
        held = 0
        if not stats.new_plan and tuple(new_eff) not in self.plans:
            held = self._hold(new_eff, reasons, *before)
        new_plan = tuple(new_eff) not in self.plans
        self.plans.add(tuple(new_eff))
        changed = sum(a != b for a, b in zip(new_eff, self.effective))
        self.effective = new_eff
        return PrecisionDecision(tuple(LEVELS[e] for e in new_eff), tuple(LEVELS[b] for b in self.base),
                                 tuple(reasons), changed, held, new_plan)

    def _hold(self, new_eff: list, reasons: list, base: list, last_change: list) -> int:
        """Undoes this window's moves but an overflow's: each such layer keeps its level, base and dwell
        as they were. Returns how many layers would have moved."""
        held = 0
        for i, r in enumerate(reasons):
            if r == "overflow":
                continue
            if new_eff[i] != self.effective[i]:
                held += 1
                reasons[i] = "held"
            new_eff[i], self.base[i], self.last_change[i] = self.effective[i], base[i], last_change[i]
        return held

    def state_dict(self) -> dict:
        return {"base": list(self.base), "effective": list(self.effective), "last_change": list(self.last_change)}

    def load_state_dict(self, s: dict) -> None:
        self.base, self.effective, self.last_change = list(s["base"]), list(s["effective"]), list(s["last_change"])
        self.plans = {tuple(self.effective)}  # a resumed process has compiled nothing yet


class PlanBudget:
    """What new precision plans may cost once: their compile seconds, against ``budget`` of the run's
    predicted training time (``triaccel.precision.plan_budget``).

    The control loop calls ``start`` after the run's first step (the compile seconds so far are the
    first plan's, and predict what the next plan costs), ``observe`` at every control window (the
    run's compile seconds, the window's host seconds and examples), and ``took_new_plan`` when the
    precision controller moved to a plan not run before: the compile seconds of the next window are
    then that plan's, spent and the prediction for the next. The run's time is its examples at the
    fastest rate a window has shown, compile seconds left out. A run that compiles nothing spends
    nothing: every new plan is affordable, unless the budget is 0.
    """

    def __init__(self, budget: float, run_examples: int | None):
        self.budget, self.run_examples = budget, run_examples
        self.spent = 0.0  # compile seconds of the new plans taken
        self.switch_s: float | None = None  # predicted compile seconds of the next new plan
        self.per_example: float | None = None  # the fastest seconds per example of a window
        self.compile_s = 0.0  # the run's compile seconds at the last observation
        self.pending = False  # a new plan was taken: the next window compiles it

    def start(self, compile_s: float) -> None:
        self.switch_s, self.compile_s = compile_s, compile_s

    def took_new_plan(self) -> None:
        self.pending = True

    def observe(self, compile_s: float, seconds: float | None, examples: int) -> None:
        grown, self.compile_s = max(0.0, compile_s - self.compile_s), compile_s
        if self.pending:
            self.spent += grown
            if grown > 0:  # a plan that compiled nothing (the same graph: fp16 run as bf16 on a CPU) predicts nothing
                self.switch_s = grown
            self.pending = False
        if seconds is not None and examples > 0 and seconds > grown:
            rate = (seconds - grown) / examples
            self.per_example = rate if self.per_example is None else min(self.per_example, rate)

    @property
    def run_s(self) -> float | None:
        if self.per_example is None or self.run_examples is None:
            return None
        return self.run_examples * self.per_example

    def affordable(self) -> bool:
        if self.budget <= 0:
            return False
        run_s = self.run_s
        if run_s is None or self.switch_s is None:
            return True
        return self.spent + self.switch_s <= self.budget * run_s
