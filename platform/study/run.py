"""Running a study on Ray, and the command line of a study script.

(1) build the bundled task datasets and the corpus (task documents held out), and check every
calculation's budget against the task pools; (2) make sure every pretrained model exists -- the
registry deduplicates them across studies; (3) run each Optuna search (if any; nested: one per test
fold that changes with the fold, `SearchSpec.nested`) and expand its best setting into the
calculations it may report on (`study.search`); (4) run every pending FEL calculation as a Ray Tune
trial (`study.grid`: a plain grid, no scheduler, no pruning); (5) aggregate and report.
Resumable at the calculation level: each finished calculation is written to
`trials/<calc-id>.json` (temp name, renamed), and a rerun -- after a crash, a kill of the driver,
or on purpose -- runs only the calculations without one. The table is the same either way. A
finished search is written to `searches/<name>.json` and is not repeated on a rerun.

Grid axes and Optuna spaces combine by running one search per grid cell (`SearchSpec`): Optuna
rejects `grid_search` axes (docs/architecture.md#ray-at-the-edges).
"""
from __future__ import annotations

import dataclasses
import inspect
import time
from pathlib import Path

from alignlab.platform.config import config_hash, pretrain_from_dict, to_dict, check_preset
from alignlab.platform.corpus.corpus_flags import add_corpus_arguments, corpus_from_args, fit_domain_phase
from alignlab.platform.corpus.corpus_repeats import (ALLOW_FLAG, MAX_CORPUS_REPEATS, check_corpus_repeats,
                                                   estimated_train_rows, train_rows)
from alignlab.platform.fel.trial_files import finished_calculations
from alignlab.platform.runtime.errors import (Parser, name_list, nonneg_float, positive_float, positive_int, positive_int_list,
                                      run_guarded)
from alignlab.platform.runtime.ray_env import ensure_ray, quiet_ray_data
from alignlab.platform.storage.locks import artifact_lock
from alignlab.platform.storage.root import as_storage, resolve_root, Storage, write_json
from alignlab.platform.study.flags import (add_debug_flag, add_max_concurrent_flag, add_optuna_storage_flag, add_precision_flag,
                                     add_preset_flag, add_storage_flag)
from alignlab.platform.study.grid import check_trial_resources, run_trials
from alignlab.platform.study.layout import MAX_MODELS_PER_GPU, pack, side_by_side
from alignlab.platform.study.plan import default_device, format_plan, study_plan
from alignlab.platform.study.search import run_search
from alignlab.platform.study.spec import (DEFAULT_TRIAL_RESOURCES, SEARCH_OBJECTIVE, CalcSpec, ModelSpec, Study,
                                          calc_id, study_folds, with_budget, with_folds, with_precision,
                                          with_pretrain_seeds, with_untrained)
from alignlab.platform.study.tasks import add_task_arguments, declare_specs, declared_budgets, with_tasks
from alignlab.platform.tasks.holdout import require_holdout
from alignlab.platform.tasks.task_files import write_jsonl

# The stages a study runs (corpus, pretraining, FEL, report: torch, pyarrow, pandas, optuna) are imported inside
# the functions that run them: a study script imports `study_main` and parses its flags (or prints its plan)
# without loading them.


def run_study(study: Study, root: Path | Storage, **kw) -> Path:
    """Run (or resume) a study and write its report; returns the report's path (keywords: `_run_study`).

    A second driver of the same study at the same root waits for the first (`locks`), then resumes or
    reuses what it left, instead of "restoring" a Tune experiment that is still running."""
    st = as_storage(root)
    with artifact_lock(st, f"study-{study.name}", label=f"[study {study.name}]",
                       progress=kw.get("progress", True)):
        return _run_study(study, st, **kw)


