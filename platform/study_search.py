"""The Optuna search of a study's finetuning settings: one Tune experiment per (nested) `SearchSpec`, whose
trials train on the search's own sample of the outer fold's training pool and report validation metrics
every epoch; its best setting, chosen among the trials that ran to their own end, is written to
`searches/<name>.json` and not searched again on a rerun. The Tune objects it is built from (the space's
domains, the scheduler, the prune-aware searcher) are in `study_search_tune`.
"""
from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

from alignlab.platform.config import FinetuneConfig, config_hash, finetune_from_dict, to_dict
from alignlab.platform.storage import Storage, read_json, write_json
from alignlab.platform.study_grid import (Progress, check_trial_resources, concurrency, localize, other_task_train,
                                          threads_per_trial, trial_calc, tune_safe, tune_storage)
from alignlab.platform.study_spec import DEFAULT_TRIAL_RESOURCES, SEARCH_OBJECTIVE, SearchSpec

SEARCH_STATE_SYNC_S = 10
"""How often a search's Tune experiment state is uploaded to the storage root, at most: a killed search
resumes from the last upload."""


def run_search(spec: SearchSpec, base_calc: dict, sdir: Path, *, resources: dict | None = None,
               max_concurrent: int | None = None, progress: bool = True, storage: Storage | None = None) -> dict:
    """Run (or find) one Optuna search; returns its summary (best params and value, every trial).

    Pruning vs. Optuna (RAY_NOTES pitfall 9): when a scheduler stops a trial, Ray's OptunaSearch tells
    Optuna it COMPLETED with its last, early value, which biases TPE toward settings that look good
    early. Here a trial's last report carries `search_complete=1` only when the calculation ran to its
    own end (patience or max_epochs); `PruneAwareOptunaSearch` tells Optuna PRUNED for every other one
    (keeping the per-epoch values it reported as intermediate values, which TPE ranks below every
    completed trial), and the best setting is chosen among completed trials only -- all of them
    compared at the end of their own runs, never at an early epoch.
    """
    from ray import tune

    from alignlab.platform.study_search_tune import (PruneAwareOptunaSearch, restore_tuner, resume_or_set_aside,
                                                     scheduler, tune_domain)

    out_file = sdir / "searches" / f"{spec.name}.json"
    out_rel = f"studies/{sdir.name}/searches/{spec.name}.json"
    if out_file.exists() or (storage is not None and storage.pull_file(out_rel)):
        return read_json(out_file)
    resources = dict(resources or DEFAULT_TRIAL_RESOURCES)
    check_trial_resources(resources)
    prog = Progress(spec.num_samples, progress, what=f"search {spec.name}")

    class _ProgressCallback(tune.Callback):
        # Counted from Tune's own trial list, so that a restored search (below) counts its earlier trials.
        def setup(self, **info):
            prog.t0 = time.time()

        def on_trial_complete(self, iteration, trials, trial, **info):
            r = trial.last_result or {}
            how = "completed" if r.get("search_complete") else \
                "failed: diverged" if r.get("failed") else f"pruned at epoch {r.get('epoch', '?')}"
            prog.tick(f" (last trial {how}, {SEARCH_OBJECTIVE} {r.get(SEARCH_OBJECTIVE, float('nan')):.3f})",
                      done=sum(t.status == "TERMINATED" and t is not trial for t in trials) + 1)

    name = f"search-{spec.name}-{config_hash(base_calc['calc_id'], spec)}"
    where = tune_storage(storage, sdir)
    fs = where.get("storage_filesystem")
    trainable = tune.with_resources(tune.with_parameters(search_trial, storage_uri=base_calc.get("storage")), resources)
    # Tune keeps the param_space out of its snapshot: a restore is handed it again, or the restored trials
    # run without "calc" (checked on Ray 2.60).
    param_space = {"calc": tune_safe(base_calc), "threads": threads_per_trial(resources)}
    exp_path = f"{where['storage_path'].rstrip('/')}/{name}"
    tuner = None
    if resume_or_set_aside(exp_path, fs, label=f"[search {spec.name}]"):
        # A driver killed mid-search: Tune's experiment state holds the finished trials and the Optuna
        # sampler's state, so the search goes on from there; trials that were running restart from scratch
        # (a calculation has no checkpoint worth keeping).
        print(f"[search {spec.name}] resuming the interrupted search at {exp_path}", flush=True)
        tuner = restore_tuner(exp_path, trainable, param_space=param_space, fs=fs, label=f"[search {spec.name}]")
    if tuner is None:
        points = []
        if spec.start_from_base and all(p.contains(getattr(spec.base, p.name)) for p in spec.space):
            points = [{p.name: getattr(spec.base, p.name) for p in spec.space}]
        # The space goes to the searcher itself, not to param_space: a restored Tuner gets the searcher back
        # from its pickle but no param_space, and a searcher whose own state snapshot was not yet uploaded
        # would otherwise have no space to sample from.
        searcher = PruneAwareOptunaSearch(
            space=PruneAwareOptunaSearch.convert_search_space({p.name: tune_domain(p) for p in spec.space}),
            metric=SEARCH_OBJECTIVE, mode="max", seed=spec.seed, points_to_evaluate=points or None)
        tuner = tune.Tuner(
            trainable,
            param_space=param_space,
            tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler(spec), metric=SEARCH_OBJECTIVE,
                                        mode="max", num_samples=spec.num_samples, reuse_actors=True,
                                        max_concurrent_trials=concurrency(resources, max_concurrent),
                                        trial_dirname_creator=lambda t: f"{spec.name}-{t.trial_id}",
                                        trial_name_creator=lambda t: f"{spec.name}-{t.trial_id}"),
            # Tune uploads its experiment state (what a restore starts from) every 5 minutes by default.
            run_config=tune.RunConfig(name=name, **where, verbose=0, callbacks=[_ProgressCallback()],
                                      sync_config=tune.SyncConfig(sync_period=SEARCH_STATE_SYNC_S),
                                      failure_config=tune.FailureConfig(max_failures=1)),
        )
    results = tuner.fit()
    trials = []
    for r in results:
        if r.error or not r.metrics:
            trials.append({"status": "error", "error": str(r.error)[:500], "params": {}})
            continue
        params = {p.name: r.config[p.name] for p in spec.space}
        if r.metrics.get("failed"):
            trials.append({"params": params, "status": "failed", "error": r.metrics["failed"],
                           "epoch": r.metrics.get("epoch")})
            continue
        trials.append({"params": params, "status": "complete" if r.metrics.get("search_complete") else "pruned",
                       "epoch": r.metrics.get("epoch"), SEARCH_OBJECTIVE: r.metrics.get(SEARCH_OBJECTIVE),
                       "val_perplexity_at_best_ppl": r.metrics.get("val_perplexity_at_best_ppl")})
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
               "trials": trials, "tune_dir": str(sdir / "tune" / name)}
    write_json(out_file, summary)
    if storage is not None:
        storage.push_file(out_rel)
    return summary


