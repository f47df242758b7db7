"""§3.3 memory-elastic batch controller.

    B <- B + delta_up    if usage < rho_low  * MemMax
    B <- B - delta_down  if usage > rho_high * MemMax   (at most delta_down: see below)

``usage`` is the window's allocator peak (bytes); MemMax the run's budget. Additions that
keep it from oscillating or running into the wall:
- an online least-squares fit peak ~ a + b * micro_batch predicts the peak of a bigger batch;
  the controller does not grow into a predicted peak above rho_high * MemMax;
- the same fit bounds a shrink: the batch steps down by delta_down at most, and no further
  than the largest size predicted to fit under rho_high (a fixed step can overshoot: 96 -> 32
  where about 48 fits, tripling the epoch time);
- a micro-batch that ran out of memory sets a limit for the rest of the run (``oom_limit``:
  OOM_MARGIN of the failed size, a bucket with buckets): no later size goes above it, and it is
  saved with the controller's state, so a resumed run keeps it;
- ``cooldown`` windows after each change, so the next measurement sees the new size;
- ``pressure`` (the whole device nearly full, from NVML, when trials share a GPU)
  blocks growth.

Policies: ``paper`` is the rule above (the budget is the target). ``score`` targets the
efficiency score's denominator instead: the cost of an example, c(B) = (seconds / example)
x peak memory, measured in short windows early in the run. From B0 it first measures the next
smaller size (B0 / ``grow_factor``): its peak is below B0's, so exploring takes no memory the
start does not. It goes on down while c falls by more than ``explore_tol``. Otherwise it grows
from B0 only where the two sizes measured last predict that growth pays: the seconds per
example extrapolated along their power law, the peak along their line (``growth_pays``). A GPU
that is already busy at B0 (EfficientNet-B0 at 224 px on an H200: flat time per example)
predicts a higher cost and is never grown into 1.5x the memory; a host-bound step (ResNet-18
at 32 px: the time per example falls as 1/B) predicts a lower one and grows, each step measured
and predicted again. Then it settles on the cheapest size measured and holds it for
the rest of the run (leaving B0 only after measuring B0 a second time, each size keeping its
lower cost; of sizes within ``explore_tol`` of the cheapest, the one nearest B0: a
measured tie is noise, and moving off B0 for it costs EfficientNet-B0 at 224 px 1.6x the peak
memory for 1 % less time per example on an H200). Exploring early matters: the score takes the
run's peak memory over every epoch after the first, so a size tried late would cost for the whole run.

Exploring is paid for in the user's time: a new size costs once, its kernels chosen (or tuned) and its
graphs recorded. The controller predicts that one-off cost from the run's first step (the same work for
B0's shapes), then from each new size's first window (its seconds beyond the size's steady rate), and
moves to a new size only while the one-off seconds spent and predicted stay within ``explore_budget`` of
the run's predicted training time (``run_examples`` at B0's measured seconds per example). On an H200
a new size costs EfficientNet-B0 at 224 px 7-15 s, a third or more of a 25 s epoch: a one-epoch run
does not explore, a 15-epoch run explores one size. Without ``run_examples`` nothing is budgeted. The budget
stays a cap (rho_high of it, with the same fit and OOM ceiling); delta_down is the step
under it. On an H200, ResNet-18's step time is flat up to B~512 (the host issues the work)
and then grows with B, so c(B) falls until about there and rises after it.

Buckets (``batch_buckets``; by default whenever the step is captured or compiled): every size
the controller moves to, and every out-of-memory split, is one of a small set, so a captured or
compiled run records one graph per (bucket, precision plan) instead of one per size the rules
happen to produce (the paper rule's B + delta_up, a shrink to the fit's largest fitting size, a
halving). A move snaps toward its direction: growth to the smallest bucket above the current
size (within max_batch, the OOM ceiling and the predicted peak), a shrink or a split to the
largest bucket at or below its target. Below the smallest bucket sizes are free (exactness first).

Modes: ``paper``: the batch per update B changes (the trainer rescales the lr by ``lr_rule``);
``constant``: B stays, only the micro-batch (the memory-relevant size) is elastic, and exact
accumulation keeps the optimisation unchanged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from triaccel.config import MAX_BATCH, BatchConfig, TrainConfig
from triaccel.controllers.stats import WindowStats


def bucket_ladder(limit: int) -> tuple[int, ...]:
    """The default buckets: 1, 2, 4, then 8 * 2^k and 12 * 2^k (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, ...)
    up to ``limit``: steps of 1.33x and 1.5x, 2 * log2(limit / 8) + 3 sizes (23 up to 16,384)."""
    out = {1, 2, 4}
    b = 8
    while b <= limit:
        out.add(b)
        if b * 3 // 2 <= limit:
            out.add(b * 3 // 2)
        b *= 2
    return tuple(sorted(x for x in out if x <= limit))


class Buckets:
    """A sorted set of batch sizes; moves snap to it (pure)."""

    def __init__(self, sizes):
        self.sizes = tuple(sorted({int(x) for x in sizes}))
        if not self.sizes or self.sizes[0] < 1:
            raise ValueError("buckets must be sizes >= 1")

    def __contains__(self, size: int) -> bool:
        return size in self.sizes

    def down(self, size: int) -> int:
        """The largest bucket at or below ``size`` (``size`` itself below the smallest bucket)."""
        below = [b for b in self.sizes if b <= size]
        return below[-1] if below else size

    def up(self, size: int, limit: int | None = None) -> int:
        """The smallest bucket at or above ``size`` and at or below ``limit`` (if given), else the largest
        at or below ``limit``."""
        limit = self.sizes[-1] if limit is None else limit
        above = [b for b in self.sizes if size <= b <= limit]
        return above[0] if above else self.down(limit)

    def _splits(self, batch: int, m: int) -> bool:
        """Micro-batches of ``m`` split ``batch`` into buckets: the remainder is 0 or a bucket."""
        return batch % m == 0 or batch % m in self.sizes

    def micro_for(self, batch: int, limit: int) -> int:
        """The largest bucket m <= ``limit`` that splits ``batch`` into buckets (its remainder batch % m is
        0 or a bucket), so every micro-batch of a window is a bucket; ``limit`` below every such bucket:
        ``limit`` itself (sizes are free there)."""
        ok = [m for m in self.sizes if m <= limit and self._splits(batch, m)]
        return ok[-1] if ok else limit

    def splitting(self, batch: int) -> "Buckets":
        """The buckets that split ``batch`` into buckets (constant mode: the batch is fixed, the micro-batch
        moves): a micro-batch of 128 in a batch of 200 would leave a window's last micro-batch at 72."""
        return Buckets([m for m in self.sizes if m <= batch and self._splits(batch, m)])

    def __repr__(self) -> str:
        return f"Buckets({list(self.sizes)})"