def _run_study(study: Study, st: Storage, *, max_concurrent: int | None = None, progress: bool = True,
               trial_resources: dict | None = None, max_parallel_pretrain: int | None = 1,
               optuna_storage: str | None = None, allow_corpus_repeats: bool = False) -> Path:
    """Run (or resume) a study and write its report; returns the report's path.

    `trial_resources` are one FEL trial's Ray resources ({"cpu": 1} by default); `max_parallel_pretrain`
    > 1 pretrains independent models side by side (each as a Ray task driving its own TorchTrainer) --
    for clusters: on a 2-CPU machine two trainers and their Ray Data pipelines starve each other of CPUs
    (docs/cluster.md#ray-data-needs-a-whole-cpu), so locally the default 1 (one after the other) is the safe choice.
    `optuna_storage`:
    an RDB URL for the searches' Optuna studies instead of their journal files (`optuna_study`).
    `allow_corpus_repeats`: pretrain models that would go over their corpus more than
    `corpus_repeats.MAX_CORPUS_REPEATS` times, which is refused otherwise (before the corpus is built when its
    sources allow an estimate, and again from its manifest before any model trains)."""
    from alignlab.platform.corpus.corpus import build_corpus, load_manifest
    from alignlab.platform.report.report import collect_results, write_report
    from alignlab.platform.runtime.provenance import provenance
    from alignlab.platform.tasks.task_data import build_tasks
    from alignlab.platform.tasks.task_kinds import declarations

    t0 = time.time()
    resources = dict(trial_resources or DEFAULT_TRIAL_RESOURCES)
    srel = st.study(study.name)
    sdir = st.here(srel)
    trained = {m.key: m.pretrain for m in study.models if m.pretrain.max_steps}
    if trained and not allow_corpus_repeats:  # first: before Ray starts or a corpus that cannot feed them is built
        rows = estimated_train_rows(study.corpus)
        if rows is not None:
            check_corpus_repeats(trained, rows, study.corpus.source, estimated=True)
    ensure_ray()
    # Before any work: a request the cluster can never hold would otherwise wait forever (issue #17).
    check_trial_resources(resources)
    from alignlab.platform.pretrain.driver import check_pretrain_resources

    for cfg in {(m.pretrain.num_workers, m.pretrain.cpus_per_worker, m.pretrain.use_gpu): m.pretrain
                for m in study.models}.values():
        check_pretrain_resources(cfg)
    sdir.mkdir(parents=True, exist_ok=True)
    say = print if progress else (lambda *a, **k: None)
    if max_parallel_pretrain is None:
        import ray

        max_parallel_pretrain = side_by_side(ray.cluster_resources(), [m.pretrain for m in study.models])
        shares = sorted({round(1 / m.pretrain.gpus_per_worker) for m in study.models
                         if m.pretrain.use_gpu and m.pretrain.max_steps and m.pretrain.gpus_per_worker < 1})
        say(f"[study {study.name}] pretraining up to {max_parallel_pretrain} model(s) side by side (from the "
            "cluster's GPUs; --parallel-pretrain N to choose)"
            + (f"; {'/'.join(map(str, shares))} small models per GPU (--models-per-gpu K to choose)" if shares else ""))
    say(f"[study {study.name}] building task datasets")
    tdir = build_tasks(st, langs=study.task_langs, max_docs_per_lang=study.task_max_docs_per_lang,
                       seed=study.corpus.seed, **dict(study.task_options))
    check_budgets(study, tdir)
    from alignlab.platform.tasks.task_data import TaskData

    data = TaskData.load(tdir)
    check_folds(study, data)
    overlap = sample_overlap(study, data)
    for line in overlap_warnings(study, overlap):
        say(line)
    eval_sets = stage_eval_files(study, sdir)
    if eval_sets:
        st.push(f"{srel}/eval")
    data_key = config_hash(tdir.name, eval_sets) if eval_sets else tdir.name
    corpus_cfg = dataclasses.replace(study.corpus, holdout_ids_file=str(tdir / "heldout_doc_ids.txt"))
    say(f"[study {study.name}] building corpus ({corpus_cfg.source})")
    cdir = build_corpus(corpus_cfg, st, progress=progress, task_dir=tdir)
    manifest = load_manifest(cdir)
    require_holdout(manifest, tdir.name)  # a study's evidence needs its test text kept out
    if trained and not allow_corpus_repeats:  # the exact count, also for the sources the estimate cannot read
        check_corpus_repeats(trained, train_rows(manifest), manifest["corpus_id"], estimated=False)
    mdirs = pretrain_models(study, cdir, st, max_parallel=max_parallel_pretrain, say=say)
    declared = declarations()  # tasks declared from files: every trial registers them in its own process

    def calc_dict(c: CalcSpec, salt: str = "") -> dict:
        mid = mdirs[c.model].name
        return {"calc_id": calc_id(mid, c.finetune, salt, data_key), "model_key": c.model, "model_id": mid,
                "model_dir": str(mdirs[c.model]), "task_dir": str(tdir), "row": c.row, "col": c.col,
                "group": c.group or c.row, "finetune": to_dict(c.finetune), "study_dir": str(sdir),
                "storage": st.uri, "task_id": tdir.name, "study_name": study.name,
                "eval_sets": {n: f for n, (task, f) in eval_sets.items() if task == c.finetune.task},
                "declared_tasks": declared}

    calcs = [calc_dict(c) for c in study.calcs]
    searches: dict[str, dict] = {}
    for s in (n for declared in study.searches for n in declared.nested()):
        say(f"[study {study.name}] search {s.name!r}: {s.num_samples} Optuna trials ({s.scheduler} pruning), "
            f"reported on (fold, seed) {list(s.points())}")
        base = calc_dict(CalcSpec(model=s.model, row=s.row, col=s.col, group=s.group, finetune=s.search_finetune()))
        searches[s.name] = run_search(s, base, sdir, resources=resources, max_concurrent=max_concurrent,
                                      progress=progress, storage=st, optuna_storage=optuna_storage)
        say(f"[study {study.name}] search {s.name!r}: best {searches[s.name]['best_params']} "
            f"({SEARCH_OBJECTIVE} = {searches[s.name]['best_value']:.3f})")
        # Salted so that a searched setting equal to a grid cell's stays a calculation of its own cell.
        calcs += [calc_dict(c, salt=f"search:{s.name}") for c in s.calcs_for(searches[s.name]["best_params"])]
    ids = [c["calc_id"] for c in calcs]
    if len(set(ids)) != len(ids):
        raise ValueError(f"study {study.name}: two cells declare the same calculation; make their settings differ")
    write_json(sdir / "study.json", {
        "name": study.name, "title": study.title, "baseline_col": study.baseline_col,
        "baseline_cells": [list(c) for c in study.baseline_cells], "plots": list(study.plots),
        "notes": study.notes, "corpus_dir": str(cdir), "task_dir": str(tdir), "control_col": study.control_col,
        "claims": [list(c) for c in study.claims], "sample_overlap": overlap, "provenance": provenance(),
        "models": {m.key: {"model_id": mdirs[m.key].name, "pretrain": to_dict(m.pretrain)} for m in study.models},
        "calculations": ids,
        "cells": {c["calc_id"]: {"row": c["row"], "col": c["col"], "group": c["group"]} for c in calcs},
        "searches": list(searches.values()),
    })
    st.push_file(f"{srel}/study.json")
    # A zero-length or cut-short trial file, or a calculation that ran out of memory, is not finished (trial_files).
    finished = finished_calculations(st, srel)
    pending = [c for c in calcs if c["calc_id"] not in finished]
    say(f"[study {study.name}] {len(calcs) - len(pending)} of {len(calcs)} calculations already done; "
        f"running {len(pending)}")
    if pending:
        run_trials(pending, sdir, max_concurrent=max_concurrent, progress=progress, resources=resources, storage=st)
    if st.remote:  # trials finished on other nodes wrote to the root: bring their result files over
        for f, size in st.sizes(f"{srel}/trials").items():
            here = sdir / "trials" / f
            if not here.exists() or here.stat().st_size != size:  # a rerun's result beside a damaged old copy
                st.pull_file(f"{srel}/trials/{f}")
    # Each model's pretrained aligned head read zero-shot on its tasks (PAD's on AD's pairs), once per model.
    from alignlab.platform.fel.zero_shot import record_zero_shot

    record_zero_shot(sdir, {mdirs[m.key].name: mdirs[m.key] for m in study.models if m.pretrain.max_steps},
                     {c.finetune.task: c.finetune.task_options for c in study.calcs}, tdir, say=say)
    collect_results(sdir)
    report = write_report(sdir)
    st.push(srel, exclude=("trials/", "tensorboard/", "tune/", "searches/"))
    say(f"[study {study.name}] done in {time.time() - t0:.0f}s")
    return report