def search_trial(config: dict, storage_uri: str | None = None) -> None:
    """A Ray Tune function trainable for one search trial: trains on the search's sample of its outer fold's
    training pool (`protocol.search_split`) and reports validation metrics every epoch; no test set is loaded."""
    import torch
    from ray import tune

    from alignlab.platform.finetune import NonFiniteError, finetune_calculation, load_pretrained
    from alignlab.platform.protocol import TaskData

    torch.set_num_threads(config.get("threads", 1))
    calc = localize(trial_calc(config["calc"], storage_uri))
    params = {k: v for k, v in config.items() if k not in ("calc", "threads")}
    ft = dataclasses.replace(finetune_from_dict(calc["finetune"]), **params)
    data = TaskData.load(Path(calc["task_dir"]))
    train, val, other = search_examples(data, ft)
    pre = load_pretrained(calc["model_dir"])
    best = {"ppl": math.inf, "acc": float("nan"), "epoch": 0}

    def on_epoch(epoch: int, m: dict) -> None:
        best["epoch"] = epoch
        if m["perplexity"] < best["ppl"]:
            best.update(ppl=m["perplexity"], acc=m["accuracy"])
        tune.report({"epoch": epoch, "val_accuracy": m["accuracy"], "val_perplexity": m["perplexity"],
                     SEARCH_OBJECTIVE: best["acc"], "val_perplexity_at_best_ppl": best["ppl"], "search_complete": 0})

    try:
        res = finetune_calculation(pre, ft, train, val, val=val, other_task_train=other, on_epoch=on_epoch).row
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


def search_examples(data, ft: FinetuneConfig) -> tuple[list, list, list | None]:
    """Every example a search trial learns or selects from: (train, val, the other task's training examples
    for the multitask scheme or None). `ft` is `SearchSpec.search_finetune()` with the trial's values."""
    from alignlab.platform.protocol import search_split

    train, val = search_split(data, ft.task, ft)
    return train, val, other_task_train(data, ft)


def finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