def resolve_buckets(cfg: TrainConfig) -> Buckets | None:
    """The run's batch buckets (``batch_buckets``): null is the ladder when the step is captured or
    compiled, free sizes otherwise; [] is free sizes. The configured batch, first micro-batch and the
    elastic batch's min_batch are always among them."""
    if cfg.batch_buckets is None:
        if not (cfg.capture or cfg.compile):
            return None
        sizes = bucket_ladder(MAX_BATCH)
    elif not cfg.batch_buckets:
        return None
    else:
        sizes = cfg.batch_buckets
    own = [cfg.batch_size, math.ceil(cfg.batch_size / cfg.accum_steps)]
    if cfg.mode == "triaccel" and cfg.triaccel.batch.enabled:  # a shrink stops at min_batch: one more bucket
        own.append(cfg.triaccel.batch.min_batch)
    return Buckets((*sizes, *own))


@dataclass(frozen=True)
class BatchDecision:
    batch: int  # examples per optimizer update
    micro_batch: int  # examples per forward/backward
    action: str  # grow | shrink | hold | cooldown | ceiling | predicted | pressure | explore | recheck | settle
    usage_frac: float  # window peak / budget


# After an out-of-memory error at F examples no later size goes above OOM_MARGIN * F. A size just
# under F is no safe size: the allocator's fragmentation and the cuDNN workspaces vary between steps,
# and on the H200 (ResNet-18 under memory_limit_fraction 0.012) a run that stepped back to F - 1
# after an OOM at 892 ran out of memory twice more there, each recovery a freed cache and a re-run
# window (its second epoch took 14x the time of AMP's plain halving). 0.75 is one step of the bucket
# ladder (steps of 1.33x and 1.5x). The limit never rises again: memory headroom that would justify
# it is never proven without running into the wall once more.
OOM_MARGIN = 0.75