def stage_eval_files(study: Study, sdir: Path) -> dict[str, tuple[str, str]]:
    """Validate the study's --eval-file test files and copy them into <study>/eval/ (so trials on any node
    read them from the storage root); returns {name: (task, file name under eval/)}. The name is the
    file's stem; a bad file fails here, before any pretraining, naming the file and line."""
    import re

    from alignlab.platform.tasks.task import load_examples

    out: dict[str, tuple[str, str]] = {}
    for task, path in study.eval_files:
        examples = load_examples(task, path)  # TaskDataError names every FILE:LINE: problem
        name = re.sub(r"[^a-z0-9]+", "_", Path(path).stem.lower()).strip("_") or "file"
        if name in out or name == "ood":
            raise ValueError(f"--eval-file {path}: another eval file (or the built-in 'ood' set) is named {name!r}; "
                             "rename one of them")
        write_jsonl(sdir / "eval" / f"{name}.jsonl", examples)
        out[name] = (task, f"{name}.jsonl")
    return out


def check_budgets(study: Study, tdir: Path) -> None:
    """Fail before any pretraining when a calculation asks for more examples than its task pool holds, naming both
    ways out: a smaller budget for the whole study, or for that task alone (a declared task's `budget=N`)."""
    from alignlab.platform.fel.protocol import check_honest_budget
    from alignlab.platform.tasks.task_data import TaskData

    data = TaskData.load(tdir)
    bad, short = set(), {}
    for c in study.calcs:
        n = pool_size(data, c.finetune.task, c.finetune.fold)
        if c.finetune.budget > n:
            bad.add(f"{c.row}/{c.col}: {c.finetune.task.upper()} budget {c.finetune.budget} > {n} available")
            short[c.finetune.task] = min(n, short.get(c.finetune.task, n))
        try:
            check_honest_budget(c.finetune)
        except ValueError as e:
            bad.add(f"{c.row}/{c.col}: {e}")
    for s in (n for declared in study.searches for n in declared.nested()):
        for fold in {s.search_fold, *(f for f, _ in s.points())}:
            n = pool_size(data, s.base.task, fold)
            if s.base.budget > n:
                bad.add(f"search {s.name}: {s.base.task.upper()} budget {s.base.budget} > {n} available")
                short[s.base.task] = min(n, short.get(s.base.task, n))
    if bad:
        ways = ""
        if short:
            most = min(short.values())
            ways = (f". Either run the whole study at a budget the pools hold (--budget {most} or less), or give "
                    "the task a budget of its own in its declaration (" + ", ".join(
                        f"--task name={t},...,budget={n}" for t, n in sorted(short.items())) + "; its pool's size or "
                    "less), or add examples to the pool")
        raise ValueError(f"study {study.name}: budgets exceed the task pools of {tdir}: " + "; ".join(sorted(bad))
                         + ways)


