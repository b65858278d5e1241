"""The Ray Tune objects a study's Optuna search is built from: the domain of each searched parameter, the
trial scheduler, and an OptunaSearch that tells Optuna PRUNED for the trials a scheduler stopped early.

A Ray edge module (it imports Ray at the top); `study_search.run_search` imports it when a search runs, so
declaring or expanding a study never loads Ray.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

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


class ResumableOptunaSearch(OptunaSearch):
    """OptunaSearch that limits its own concurrency (`max_concurrent_trials`) and, when restored, counts as live
    only the trials the experiment state of the same snapshot holds unfinished (Tune runs exactly those again).

    Tune otherwise wraps the searcher in a ConcurrencyLimiter whose snapshot of live trials can name a trial
    that the experiment-state snapshot does not hold (suggested between the two writes). That trial never
    completes, so after a restore with `max_concurrent_trials=1` no trial is ever suggested again: the
    driver waits for ever (seen here on Ray 2.60). Forgetting all of them instead (this class's first version)
    let each resume add a trial beside the restarted ones: three resumes of the mini objective search on 2 CPUs
    ran three pretraining runs at once, which left Ray Data no CPU, and it hung."""

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        self._max_live, self._live = max_concurrent, set()
        return True  # the ConcurrencyLimiter Tune puts around this searcher then only passes calls through

    def suggest(self, trial_id: str):
        live = getattr(self, "_live", None)
        if live is not None and len(live) >= self._max_live:
            return None
        config = super().suggest(trial_id)
        if live is not None and isinstance(config, dict):
            live.add(trial_id)
        return config

    def on_trial_complete(self, trial_id, result=None, error=False):
        getattr(self, "_live", set()).discard(trial_id)
        super().on_trial_complete(trial_id, result, error)

    def restore(self, checkpoint_path: str) -> None:
        super().restore(checkpoint_path)
        if getattr(self, "_live", None) is not None:
            self._live &= unfinished_trials(checkpoint_path)


def unfinished_trials(searcher_file: str) -> set[str]:
    """Ids of the trials that the experiment state saved with `searcher-state-<session>.pkl` (same folder, same
    driver session) holds as not finished; empty when there is no such state."""
    from ray.tune.utils.serialization import _loads_with_cloudpickle

    path = Path(searcher_file)
    session = path.name[len("searcher-state-"):-len(".pkl")]
    state_file = path.with_name(f"experiment_state-{session}.json")
    try:
        trials = _loads_with_cloudpickle(state_file.read_text())["trial_data"]
    except Exception:  # noqa: BLE001 -- no readable state: count no trial as live (it cannot hang the search)
        return set()
    out = set()
    for trial_json, _meta in trials:
        t = json.loads(trial_json) if isinstance(trial_json, str) else trial_json
        if t.get("status") not in ("TERMINATED", "ERROR"):
            out.add(str(t.get("trial_id")))
    return out


class PruneAwareOptunaSearch(ResumableOptunaSearch):
    """OptunaSearch that tells Optuna PRUNED (not COMPLETE) for trials a scheduler stopped early."""

    def on_trial_complete(self, trial_id, result=None, error=False):
        if result and result.get("failed"):  # diverged (`search_trial`): FAIL, which TPE leaves out
            return super().on_trial_complete(trial_id, None, True)
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


def resume_or_set_aside(exp_path: str, fs=None, *, label: str, say=print) -> bool:
    """Should the Tune experiment at `exp_path` be restored? True when Tune can restore it and its snapshot is
    complete (`snapshot_problem`); an incomplete one is moved aside (`set_aside`), saying why, and False is
    returned: nothing in it can be resumed as a search, so the search starts again."""
    from ray import tune

    if not tune.Tuner.can_restore(exp_path, storage_filesystem=fs):
        return False
    if (problem := snapshot_problem(exp_path, fs)) is None:
        return True
    say(f"{label} the interrupted search cannot be resumed ({problem}); starting it again (its files are kept "
        f"at {set_aside(exp_path, fs)})", flush=True)
    return False


def restore_tuner(exp_path: str, trainable, *, param_space: dict, fs=None, label: str, say=print):
    """`Tuner.restore` of an interrupted search (unfinished and errored trials run again), or None with the
    folder set aside when Tune refuses the restore because this version's param space has other keys than
    the snapshot's (a search interrupted under an older alignlab): the search then starts again, its pretrained
    models and finished calculations still found in the registry."""
    from ray import tune

    try:
        return tune.Tuner.restore(exp_path, trainable, resume_unfinished=True, restart_errored=True,
                                  param_space=param_space, storage_filesystem=fs)
    except ValueError as e:
        if "param_space" not in str(e):
            raise
        say(f"{label} the interrupted search was made with another parameter space (another alignlab version); "
            f"starting it again (its files are kept at {set_aside(exp_path, fs)})", flush=True)
        return None


def _fs_path(exp_path: str, fs):
    """(filesystem, path in it) of an experiment folder given as a local path or URI, or as a path in `fs`."""
    import pyarrow.fs as pafs

    if fs is not None:
        return fs, exp_path
    return pafs.FileSystem.from_uri(exp_path if "://" in exp_path else str(Path(exp_path).resolve()))


def snapshot_problem(exp_path: str, fs=None) -> str | None:
    """Why the Tune experiment at `exp_path` cannot be resumed as a whole, or None when it can.

    A restore needs three files of the same driver session: the experiment state (the trials), the search
    generator's state (how many trials were asked for, and the experiment spec) and the Optuna searcher's
    pickle (the sampler and its history). A driver killed before its first snapshot, or while one was being
    uploaded, leaves some missing, empty or truncated; Tune then restores what it finds and, with no search
    generator state, silently ends the search after the restored trials (checked on Ray 2.60).
    """
    import pickle

    import pyarrow.fs as pafs
    import ray.cloudpickle as cloudpickle
    from ray.tune.utils.serialization import _loads_with_cloudpickle

    fs, exp_path = _fs_path(exp_path, fs)
    try:
        names = [i.base_name for i in fs.get_file_info(pafs.FileSelector(exp_path))]
    except (OSError, FileNotFoundError) as e:
        return f"cannot list it ({e})"
    kinds = {"experiment state": ("experiment_state-", ".json", _loads_with_cloudpickle),
             "search generator state": ("search_gen_state-", ".json", cloudpickle.loads),
             "searcher state": ("searcher-state-", ".pkl", pickle.loads)}
    sessions = set()
    for what, (prefix, suffix, load) in kinds.items():
        found = sorted(n for n in names if n.startswith(prefix) and n.endswith(suffix))
        if not found:
            return f"no {what} file"
        try:
            with fs.open_input_stream(f"{exp_path}/{found[-1]}") as f:
                load(f.readall())
        except Exception as e:  # noqa: BLE001 -- any failure to load means the snapshot is incomplete
            return f"its {what} {found[-1]} does not load ({type(e).__name__}: {e})"[:300]
        sessions.add(found[-1][len(prefix):-len(suffix)])
    if len(sessions) > 1:
        return f"its newest state files come from different driver sessions ({sorted(sessions)})"
    return None


def set_aside(exp_path: str, fs=None) -> str:
    """Move an experiment that cannot be resumed out of the way (kept, never deleted); returns where to."""
    import pyarrow.fs as pafs

    fs, exp_path = _fs_path(exp_path, fs)
    dest = f"{exp_path}.incomplete-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        fs.move(exp_path, dest)
    except OSError:  # object stores move files, not directories
        pafs.copy_files(exp_path, dest, source_filesystem=fs, destination_filesystem=fs)
        fs.delete_dir(exp_path)
    return dest