def oom_limit(failed: int, buckets: "Buckets | None" = None) -> int:
    """The largest size allowed after a micro-batch of ``failed`` examples ran out of memory:
    OOM_MARGIN of it rounded down (to the largest bucket at or below that, with buckets), at least 1."""
    top = max(1, int(failed * OOM_MARGIN))
    return top if buckets is None else buckets.down(top)


def split_size(failed: int, buckets: Buckets | None = None, batch: int | None = None) -> int:
    """Half of ``failed``, or with buckets the largest bucket at or below half (that splits ``batch``
    into buckets, when given): the retry's share of ``oom_split``."""
    half = max(1, failed // 2)
    if buckets is None:
        return half
    return buckets.down(half) if batch is None else buckets.micro_for(batch, half)


@dataclass(frozen=True)
class OomSplit:
    micro_batch: int  # the failed window is retried in micro-batches of this size
    ceiling: int  # the smallest micro-batch that ran out of memory in the run
    limit: int  # no later size goes above it: oom_limit(ceiling)


def oom_split(failed: int, batch: int, buckets: Buckets | None = None, ceiling: int | None = None) -> OomSplit:
    """The one rule after a micro-batch of ``failed`` examples ran out of memory, in a window of ``batch``
    examples (``ceiling``: the smallest earlier failure, if any): the retry runs the same examples in
    micro-batches of ``split_size`` (within the limit), and from now on no size goes above
    ``oom_limit`` of the smallest failed size. The trainer executes it: through the batch controller's
    ``on_oom`` when one runs, as it is otherwise."""
    ceiling = failed if ceiling is None else min(ceiling, failed)
    limit = oom_limit(ceiling, buckets)
    return OomSplit(min(limit, split_size(failed, buckets, batch)), ceiling, limit)


class BatchController:
    def __init__(self, cfg: BatchConfig, batch: int, micro_batch: int, budget_bytes: float,
                 buckets: Buckets | None = None, run_examples: int | None = None):
        if budget_bytes <= 0:
            raise ValueError("budget_bytes must be > 0")
        self.cfg = cfg
        if buckets is not None and cfg.mode == "constant":
            buckets = buckets.splitting(batch)  # B is fixed: micro-batches that split it into buckets
        self.buckets = buckets
        self.batch, self.micro = batch, micro_batch
        self.budget = float(budget_bytes)
        self.ceiling: int | None = None  # smallest micro-batch that ran out of memory (``limit``: what may run)
        # smallest size whose window peaked over rho_high of the budget: never grown back to. The fit
        # sees only the last 20 windows; with buckets (steps of 1.33-1.5x) no size may land inside
        # [rho_low, rho_high], and the rule would grow into the forgotten size again every ~20 windows
        self.over: int | None = None
        self.cool = 0
        self.obs: list[tuple[int, float]] = []  # (micro_batch, peak bytes)
        # score policy: exploring until it settles; the cost measured at each size
        self.exploring = cfg.policy == "score"
        self.per: dict[int, tuple[float, float]] = {}  # size -> (seconds per example, peak bytes), its lowest cost
        self.direction = -1  # a smaller size first (its peak is below the start's)
        self.start = self.elastic  # B0 (paper mode) or the first micro-batch (constant mode)
        self.rechecked = False  # the start measured a second time before settling elsewhere
        self.why = ""  # why the settled size is not the cheapest measured, where it is not (the log says it)
        self.rechecking = False  # the window being measured is that second look
        # the exploration's one-off seconds: the run's examples (epochs x the training split) bound them
        self.run_examples = run_examples
        self.spent = 0.0  # one-off seconds of the new sizes measured so far
        self.switch_s: float | None = None  # predicted one-off seconds of the next new size
        self.first_window: tuple[int, float, int] | None = None  # (size, seconds, examples): a new size's first
        self.over_budget = False  # exploring stopped because the next new size would cost past the budget
        if self.exploring:
            self.cool = cfg.cooldown  # the first window holds the run's start-up (allocator, kernels)

    @property
    def limit(self) -> int | None:
        """The largest size allowed after the run's out-of-memory errors (None: none happened)."""
        return None if self.ceiling is None else oom_limit(self.ceiling, self.buckets)

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

    def decide(self, stats: WindowStats) -> BatchDecision:
        """One window's feedback: ``peak_bytes`` and ``pressure`` (and, for the score policy, the
        ``seconds`` its ``examples`` took)."""
        peak_bytes = stats.peak_bytes
        if self.cfg.policy == "score":
            return self._decide_score(peak_bytes, stats.seconds, stats.examples, stats.first_step_s)
        c = self.cfg
        frac = peak_bytes / self.budget
        self.obs.append((self.micro, float(peak_bytes)))
        size = self.elastic
        if self.cool > 0:
            self.cool -= 1
            return self._decide(size, "cooldown", frac)
        if frac > c.rho_high:
            self._note_over(size)
            return self._shrink(size, frac)
        if frac < c.rho_low:
            top = min(c.max_batch, self.batch) if self.cfg.mode == "constant" else c.max_batch
            grown = self._up(size + c.delta_up, top)
            if stats.pressure:
                return self._decide(size, "pressure", frac)
            if self.limit is not None and grown > self.limit:
                grown = self.limit
                if grown <= size:
                    return self._decide(size, "ceiling", frac)
            if self.over is not None and grown >= self.over:
                grown = self._down(self.over - 1)
                if grown <= size:
                    return self._decide(size, "predicted", frac)
            pred = self._predict(grown if c.mode == "constant" else min(grown, self.micro_cap(grown)))
            if pred is not None and pred > c.rho_high * self.budget:
                return self._decide(size, "predicted", frac)
            return self._decide(grown, "grow" if grown != size else "hold", frac)
        return self._decide(size, "hold", frac)

    def _shrink(self, size: int, frac: float) -> BatchDecision:
        """Over rho_high of the budget: delta_down is the largest step; where the fit knows a size
        that fits under rho_high, stop there instead of overshooting (96 -> 64 -> 32 when about
        43 fits)."""
        c = self.cfg
        target = size - c.delta_down
        fits = self._largest_fitting(c.rho_high * self.budget)
        if fits is not None:
            target = max(target, min(size - 1, fits))
        return self._decide(max(c.min_batch, self._down(target)), "shrink", frac)  # min_batch is a bucket

    def _note_over(self, size: int) -> None:
        self.over = size if self.over is None else min(self.over, size)

    def _down(self, size: int) -> int:
        return size if self.buckets is None else self.buckets.down(size)

    def _up(self, size: int, limit: int) -> int:
        """``size`` (at most ``limit``) or, with buckets, the bucket it grows to."""
        if self.buckets is None:
            return min(size, limit)
        return self.buckets.up(size, limit)

    # ------------------------------------------------------------------ score policy
    def _ladder(self, size: int, direction: int) -> int:
        g = self.cfg.grow_factor if direction > 0 else 1.0 / self.cfg.grow_factor
        nxt = max(8, int(round(size * g / 8.0)) * 8) if size * g >= 8 else max(1, int(size * g))
        nxt = nxt if nxt != size else size + direction
        if self.buckets is not None:  # the nearest bucket in the direction of the move
            nxt = self.buckets.up(nxt) if direction > 0 else self.buckets.down(nxt)
            if nxt == size:  # the ladder's step fell inside one bucket: the next one out
                nxt = self.buckets.up(size + 1) if direction > 0 else self.buckets.down(size - 1)
        return nxt

    @property
    def costs(self) -> dict[int, float]:
        """size -> the score policy's cost there: seconds per example x peak bytes (the lowest measured)."""
        return {k: s * p for k, (s, p) in self.per.items()}

    def _decide_score(self, peak_bytes: float, seconds: float | None, examples: int,
                      first_step_s: float | None = None) -> BatchDecision:
        c = self.cfg
        frac = peak_bytes / self.budget
        self.obs.append((self.micro, float(peak_bytes)))
        size = self.elastic
        if frac > c.rho_high:  # the budget is a cap in every phase: sizes from here up are out
            self._note_over(size)
            self.per = {k: v for k, v in self.per.items() if k < size}
            return self._shrink(size, frac)
        if not self.exploring:
            return self._decide(size, "hold", frac)
        if self.cool > 0:  # the first window at a new size warms it up (allocator, kernels)
            self.cool -= 1
            if size != self.start and size not in self.per and seconds and examples:
                self.first_window = (size, seconds, examples)
            return self._decide(size, "cooldown", frac)
        if not seconds or not examples:
            return self._decide(size, "hold", frac)
        cost = seconds / examples * peak_bytes
        # a size measured twice keeps its lower cost: disturbances (start-up, a neighbour) only add
        if cost <= self.costs.get(size, cost):
            self.per[size] = (seconds / examples, float(peak_bytes))
        self._note_one_off(size, first_step_s)
        if self.rechecking:
            self.rechecking = False
            return self._settle(self._cheapest(), frac)
        costs = self.costs
        if len(costs) == 1:
            return self._step(size, frac)
        best = min(costs, key=costs.get)
        improved = best == size and costs[size] < (1 - c.explore_tol) * min(v for k, v in costs.items() if k != size)
        if improved and (self.direction < 0 or self.growth_pays(size)):
            return self._step(size, frac)
        if not improved and self.direction < 0 and len(costs) == 2 and self.start in costs:
            self.direction = 1  # the first smaller size cost no less: growth from the start, if it pays
            if self.growth_pays(self.start):
                return self._step(self.start, frac)
        return self._finish(frac)

    def _note_one_off(self, size: int, first_step_s: float | None) -> None:
        """What a new size costs once: predicted from the run's first step (beyond a steady step at the
        start) until a new size's first window measures it (its seconds beyond the size's steady rate)."""
        if self.switch_s is None and first_step_s is not None and self.start in self.per:
            self.switch_s = max(0.0, first_step_s - self.start * self.per[self.start][0])
        if self.first_window is not None and self.first_window[0] == size:
            _, secs, n = self.first_window
            self.first_window = None
            self.switch_s = max(0.0, secs - n * self.per[size][0])
            self.spent += self.switch_s

    @property
    def run_s(self) -> float | None:
        """The run's predicted training seconds: its examples at the start's measured rate (None: the
        run's length or that rate unknown)."""
        if self.run_examples is None or self.start not in self.per:
            return None
        return self.run_examples * self.per[self.start][0]

    @property
    def explore_budget_s(self) -> float | None:
        """Seconds exploring may spend on new sizes: explore_budget of ``run_s`` (None: nothing budgeted)."""
        run_s = self.run_s
        return None if run_s is None else self.cfg.explore_budget * run_s

    def _affordable(self) -> bool:
        """Whether the next new size fits the budget. A budget of 0 affords none, even where a new
        size is predicted to cost nothing (a first step no slower than a steady one)."""
        if self.cfg.explore_budget <= 0:
            return False
        budget = self.explore_budget_s
        if budget is None or self.switch_s is None:
            return True
        return self.spent + self.switch_s <= budget

    def growth_pays(self, size: int) -> bool:
        """Whether the next size up from ``size`` is predicted to cost ``explore_tol`` less than ``size``,
        from ``size`` and the largest size measured below it: seconds per example along their power law
        (s ~ B^e), the peak along their line. Without a size below it, nothing predicts: True.

        A step never takes less time at a larger batch, so seconds per example fall at most as
        size / next: growth can pay only where the peak grows more slowly than the batch (memory
        every size shares: weights, a resident dataset). Two short windows read without that bound
        predicted a faster step at B=144 than at 96 for EfficientNet-B0 at 224 px (its peak is nearly
        all activations), and the exploration to 144 cost the first epoch 1.5x static's peak."""
        below = [k for k in self.per if k < size]
        if size not in self.per or not below:
            return True
        a = max(below)
        (sa, pa), (sb, pb) = self.per[a], self.per[size]
        nxt = self._ladder(size, 1)
        e = math.log(sb / sa) / math.log(size / a) if sa > 0 and sb > 0 else 0.0
        s_next = sb * (nxt / size) ** max(e, -1.0)
        p_next = pb + max(0.0, (pb - pa) / (size - a)) * (nxt - size)
        return s_next * p_next < (1 - self.cfg.explore_tol) * sb * pb

    def _step(self, size: int, frac: float) -> BatchDecision:
        c = self.cfg
        nxt = self._ladder(size, self.direction)
        lo, hi = c.min_batch, c.max_batch if self.limit is None else min(c.max_batch, self.limit)
        if self.over is not None:
            hi = min(hi, self.over - 1)
        if c.mode == "constant":
            hi = min(hi, self.batch)
        if self.buckets is not None and self.direction > 0 and nxt > hi:
            nxt = self.buckets.down(hi)  # the next bucket up is past a bound: the largest one within it
            if nxt <= size:
                return self._finish(frac)
        pred = self._predict(nxt)
        if nxt > hi or nxt < lo or nxt in self.costs or (pred is not None and pred > c.rho_high * self.budget):
            return self._finish(frac)
        if not self._affordable():
            self.over_budget = True
            return self._finish(frac)
        return self._decide(nxt, "explore", frac)

    def _finish(self, frac: float) -> BatchDecision:
        """Exploring is over: settle on the cheapest size, but leave the start only after measuring
        it a second time. Its first window is the run's first, the one most likely to carry
        start-up costs: measured once, a start point of B=96 can lose to B=160 on that window alone,
        and such a seed scores 12 % lower
        (bench/results/archive/export_vs_static/h200_start_point_nockpt_vs_static.json)."""
        best = self._cheapest()
        if best != self.start and self.start in self.costs and not self.rechecked:
            self.rechecked = self.rechecking = True
            return self._decide(self.start, "recheck", frac)
        return self._settle(best, frac)

    def settle_now(self) -> BatchDecision:
        """End exploring now, at the cheapest size measured (the current one if none was)."""
        best = self._cheapest() if self.costs else self.elastic
        if self.rechecking:  # the second look at B0 is running and was not measured: B0 stays (the run is there)
            self.why = (f"the start: exploring ended during its second measurement, which B={best} needed "
                        f"to replace it") if best != self.elastic else ""
            best = self.elastic
        return self._settle(best, self.obs[-1][1] / self.budget if self.obs else 0.0)

    def _cheapest(self) -> int:
        """The size to settle on: of those whose cost is within explore_tol of the lowest (no
        size among them counts as better, by the rule exploring uses), the nearest to the start."""
        low = min(self.costs.values())
        near = [k for k, v in self.costs.items() if (1 - self.cfg.explore_tol) * v <= low]
        pick = min(near, key=lambda k: (abs(math.log(k / self.start)), k))
        cheapest = min(self.costs, key=self.costs.get)
        self.why = (f"within explore_tol ({self.cfg.explore_tol:g}) of B={cheapest}'s cost, and nearer the start"
                    if pick != cheapest else "")
        return pick

    def _settle(self, size: int, frac: float) -> BatchDecision:
        self.exploring = self.rechecking = False
        return self._decide(size, "settle", frac)

    def micro_cap(self, batch: int) -> int:
        """The micro-batch for ``batch``: the batch itself up to the OOM limit, else the largest size within
        the limit (that splits it into buckets, with buckets)."""
        limit = self.limit
        if limit is None or batch <= limit:
            return batch
        return limit if self.buckets is None else self.buckets.micro_for(batch, limit)

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

    def on_oom(self, micro_batch: int) -> OomSplit:
        """A micro-batch of this size ran out of memory: ``oom_split`` decides the retry and the limit, which
        holds for the rest of the run; the controller's sizes follow it."""
        split = oom_split(micro_batch, self.batch, self.buckets, self.ceiling)
        self.ceiling, limit, self.micro = split.ceiling, split.limit, split.micro_batch
        # sizes above the limit are out: neither a recheck nor the settled size may go back there
        self.per = {k: v for k, v in self.per.items() if k <= limit}
        if self.cfg.mode == "paper":
            self.batch = max(self.cfg.min_batch, min(self.batch, limit))  # min_batch above it: micro_cap splits it
        self.cool = self.cfg.cooldown
        return split

    def lr_factor(self, initial_batch: int) -> float:
        """Paper mode: the lr follows the batch by ``lr_rule``; constant mode: 1."""
        if self.cfg.mode != "paper" or self.cfg.lr_rule == "none":
            return 1.0
        r = self.batch / initial_batch
        return r if self.cfg.lr_rule == "linear" else math.sqrt(r)

    def state_dict(self) -> dict:
        return {"batch": self.batch, "micro": self.micro, "ceiling": self.ceiling, "over": self.over, "cool": self.cool,
                "obs": list(self.obs[-20:]), "exploring": self.exploring,
                "per": {k: list(v) for k, v in self.per.items()},
                "direction": self.direction, "start": self.start, "rechecked": self.rechecked,
                "rechecking": self.rechecking, "spent": self.spent, "switch_s": self.switch_s,
                "first_window": list(self.first_window) if self.first_window else None,
                "over_budget": self.over_budget}

    def load_state_dict(self, s: dict) -> None:
        self.batch, self.micro, self.ceiling, self.cool = s["batch"], s["micro"], s["ceiling"], s["cool"]
        self.over = s.get("over")
        self.obs = [tuple(o) for o in s["obs"]]
        self.exploring = s.get("exploring", self.exploring)
        self.per = {int(k): tuple(v) for k, v in s.get("per", {}).items()}
        if not self.per and s.get("costs"):  # a state saved with only the products: the peak from obs
            peaks = {m: p for m, p in self.obs}
            self.per = {int(k): (v / peaks.get(int(k), 1.0), peaks.get(int(k), 1.0)) for k, v in s["costs"].items()}
        self.direction = s.get("direction", 1)
        self.start = s.get("start", self.start)
        self.rechecked, self.rechecking = s.get("rechecked", False), s.get("rechecking", False)
        self.spent, self.switch_s = s.get("spent", 0.0), s.get("switch_s")
        self.first_window = tuple(s["first_window"]) if s.get("first_window") else None
        self.over_budget = s.get("over_budget", False)
