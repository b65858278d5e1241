"""The Ray Tune side of alignlab's Optuna searches: a Tune searcher that asks and tells a persistent Optuna
study (`optuna_study`), the driver loop that runs Tune until the study holds the search's trials, the space
of a finetuning search and its trial scheduler.

Why no `Tuner.restore` (issue #18): the study on disk already holds every finished trial and TPE needs nothing
else, while restoring Tune's own snapshot needed its param space handed back, a complete set of three state
files of one driver session, and a concurrency count patched after the restore, and failed silently when one
was missing. Nothing a trial leaves is worth restoring either: a finetuning trial has no checkpoint, and an
objective-mixture trial pretrains through the model registry, which resumes an interrupted run from its own
Train checkpoint when the same point is tried again. So each driver session runs a fresh Tune experiment that
asks Optuna for the trials still missing (`run_rounds`).

A Ray edge module (it imports Ray at the top); the search runners import it when a search runs, so declaring
or expanding a study never loads Ray.
"""
from __future__ import annotations

import math
import time

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, MedianStoppingRule
from ray.tune.search import Searcher

from alignlab.platform.storage.optuna_place import StudyPlace
from alignlab.platform.study.optuna_study import (LEASE_INTERVAL_S, DriverSession, attr_value, give_back,
                                                  recover_interrupted, trial_counts)
from alignlab.platform.study.spec import SearchParam, SearchSpec


def finite(x) -> bool:
    """A number a trial reported that Optuna can be told (not None, NaN or infinite)."""
    return isinstance(x, (int, float)) and math.isfinite(x)


def distribution(p: SearchParam):
    """The Optuna distribution of one searched parameter."""
    if p.kind == "choice":
        return CategoricalDistribution(list(p.values))
    if p.kind == "int":
        return IntDistribution(p.values[0], p.values[1])
    return FloatDistribution(p.values[0], p.values[1], log=p.kind == "loguniform")


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


