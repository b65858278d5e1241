"""The Ray Tune objects a study's Optuna search is built from: the domain of each searched parameter, the
trial scheduler, and an OptunaSearch that tells Optuna PRUNED for the trials a scheduler stopped early.

A Ray edge module (it imports Ray at the top); `study_search.run_search` imports it when a search runs, so
declaring or expanding a study never loads Ray.
"""
from __future__ import annotations

from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, MedianStoppingRule
from ray.tune.search.optuna import OptunaSearch

from alignlab.platform.study_search import finite
from alignlab.platform.study_spec import SearchParam, SearchSpec


def tune_domain(p: SearchParam):
    """The Tune search domain of one searched parameter."""
    if p.kind == "choice":
        return tune.choice(list(p.values))
    if p.kind == "int":
        return tune.randint(p.values[0], p.values[1] + 1)
    return (tune.loguniform if p.kind == "loguniform" else tune.uniform)(*p.values)


def scheduler(spec: SearchSpec):
    """The search's trial scheduler (`SearchSpec.scheduler`), stepping on the epoch a trial reports."""
    if spec.scheduler == "asha":
        # max_t one past the longest run: a trial is never stopped by ASHA for merely reaching its own end,
        # so its final report (search_complete=1) always arrives.
        return ASHAScheduler(time_attr="epoch", max_t=spec.max_epochs_upper() + 1, grace_period=spec.grace_period,
                             reduction_factor=3)
    if spec.scheduler == "median":
        return MedianStoppingRule(time_attr="epoch", grace_period=spec.grace_period, min_samples_required=3)
    return FIFOScheduler()


class PruneAwareOptunaSearch(OptunaSearch):
    """OptunaSearch that tells Optuna PRUNED (not COMPLETE) for trials a scheduler stopped early."""

    def on_trial_complete(self, trial_id, result=None, error=False):
        if result and not error and not result.get("search_complete"):
            self._report_last(trial_id, result)
            result = {k: v for k, v in result.items() if k != self.metric}  # no value -> PRUNED
        super().on_trial_complete(trial_id, result, error)

    def _report_last(self, trial_id, result) -> None:
        # The result a scheduler stopped the trial on may not have reached on_trial_result; Optuna ranks
        # pruned trials by their last intermediate value, so make sure it has it.
        ot_trial, step = self._ot_trials.get(trial_id), result.get("training_iteration")
        if ot_trial is None or step is None or not finite(result.get(self.metric)):
            return
        if step not in ot_trial.storage.get_trial(ot_trial._trial_id).intermediate_values:
            ot_trial.report(result[self.metric], step)
