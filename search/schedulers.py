"""The search's early-stopping rule: Ray Tune's ASHA, except that the space's start points run
to the end.

Why: ASHA stops a trial at a rung from its score *while trials share the GPU*, and sharing does
not rank configurations as running alone does. On an H200 (``spaces/cifar10_resnet18.yaml`` on
the CIFAR-10 JPEG pack, 8 epochs, 4 trials packed;
bench/results/archive/search_cifar10_space/h200_search_cifar10_space.json) plain ASHA stops the
start point with activation checkpointing at its epoch-4 rung (shared score 78, val 74.6 %);
alone, that configuration scores 1.07x the best static baseline at 8 epochs (182 against 171 over
3 seeds, bench/results/archive/export_vs_static/h200_exported_vs_static_3seeds.json), and a search
with no complete trial left that beats its baseline alone exports the baseline. Checkpointing's
recomputation costs more under sharing than alone, while the memory it saves counts the same.

Start points are the space author's known-good configurations, a handful of trials, known by
where they came from (``search.space.START`` in the trial's config, set for Optuna's enqueued
trials), not by their values. They always finish, and ``--confirm`` re-measures them alone
(``results.to_confirm``), which decides the export. ASHA's rungs see what plain ASHA would:
a start point reports to the rungs until the one where plain ASHA would have stopped it (that
score recorded, as ASHA records it) and to none after, so sampled trials are cut exactly as
Ray's ASHA cuts them.
"""
from __future__ import annotations

from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from triaccel.search.space import START


class StartPointsFinishASHA(ASHAScheduler):
    """ASHA whose start-point trials are never stopped early (module docstring)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._exempt: set = set()  # start points past the rung that would have stopped them

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        if trial.trial_id in self._exempt:  # no longer in the rungs: ends at max_t as every trial does
            at_end = result.get(self._time_attr, 0) >= self._max_t and self._stop_last_trials
            return TrialScheduler.STOP if at_end else TrialScheduler.CONTINUE
        action = super().on_trial_result(tune_controller, trial, result)  # records the rung, as plain ASHA
        if action == TrialScheduler.STOP and result.get(self._time_attr, 0) < self._max_t \
                and trial.config.get(START):
            self._num_stopped -= 1
            self._exempt.add(trial.trial_id)
            return TrialScheduler.CONTINUE
        return action

    def on_trial_complete(self, tune_controller, trial, result: dict):
        if trial.trial_id in self._exempt:  # its later scores stay out of the rungs
            self._exempt.discard(trial.trial_id)
            self._trial_info.pop(trial.trial_id, None)
            return
        super().on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller, trial):
        self._exempt.discard(trial.trial_id)
        self._trial_info.pop(trial.trial_id, None)