def check_folds(study: Study, data) -> None:
    """Fail before any pretraining when a task's pool cannot give the study's finetuning samples (`--folds`): the
    folds that draw from one pool (`Task.search_pool_key`: CT's one pool, AD's four training folds of a test fold)
    need that many distinct samples of the budget, C(pool, budget) of them at most; and where the test set changes
    with the fold (AD's cross-validation), every test fold must be used equally often, or some test units would
    weigh more than others in the pooled accuracy. `data`: the study's `TaskData`."""
    import math

    from alignlab.platform.tasks.task import task as task_named

    folds = study_folds(study)
    by_pool: dict[tuple[str, int], dict[str, set]] = {}
    for c in study.calcs:
        key = task_named(c.finetune.task).search_pool_key(c.finetune.fold)
        by_pool.setdefault((c.finetune.task, c.finetune.budget), {}).setdefault(key, set()).add(c.finetune.fold)
    for (name, budget), pools in sorted(by_pool.items()):
        uses = {len(f) for f in pools.values()}
        if len(uses) > 1:
            raise ValueError(f"study {study.name}: {name.upper()}'s folds cross-validate over {len(pools)} test folds, so "
                             f"{folds} finetuning samples would test some of its {task_named(name).test_units} more "
                             f"often than others; use a multiple of {len(pools)} (--folds {len(pools)}, "
                             f"{2 * len(pools)}, ...)")
        for key, fs in pools.items():
            n = pool_size(data, name, min(fs))
            distinct = math.comb(n, budget) if budget <= n else 0
            if distinct < len(fs):
                most = distinct * len(pools)
                raise ValueError(f"study {study.name}: {folds} finetuning samples per cell (--folds) need {len(fs)} "
                                 f"distinct samples of {name.upper()}'s budget {budget} from a pool of {n} examples, "
                                 f"which holds only {distinct}; use " + (f"--folds {most} or less, " if most >= 2 else "")
                                 + "a smaller budget, or add examples to the pool")


