"""The Optuna search of a study's finetuning settings: one persistent Optuna study per (nested) `SearchSpec`
(`optuna_study`), driven by Ray Tune, whose trials train on the search's own sample of the outer fold's
training pool and report validation metrics every epoch; its best setting, chosen among the trials that ran to
their own end, is written to `searches/<name>.json` and not searched again on a rerun. The Tune objects it is
built from (the space's distributions, the scheduler, the study's searcher) are in `study.search_tune`.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from alignlab.platform.config import config_hash, to_dict
from alignlab.platform.fel.finetune_config import FinetuneConfig, finetune_from_dict
from alignlab.platform.runtime.ray_env import own_sigint
from alignlab.platform.storage.root import Storage, read_json, write_json
from alignlab.platform.study.grid import (Progress, check_trial_resources, concurrency, localize, other_task_train,
                                          threads_per_trial, trial_calc, trial_device, tune_safe, tune_storage)
from alignlab.platform.study.spec import DEFAULT_TRIAL_RESOURCES, SEARCH_OBJECTIVE, SearchSpec

# Ray, Optuna and the FEL stack are imported inside the functions that run a search or one of its trials:
# declaring or expanding a study loads none of them.


def run_search(spec: SearchSpec, base_calc: dict, sdir: Path, *, resources: dict | None = None,
               max_concurrent: int | None = None, progress: bool = True, storage: Storage | None = None,
               optuna_storage: str | None = None) -> dict:
    """Run (or find, or resume) one Optuna search; returns its summary (best params and value, every trial).

    The search's state is a persistent Optuna study (`optuna_study`): the journal
    `searches/<name>.optuna.journal` beside the summary, or the RDB URL `optuna_storage` (else
    `$ALIGNLAB_OPTUNA_STORAGE`). A rerun of an interrupted search runs only the trials the study still lacks,
    trying again the points its dead driver was running (`study.search_tune.run_rounds`).

    Pruning vs. Optuna (docs/cluster.md#asha-stopped-trials-reach-optuna-as-complete): a trial's last report carries
    `search_complete=1` only when the
    calculation ran to its own end (patience or max_epochs); the searcher tells Optuna PRUNED for every other
    one (keeping the per-epoch values it reported as intermediate values, which TPE ranks below every
    completed trial), and the best setting is chosen among completed trials only -- all of them compared at
    the end of their own runs, never at an early epoch.
    """
    # Ray and Optuna only when a search runs: declaring or expanding a study loads neither (search_tune and
    # optuna_study import them at their top).
    from ray import tune

    from alignlab.platform.storage.optuna_place import JOURNAL_SUFFIX, study_place
    from alignlab.platform.study.optuna_study import finished_trials, open_study, trial_counts
    from alignlab.platform.study.search_tune import (OptunaStudySearch, TellTuneErrors, distribution, finite, run_rounds,
                                                     scheduler)

    out_file = sdir / "searches" / f"{spec.name}.json"
    out_rel = Storage.study(sdir.name, f"searches/{spec.name}.json")
    if out_file.exists() or (storage is not None and storage.pull_file(out_rel)):
        return read_json(out_file)
    resources = dict(resources or DEFAULT_TRIAL_RESOURCES)
    check_trial_resources(resources)
    name = f"search-{spec.name}-{config_hash(base_calc['calc_id'], spec)}"
    place = study_place(name, sdir / "searches" / f"{spec.name}{JOURNAL_SUFFIX}", url=optuna_storage, root=storage,
                        journal_rel=Storage.study(sdir.name, f"searches/{spec.name}{JOURNAL_SUFFIX}"))
    place.pull()
    study = open_study(place, ["maximize"], spec.seed)
    if not study.get_trials(deepcopy=False) and spec.start_from_base and \
            all(p.contains(getattr(spec.base, p.name)) for p in spec.space):
        study.enqueue_trial({p.name: getattr(spec.base, p.name) for p in spec.space})  # the first trial: the default
    where = tune_storage(storage, sdir)
    trainable = tune.with_resources(tune.with_parameters(search_trial, storage_uri=base_calc.get("storage")), resources)
    param_space = {"calc": tune_safe(base_calc), "threads": threads_per_trial(resources)}
    label = f"[search {spec.name}]"

    def fit_round(session, left: int) -> None:
        prog = Progress(spec.num_samples, progress, what=f"search {spec.name}", already=trial_counts(study)[0])

        class _ProgressCallback(tune.Callback):
            def on_trial_complete(self, iteration, trials, trial, **info):
                r = trial.last_result or {}
                how = "completed" if r.get("search_complete") else \
                    "failed: diverged" if r.get("failed") else f"pruned at epoch {r.get('epoch', '?')}"
                prog.tick(f" (last trial {how}, {SEARCH_OBJECTIVE} {r.get(SEARCH_OBJECTIVE, float('nan')):.3f})")

        searcher = OptunaStudySearch(
            study, session, {p.name: distribution(p) for p in spec.space}, metrics=[SEARCH_OBJECTIVE],
            num_samples=spec.num_samples, max_concurrent=concurrency(resources, max_concurrent),
            keep=("epoch", SEARCH_OBJECTIVE, "val_perplexity_at_best_ppl", "failed"), complete_key="search_complete",
            on_told=place.push)
        # A fresh experiment under the same name each driver session: the Optuna study is what resumes.
        tuner = tune.Tuner(
            trainable, param_space=param_space,
            tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler(spec), metric=SEARCH_OBJECTIVE,
                                        mode="max", num_samples=left, reuse_actors=True,
                                        trial_dirname_creator=lambda t: f"{spec.name}-{t.trial_id}",
                                        trial_name_creator=lambda t: f"{spec.name}-{t.trial_id}"),
            run_config=tune.RunConfig(name=name, **where, verbose=0,
                                      callbacks=[_ProgressCallback(), TellTuneErrors(searcher)],
                                      failure_config=tune.FailureConfig(max_failures=1)),
        )
        with own_sigint():
            tuner.fit()

    run_rounds(study, place, spec.num_samples, fit_round, label=label)
    trials = [search_row(t) for t in finished_trials(study)]
    complete = [t for t in trials if t["status"] == "complete" and finite(t[SEARCH_OBJECTIVE])]
    if not complete:
        raise RuntimeError(f"search {spec.name}: no trial ran to its end ({len(trials)} trials: "
                           f"{[t['status'] for t in trials]}); raise num_samples or the grace period")
    # Ties (frequent on tiny validation splits) go to the lower validation perplexity.
    best = max(complete, key=lambda t: (t[SEARCH_OBJECTIVE], -(t["val_perplexity_at_best_ppl"] or math.inf)))
    summary = {"name": spec.name, "model": spec.model, "row": spec.row, "col": spec.col,
               "objective": SEARCH_OBJECTIVE, "scheduler": spec.scheduler, "grace_period": spec.grace_period,
               "num_samples": spec.num_samples, "sampler": f"optuna TPE (seed {spec.seed})",
               "search_fold": spec.search_fold, "search_seed": spec.search_seed,
               "final_points": [list(pt) for pt in spec.points()],
               "space": [{"name": p.name, "kind": p.kind, "values": list(p.values)} for p in spec.space],
               "base": to_dict(spec.base), "best_params": best["params"], "best_value": best[SEARCH_OBJECTIVE],
               "trials": trials, "tune_dir": str(sdir / "tune" / name), "optuna": place.summary()}
    write_json(out_file, summary)
    if storage is not None:
        storage.push_file(out_rel)
    return summary


def search_row(t) -> dict:
    """A finished trial of the study as a row of the search's summary (status complete, pruned, failed or error)."""
    from optuna.trial import TrialState

    a = t.user_attrs
    if t.state == TrialState.FAIL:
        if "failed" in a:  # diverged: a result of the search
            return {"params": t.params, "status": "failed", "error": a["failed"], "epoch": a.get("epoch")}
        return {"params": t.params, "status": "error", "error": a.get("error", "no result")}
    return {"params": t.params, "status": "complete" if t.state == TrialState.COMPLETE else "pruned",
            "epoch": a.get("epoch"), SEARCH_OBJECTIVE: t.value if t.value is not None else a.get(SEARCH_OBJECTIVE),
            "val_perplexity_at_best_ppl": a.get("val_perplexity_at_best_ppl")}


def search_trial(config: dict, storage_uri: str | None = None) -> None:
    """A Ray Tune function trainable for one search trial: trains on the search's sample of its outer fold's
    training pool (`protocol.search_split`) and reports validation metrics every epoch; no test set is loaded."""
    import torch
    from ray import tune

    from alignlab.platform.fel.finetune import NonFiniteError, finetune_calculation, load_pretrained
    from alignlab.platform.tasks.task import task
    from alignlab.platform.tasks.task_data import TaskData
    from alignlab.platform.tasks.task_kinds import declare_all

    torch.set_num_threads(config.get("threads", 1))
    calc = localize(trial_calc(config["calc"], storage_uri))
    declare_all(calc.get("declared_tasks"))
    params = {k: v for k, v in config.items() if k not in ("calc", "threads")}
    # A trial is scored on its validation split: refit (which trains on it) belongs to the reported calculations.
    ft = dataclasses.replace(finetune_from_dict(calc["finetune"]), **params, refit=False)
    t = task(ft.task)  # the trial's task object, resolved once and passed down
    data = TaskData.load(Path(calc["task_dir"]))
    train, val, other = search_examples(data, ft, t)
    pre = load_pretrained(calc["model_dir"])
    best = {"ppl": math.inf, "acc": float("nan"), "epoch": 0}

    def on_epoch(epoch: int, m: dict) -> None:
        best["epoch"] = epoch
        if m["perplexity"] < best["ppl"]:
            best.update(ppl=m["perplexity"], acc=m["accuracy"])
        tune.report({"epoch": epoch, "val_accuracy": m["accuracy"], "val_perplexity": m["perplexity"],
                     SEARCH_OBJECTIVE: best["acc"], "val_perplexity_at_best_ppl": best["ppl"], "search_complete": 0})

    try:
        res = finetune_calculation(pre, ft, train, val, val=val, other_task_train=other, on_epoch=on_epoch,
                                   device=trial_device(), task=t).row
    except NonFiniteError as e:
        # A diverged trial is a failed trial with its reason, not a Tune error: Optuna is told FAIL, the
        # search goes on, and its summary lists the trial as failed.
        tune.report({"epoch": best["epoch"], SEARCH_OBJECTIVE: float("nan"), "search_complete": 0,
                     "failed": str(e)[:500]})
        return
    # The run's own end: the restored best-perplexity model scored on the validation split.
    tune.report({"epoch": res["epochs_run"], "val_accuracy": res["accuracy"], "val_perplexity": res["perplexity"],
                 SEARCH_OBJECTIVE: res["accuracy"], "val_perplexity_at_best_ppl": res["perplexity"],
                 "epochs": res["epochs"], "search_complete": 1})


def search_examples(data, ft: FinetuneConfig, task) -> tuple[list, list, list | None]:
    """Every example a search trial learns or selects from: (train, val, the other task's training examples
    for the multitask scheme or None). `ft` is `SearchSpec.search_finetune()` with the trial's values; `task`
    the object of `ft.task`."""
    from alignlab.platform.fel.protocol import search_split

    train, val = search_split(data, task, ft)
    return train, val, other_task_train(data, ft, task)

