"""The search's early-stopping rule: Ray Tune's ASHA, except that the space's start points run
to the end.

Why: ASHA stops a trial at a rung from its score *while trials share the GPU*, and sharing does
not rank configurations as running alone does. On the H200 (``spaces/cifar10_resnet18.yaml`` on
the CIFAR-10 JPEG pack, 8 epochs, 4 trials packed; bench/results/h200_search_cifar10_space.json)
the start point with activation checkpointing scored 78 shared at epoch 4, under the plain start
point, and ASHA stopped it; alone, the same configuration scores 1.07x the best static baseline
(182 against 171 over 3 seeds, h200_exported_vs_static_3seeds.json), and the search, with no
finished trial left that beat its baseline, exported the baseline. The recomputation that
checkpointing adds costs more under sharing than alone, while the memory it saves counts the
same either way.

Start points are the space author's known-good configurations (a handful of trials): they
always finish, and are always re-measured alone where trials shared the GPU (``--confirm``,
``results.to_confirm``), which decides the export. They still report to ASHA's rungs, so the rungs' cut-offs for the sampled trials are
unchanged. Sampled trials are stopped as Ray's ASHA stops them.
"""
from __future__ import annotations

from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from triaccel.search.space import is_start_point


class StartPointsFinishASHA(ASHAScheduler):
    """ASHA whose start-point trials are never stopped early (module docstring)."""

    def __init__(self, *args, start: list[dict] = (), **kw):
        super().__init__(*args, **kw)
        self._start = [dict(p) for p in start]

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        action = super().on_trial_result(tune_controller, trial, result)  # records the rung either way
        if action == TrialScheduler.STOP and result.get(self._time_attr, 0) < self._max_t \
                and is_start_point(trial.config, self._start):
            self._num_stopped -= 1
            return TrialScheduler.CONTINUE
        return action