def overlap_warnings(study: Study, overlap: dict[str, dict]) -> list[str]:
    """The study's warning for each task whose finetuning samples overlap heavily (`sample_overlap`)."""
    folds = study_folds(study)
    return [f"[study {study.name}] warning: {task.upper()}'s finetuning samples draw {o['budget']} of {o['pool']} pool "
            f"examples: two of them share about {o['overlap']:.0%} of their examples, so the {folds} samples are "
            "nearly one (the report says so); more of them (--folds) narrow the spread between draws from this pool, "
            "not the verdict's dependence on it: a larger pool or a smaller budget does" for task, o in overlap.items()]


OVERLAP_WARNING = 0.5
"""Budget over pool above which two finetuning samples share more than half their examples (on average) and the
report warns that its folds are not independent samples of the budget."""


def sample_overlap(study: Study, data) -> dict[str, dict]:
    """{task: {"budget", "pool", "overlap"}} of the tasks whose calculations draw more than OVERLAP_WARNING of their
    pool (`data`: the study's `TaskData`): two random samples of n from N share n / N of their examples on average."""
    out: dict[str, dict] = {}
    for c in study.calcs:
        n = pool_size(data, c.finetune.task, c.finetune.fold)
        share = c.finetune.budget / n if n else 0.0
        if share > OVERLAP_WARNING and share > out.get(c.finetune.task, {}).get("overlap", 0.0):
            out[c.finetune.task] = {"budget": c.finetune.budget, "pool": n, "overlap": round(share, 3)}
    return out


def pool_size(data, task: str, fold: int) -> int:
    """Examples a calculation of this fold can sample its budget from (the pool of the task a config names)."""
    from alignlab.platform.fel import protocol
    from alignlab.platform.tasks.task import task as task_named

    return protocol.pool_size(data, task_named(task), fold)


def pretrain_models(study: Study, cdir: Path, st: Storage, *, max_parallel: int = 1,
                    say=print) -> dict[str, Path]:
    """Every model of the study, pretrained or found in the registry; `max_parallel` > 1 runs them side by side."""
    from alignlab.platform.pretrain.driver import pretrain

    def label(m: ModelSpec) -> str:
        return (f"model {m.key!r} ({m.pretrain.model.label}, {'+'.join(m.pretrain.objective_names)}, "
                f"{m.pretrain.max_steps} steps)")

    if max_parallel <= 1:
        mdirs = {}
        for m in study.models:
            say(f"[study {study.name}] pretraining {label(m)}")
            mdirs[m.key] = pretrain(cdir, m.pretrain, st)
        return mdirs
    import ray

    from alignlab.platform.corpus.corpus import load_manifest
    from alignlab.platform.pretrain.models import model_id

    cid = load_manifest(cdir)["corpus_id"]
    unique: dict[str, ModelSpec] = {}
    for m in study.models:  # two keys may name the same registry entry: train it once
        unique.setdefault(model_id(cid, m.pretrain), m)
    task = ray.remote(num_cpus=0)(_pretrain_task)
    todo, running, done = list(unique.items()), {}, {}
    while todo or running:
        while todo and len(running) < max_parallel:
            mid, m = todo.pop(0)
            say(f"[study {study.name}] pretraining {label(m)} (side by side, up to {max_parallel})")
            # The objective configs travel as objects: a plugin objective's class reaches the task by pickling.
            running[task.remote(str(cdir), to_dict(m.pretrain), st.uri, m.pretrain.objectives)] = mid
        ready, _ = ray.wait(list(running), num_returns=1)
        done[running.pop(ready[0])] = Path(ray.get(ready[0]))
    return {m.key: done[model_id(cid, m.pretrain)] for m in study.models}