class OptunaStudySearch(Searcher):
    """A Tune searcher over a persistent Optuna study, through Optuna's public ask-and-tell interface.

    - It stops suggesting (`FINISHED`) once the study's counted trials plus its RUNNING ones reach
      `num_samples`, so the total is right across driver sessions and beside other drivers of the same study.
    - It limits its own concurrency (`max_concurrent`), so Tune adds no ConcurrencyLimiter around it.
    - Each trial's last values of `keep` become its user attributes: the search's summary is read from the
      study alone.
    - `complete_key`: a trial whose last result lacks it was stopped early by the scheduler and is told
      PRUNED, with its per-epoch values as intermediate values
      (docs/cluster.md#asha-stopped-trials-reach-optuna-as-complete: Ray's own OptunaSearch
      tells COMPLETE with the early value). A result with `failed` (diverged) is told FAIL, which TPE leaves out.
    - A Tune error is told FAIL by `tell_error`, which `TellTuneErrors` calls with the error's text.
    - `on_told` runs after every tell (the journal's upload for a remote root).
    """

    def __init__(self, study: optuna.Study, session: DriverSession, space: dict, *, metrics: list[str],
                 num_samples: int, max_concurrent: int, keep: tuple[str, ...] = (), complete_key: str | None = None,
                 on_told=None):
        multi = len(metrics) > 1
        super().__init__(metric=list(metrics) if multi else metrics[0], mode=["max"] * len(metrics) if multi else "max")
        self.study, self.session, self.space, self.metrics = study, session, space, list(metrics)
        self.num_samples, self.max_concurrent, self.keep = num_samples, max(1, max_concurrent), keep
        self.complete_key, self.on_told = complete_key, on_told
        self.live: dict[str, optuna.Trial] = {}
        self.errored: dict[str, optuna.Trial] = {}

    # Tune pickles the searcher into its experiment folder; nothing restores it (the study is the state).
    def __getstate__(self):
        return {}

    def save(self, checkpoint_path: str) -> None:
        pass

    def restore(self, checkpoint_path: str) -> None:
        raise RuntimeError("an alignlab search resumes from its Optuna study, not from Tune's snapshot")

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        return True  # the limit is this searcher's own (`max_concurrent`)

    def suggest(self, trial_id: str):
        if len(self.live) >= self.max_concurrent:
            return None
        done, running = trial_counts(self.study)
        if done + running >= self.num_samples:
            return Searcher.FINISHED
        trial = self.study.ask(fixed_distributions=self.space)
        self.session.claim(trial, trial_id)
        self.live[trial_id] = trial
        return dict(trial.params)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        trial = self.live.get(trial_id)
        if trial is not None and len(self.metrics) == 1:  # Optuna keeps no intermediate values for several
            self._report(trial, result)

    def _report(self, trial: optuna.Trial, result: dict) -> None:
        step, value = result.get("training_iteration"), result.get(self.metrics[0])
        if step is not None and finite(value):
            trial.report(value, step)  # a step already reported is ignored by Optuna (with a warning)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        trial = self.live.pop(trial_id, None)
        if trial is None:
            return
        if error:
            self.errored[trial_id] = trial
            return
        if not result:  # stopped before its first result: an interruption, not a result of the search
            give_back(self.study, self.session.place, trial.number, trial.params)
            return
        for k in self.keep:
            if k in result and attr_value(result[k]) is not None:
                trial.set_user_attr(k, attr_value(result[k]))
        values = [result.get(m) for m in self.metrics]
        if result.get("failed"):
            state, values = TrialState.FAIL, None
        elif self.complete_key and not result.get(self.complete_key):
            if finite(values[0]) and "training_iteration" in result:
                # The result the scheduler stopped the trial on may not have reached on_trial_result; Optuna
                # ranks pruned trials by their last intermediate value.
                self._report(trial, result)
            state, values = TrialState.PRUNED, None
        elif all(finite(v) for v in values):
            state = TrialState.COMPLETE
        else:
            trial.set_user_attr("failed", f"non-finite {self.metrics}: {values}")
            state, values = TrialState.FAIL, None
        self._tell(trial, values, state)

    def tell_error(self, trial_id: str, message: str) -> None:
        trial = self.errored.pop(trial_id, None)
        if trial is not None:
            trial.set_user_attr("error", message[:500])
            self._tell(trial, None, TrialState.FAIL)

    def _tell(self, trial: optuna.Trial, values, state) -> None:
        self.study.tell(trial, values, state=state)
        if self.on_told is not None:
            self.on_told()


class TellTuneErrors(tune.Callback):
    """Tells the searcher's errored trials FAIL with Tune's error text (Tune tells the searcher first, without it)."""

    def __init__(self, searcher: OptunaStudySearch):
        self.searcher = searcher

    def __getstate__(self):
        return {}

    def on_trial_error(self, iteration, trials, trial, **info):
        if getattr(self, "searcher", None) is None:
            return
        try:
            lines = (trial.get_error() or "").strip().splitlines()
        except Exception:  # noqa: BLE001 -- the text is for the summary only
            lines = []
        self.searcher.tell_error(trial.trial_id, lines[-1] if lines else f"Tune error (see {trial.local_path})")


def run_rounds(study: optuna.Study, place: StudyPlace, num_samples: int, fit_round, *, label: str, say=print) -> None:
    """Run Tune rounds until the study holds `num_samples` trials that count (`optuna_study.counted`).

    `fit_round(session, left)` builds and fits one Tune experiment whose searcher asks for at most `left`
    trials. Before each round, trials of dead drivers are recovered; while the missing trials are all running
    in another live driver, this one waits for them."""
    session = DriverSession(study, place)
    waited = False
    try:
        while True:
            recover_interrupted(study, place, say=say)
            done, running = trial_counts(study)
            left = num_samples - done - running
            if done and left > 0:
                say(f"{label} {done} of {num_samples} trials already done (Optuna study {place.name} at "
                    f"{place.shown}); running {left}", flush=True)
            if left > 0:
                fit_round(session, left)
                if trial_counts(study)[0] == done:
                    raise RuntimeError(f"{label} a Tune round ended without finishing a trial")
            elif running:
                if not waited:
                    say(f"{label} waiting for {running} trial(s) that another driver runs", flush=True)
                    waited = True
                time.sleep(LEASE_INTERVAL_S)
            else:
                return
    finally:
        session.close(say=say)
        place.push()