def _pretrain_task(cdir: str, cfg: dict, root: str, objectives: tuple = ()) -> str:
    """A Ray task driving one pretraining run (the TorchTrainer-in-a-task pattern of
    docs/cluster.md#a-torchtrainer-inside-a-tune-trial-or-a-task)."""
    from alignlab.platform.pretrain.driver import pretrain

    quiet_ray_data()  # the DataContext is per process: same deterministic row order as from the driver
    cfg = {**cfg, "objectives": objectives} if objectives else cfg
    return str(pretrain(Path(cdir), pretrain_from_dict(cfg), resolve_root(root)))


# ---------------------------------------------------------------- the command line of a study script


def study_main(build, argv: list[str] | None = None, *, extra_objective_sets: bool = False,
               prog: str | None = None) -> Path | None:
    """The whole command line of a study script: `--preset`, `--storage`, concurrency, per-trial resources, and
    the corpus flags (`corpus_flags`: `--source NAME --path P ...`; a study on another corpus than its preset's
    is another study, named after that corpus).

    `extra_objective_sets`: the study's `build(preset, extra=...)` also takes extra objective sets, one model
    each, from a repeatable `--objectives` (the optional extra rows of an ablation, e.g. with RTD).
    With `--dry-run` it prints the study's plan (`plan`) and returns None. `prog`: the name usage and errors show
    (`alignlab study NAME` runs a script's `main` with it; default the script's file name)."""
    from alignlab.platform.encoder.registry import objective_names

    ap = Parser(prog=prog, description=build.__doc__)
    add_preset_flag(ap)
    add_debug_flag(ap)
    add_storage_flag(ap)
    add_max_concurrent_flag(ap, default=None, help="at most this many FEL trials at once (default: no cap -- as many "
                            "as the cluster holds, and an autoscaler adds nodes for the trials still waiting)")
    ap.add_argument("--cpus-per-trial", type=positive_float, default=1.0, help="Ray CPUs per FEL trial (default 1)")
    ap.add_argument("--gpus-per-trial", type=nonneg_float, default=0.0,
                    help="Ray GPUs per FEL trial, e.g. 0.25 to share a GPU by four trials (default 0)")
    ap.add_argument("--trial-resources", default=None, metavar="JSON",
                    help='extra Ray resources per FEL trial, e.g. \'{"fel_node": 1}\' to run trials only on nodes '
                         'of a worker type that offers that custom resource (an autoscaler adds them on demand)')
    ap.add_argument("--train-workers", type=positive_int, default=None,
                    help="Ray Train workers of each pretraining run (default: the preset's; part of the model id)")
    ap.add_argument("--cpus-per-train-worker", type=positive_float, default=None,
                    help="Ray CPUs per Train worker (default: the preset's), e.g. to fit a worker to a node type")
    ap.add_argument("--parallel-pretrain", type=positive_int, default=None,
                    help="independent pretraining runs side by side (default: as many as the Ray cluster's GPUs hold "
                         "when the models train on GPUs, one GPU per Train worker; 1 on CPUs)")
    ap.add_argument("--models-per-gpu", type=positive_int, default=None, metavar="K",
                    help="one-worker models trained on one GPU side by side, each on 1/K of it (default: as many as "
                         f"its step leaves the GPU idle for, up to {MAX_MODELS_PER_GPU}, study/layout.models_per_gpu; "
                         "1: a GPU each)")
    ap.add_argument("--gpus", type=nonneg_float, default=None, metavar="G",
                    help="with --dry-run: the cluster's GPUs to lay the models out on (default: this machine's)")
    ap.add_argument(ALLOW_FLAG, action="store_true",
                    help=f"pretrain even when a model would go over its corpus more than {MAX_CORPUS_REPEATS} times "
                         "(refused otherwise, before any model trains; more text, --source/--path, is the better fix)")
    from alignlab.platform.tasks.task import registered_tasks

    for t in registered_tasks():  # each task's own data-builder flags
        t.add_build_arguments(ap)
    ap.add_argument("--eval-file", action="append", default=[], metavar="TASK=PATH",
                    help="also score every finetuned calculation of TASK (ct or ad) on this JSONL test file; "
                         "repeatable, e.g. --eval-file ct=my_ct.jsonl --eval-file ad=my_ad.jsonl")
    add_optuna_storage_flag(ap, help="RDB URL of the searches' Optuna studies, e.g. sqlite:///optuna.db or "
                            "postgresql://… (default: $ALIGNLAB_OPTUNA_STORAGE, else a journal file beside each "
                            "search)")
    takes = inspect.signature(build).parameters
    ap.add_argument("--budget", type=positive_int, default=None, metavar="N",
                    help="finetuning examples per calculation, instead of the preset's (200 at mini and paper): the "
                         "budget the study's question is asked at" + ("; with --budgets, the reference row's"
                                                                      if "budgets" in takes else "")
                         + " (the study then gets its own name and report)")
    if "budgets" in takes:
        ap.add_argument("--budgets", type=positive_int_list, default=None, metavar="N,N,...",
                        help="the finetuning budgets the study compares, e.g. 25,50,100,150 (default: the paper's)")
    ap.add_argument("--with-untrained", action="store_true",
                    help="add an untrained column: each row's baseline architecture with no pretraining, a positive "
                         "control every pretrained column is tested against (costs no pretraining time)")
    ap.add_argument("--pretrain-seeds", type=positive_int, default=1, metavar="N",
                    help="pretrain every model N times (seeds seed..seed+N-1) and test across the runs: the "
                         "pretraining seed becomes a factor, not a constant (default 1; the study then gets its own "
                         "name and report)")
    ap.add_argument("--folds", type=positive_int, default=None, metavar="N",
                    help="finetuning samples (folds) per cell instead of the preset's (5 at mini and paper): folds "
                         "0..N-1, each at the cell's seeds; they shrink the finetuning part of a claim's variance "
                         "(alignlab plan --detect: how much). Refused before any work where a pool cannot give N "
                         "samples of the budget; AD needs 5 or fewer, or a multiple of its 5 test folds (the study "
                         "then gets its own name and report)")
    add_precision_flag(ap, help="matmul precision of pretraining (default auto: bf16 on a GPU or a CPU with native "
                       "bf16 matmuls, fp32 elsewhere); fp32 or bf16 trains the same models on every machine (the "
                       "study then gets its own name and report)")
    if extra_objective_sets:
        ap.add_argument("--objectives", action="append", default=[], metavar="OBJS",
                        type=name_list(objective_names, "objective"),
                        help="also pretrain and compare a model with this objective set, e.g. mlm,nsp,whp,pad,rtd "
                             "(repeatable; the study then gets its own name and report)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the models and calculations the study needs (which exist at the storage root, which "
                         "must be made) and its estimated device-hours, then stop: nothing runs or is written")
    ap.add_argument("--device", default=None, metavar="NAME",
                    help="with --dry-run: the device kind to estimate for, e.g. cpu, H100, A10G (default: cpu, or "
                         "the GPU the models' workers would use when they use GPUs)")
    ap.add_argument("--detect", type=positive_float, default=None, metavar="POINTS",
                    help="with --dry-run (alignlab plan): also the pretraining runs x finetuning samples needed to show "
                         "a gain of POINTS accuracy points in each claim, and their cost (platform/report/power.py)")
    ap.add_argument("--power", type=positive_float, default=0.8, help="with --detect: the power to reach (default 0.8)")
    ap.add_argument("--from", dest="power_from", type=Path, default=None, metavar="REPORT",
                    help="with --detect: a study folder (or its report.md) whose claims' variance components to plan "
                         "from (default: the committed mini report's)")
    add_corpus_arguments(ap)
    add_task_arguments(ap)
    args = ap.parse_args(argv)
    if args.detect is not None and not args.dry_run:
        ap.error("--detect plans a study: use it with --dry-run (alignlab plan)")
    if not 0 < args.power < 1:
        ap.error(f"--power must be between 0 and 1, got {args.power}")
    done: list[Path] = []
    code = run_guarded(lambda: done.append(_run_study_command(build, args, ap)), argv)
    if code:
        raise SystemExit(code)
    return done[0]


def task_options(args) -> tuple:
    """The tasks' build options given on the command line (`Task.add_build_arguments`: dest = the option name)."""
    from alignlab.platform.tasks.task import registered_tasks

    return tuple(sorted((k, getattr(args, k)) for t in registered_tasks() for k in t.build_options
                        if getattr(args, k, None) is not None))


def _run_study_command(build, args, ap) -> Path | None:
    from alignlab.platform.tasks.task import task_names

    declared = declare_specs(args.declare_tasks)  # TaskDataError names every FILE:LINE: problem
    eval_files = []
    for spec in args.eval_file:
        task, sep, path = spec.partition("=")
        names = task_names()
        if not sep or task not in names or not path:
            ap.error(f"--eval-file {spec!r}: expected {' or '.join(f'{n}=PATH' for n in names)}")
        if not Path(path).is_file():
            ap.error(f"--eval-file {spec!r}: {path} is not a file")
        eval_files.append((task, str(Path(path).resolve())))
    resources = {"cpu": args.cpus_per_trial, **({"gpu": args.gpus_per_trial} if args.gpus_per_trial else {})}
    if args.trial_resources:
        import json

        try:
            extra = json.loads(args.trial_resources)
        except json.JSONDecodeError as e:
            ap.error(f"--trial-resources is not JSON: {e}")
        if not isinstance(extra, dict) or not all(isinstance(v, (int, float)) and v > 0 for v in extra.values()):
            ap.error('--trial-resources must be a JSON object of positive amounts, e.g. \'{"fel_node": 1}\'')
        resources.update(extra)
    kw = {"extra": tuple(args.objectives)} if hasattr(args, "objectives") else {}
    takes = inspect.signature(build).parameters
    if "budgets" in takes:  # a study that varies the budget places --budget itself (its reference row)
        kw.update(budgets=args.budgets, budget=args.budget)
    built = build(check_preset(args.preset), **kw)
    try:
        if args.budget is not None and "budgets" not in takes:
            built = with_budget(built, args.budget)
        if args.with_untrained:
            built = with_untrained(built)
        built = with_pretrain_seeds(with_precision(built, args.precision), args.pretrain_seeds)
    except ValueError as e:
        ap.error(str(e))
    study = dataclasses.replace(with_tasks(built, declared, args.only_tasks and args.only_tasks.split(","),
                                           declared_budgets(args.declare_tasks)),
                                task_options=task_options(args), eval_files=tuple(eval_files))
    corpus = corpus_from_args(built.corpus, args)
    if corpus != built.corpus:  # its own folder and report, as with extra objective sets
        name = f"{built.name}-{corpus.source}-{config_hash(corpus, length=8)}"
        names = [s.name for s in corpus.source_specs]
        study = dataclasses.replace(study, corpus=corpus, name=name, models=tuple(
            dataclasses.replace(m, pretrain=fit_domain_phase(m.pretrain, names)) for m in study.models))
    if args.folds is not None:  # after the corpus's rename, so that its name keeps the folds
        try:
            study = with_folds(study, args.folds)
        except ValueError as e:
            ap.error(str(e))
    train = {k: v for k, v in (("num_workers", args.train_workers), ("cpus_per_worker", args.cpus_per_train_worker))
             if v is not None}
    if train:  # every model the study pretrains, sized to the cluster's nodes
        study = dataclasses.replace(study, models=tuple(dataclasses.replace(m, pretrain=dataclasses.replace(
            m.pretrain, **train)) for m in study.models))
    # Small GPU models share a GPU (a runtime field: the ids stay); after --train-workers, which makes a model
    # data-parallel and so unpackable.
    packed = pack([m.pretrain for m in study.models], study.corpus.vocab_size, args.models_per_gpu)
    study = dataclasses.replace(study, models=tuple(dataclasses.replace(m, pretrain=c)
                                                    for m, c in zip(study.models, packed)))
    root = resolve_root(args.storage)
    if args.dry_run:
        plan = study_plan(study, root, device=args.device or default_device(study), gpus=args.gpus,
                          parallel=args.parallel_pretrain, trial_gpus=args.gpus_per_trial)
        print(format_plan(plan))
        if args.detect is not None:
            from alignlab.platform.report.power import power_plan

            try:
                print("\n".join(power_plan(study, plan, args.detect, args.power, args.power_from)))
            except ValueError as e:
                ap.error(str(e))
        return None
    report = run_study(study, root, max_concurrent=args.max_concurrent,
                       trial_resources=resources, max_parallel_pretrain=args.parallel_pretrain,
                       optuna_storage=args.optuna_storage, allow_corpus_repeats=args.allow_corpus_repeats)
    print(f"Report: {report}")
    if root.remote:
        print(f"Stored at: {root.url(root.study(study.name, 'report.md'))}")
    return report
