"""Studies: a declared set of pretrained models and FEL calculations, run on Ray, answered by a report.

Running a study: (1) build the bundled task datasets and the corpus (task documents held out), and
check every calculation's budget against the task pools; (2) make sure every pretrained model
exists -- the registry deduplicates them across studies; (3) run each Optuna search (if any; nested:
one per test fold that changes with the fold, `SearchSpec.nested`) and expand its best setting into
the calculations it may report on; (4) run every pending FEL calculation as
a Ray Tune trial (a plain grid: no scheduler, no pruning); (5) aggregate and report.
Resumable at the calculation level: each finished calculation is written to
`trials/<calc-id>.json` (temp name, renamed), and a rerun -- after a crash, a kill of the driver,
or on purpose -- runs only the calculations without one. The table is the same either way. A
finished search is written to `searches/<name>.json` and is not repeated on a rerun.

Grid axes and Optuna spaces combine by running one search per grid cell (`SearchSpec`): Optuna
rejects `grid_search` axes (STYLE.md).
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path

from alignlab.platform.config import (MODEL_SIZES, CorpusConfig, FinetuneConfig, ModelConfig, PretrainConfig,
                                      config_hash, finetune_from_dict, pretrain_from_dict, to_dict)
from alignlab.platform.storage import Storage, as_storage, read_json, study_dir, write_json

DEFAULT_TRIAL_RESOURCES = {"cpu": 1}
"""Ray resources of one FEL trial; on a GPU cluster e.g. {"cpu": 1, "gpu": 0.25} (`--gpus-per-trial`)."""


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    key: str
    """Name of the model inside the study, e.g. "all", "-whp", "768x3"."""
    pretrain: PretrainConfig


@dataclass(frozen=True, kw_only=True)
class CalcSpec:
    """One FEL calculation; `row`/`col` place its result in the report's table."""

    model: str
    finetune: FinetuneConfig
    row: str
    col: str
    group: str = ""
    """Rows of one group share a baseline cell (`Study.baseline_cells`); empty means the row is its own group."""


@dataclass(frozen=True, kw_only=True)
class SearchParam:
    """One searched `FinetuneConfig` field: "loguniform"/"uniform" over (low, high), "int" over [low, high], or "choice"."""

    name: str
    kind: str
    values: tuple

    def __post_init__(self) -> None:
        fields = {f.name for f in dataclasses.fields(FinetuneConfig)}
        if self.name not in fields or self.name in _UNSEARCHABLE:
            raise ValueError(f"SearchParam {self.name!r}: not a searchable FinetuneConfig field "
                             f"(choose from {sorted(fields - set(_UNSEARCHABLE))})")
        if self.kind not in ("loguniform", "uniform", "int", "choice"):
            raise ValueError(f"SearchParam {self.name!r}: kind must be loguniform, uniform, int or choice, got {self.kind!r}")
        if self.kind == "choice" and not self.values:
            raise ValueError(f"SearchParam {self.name!r}: a choice needs at least one value")
        if self.kind != "choice" and (len(self.values) != 2 or not self.values[0] < self.values[1]):
            raise ValueError(f"SearchParam {self.name!r}: {self.kind} needs (low, high) with low < high, got {self.values}")
        if self.kind == "loguniform" and self.values[0] <= 0:
            raise ValueError(f"SearchParam {self.name!r}: loguniform needs low > 0")

    def contains(self, value) -> bool:
        if self.kind == "choice":
            return value in self.values
        return self.values[0] <= value <= self.values[1]

    def upper(self):
        return max(self.values)

    def to_tune(self):
        from ray import tune

        if self.kind == "choice":
            return tune.choice(list(self.values))
        if self.kind == "int":
            return tune.randint(self.values[0], self.values[1] + 1)
        return (tune.loguniform if self.kind == "loguniform" else tune.uniform)(*self.values)


# The task, the test fold, the seed and the selection mode are what a search is *about*, not knobs of it.
_UNSEARCHABLE = ("task", "fold", "seed", "selection", "budget")

SEARCH_OBJECTIVE = "val_accuracy_at_best_ppl"
"""What a search maximizes: validation accuracy at the epoch of best validation perplexity so far -- the
honest-mode counterpart of the protocol's reported number (accuracy at the best-perplexity epoch)."""


@dataclass(frozen=True, kw_only=True)
class SearchSpec:
    """An Optuna (TPE) search of finetuning settings for one model and one grid cell (e.g. one task),
    maximizing `SEARCH_OBJECTIVE` on the validation split carved from the budget (honest selection;
    the test set is never loaded by a search trial). Its best setting is then run as ordinary
    calculations at `final_points` (the protocol's ten (fold, seed) by default) in cell (row, col).

    Selection is nested (`nested()`, `protocol.search_groups`): a declared search becomes one search per
    outer fold whose test set changes with the fold (AD: the calculations of fold f report the best
    setting of a search that sampled only from f's four training folds), or one search for all points
    when the test set is fixed and separate (CT: the search samples from the pool). No searched example
    is ever in the test set of a calculation that reports the search's setting."""

    name: str
    """Unique within the study; names the search's folder and files."""
    model: str
    base: FinetuneConfig
    """The fixed settings; searched fields are replaced by the trial's values."""
    space: tuple[SearchParam, ...]
    num_samples: int
    row: str
    col: str
    group: str = ""
    scheduler: str = "asha"
    """"asha" (ASHA, reduction factor 3), "median" (median stopping rule) or "fifo" (no pruning)."""
    grace_period: int = 1
    """Epochs a trial runs before it can be pruned."""
    search_fold: int | None = None
    """The outer fold whose training pool every trial samples from (`protocol.search_split`); None (the
    declaration) means one search per outer fold, made by `nested()`."""
    search_seed: int = 2
    """The seed of every trial: initialisation and batch order only (the sample depends on the fold)."""
    final_points: tuple[tuple[int, int], ...] = ()
    """(fold, seed) of the calculations the best setting is run on; empty means the protocol's ten."""
    start_from_base: bool = True
    """Evaluate `base`'s own values first (Optuna `points_to_evaluate`) when they lie inside the space."""
    seed: int = 0
    """Seed of Optuna's TPE sampler."""

    def __post_init__(self) -> None:
        if self.base.selection != "honest":
            raise ValueError(f"search {self.name!r}: searches select on validation data only; "
                             "use a base FinetuneConfig with selection='honest'")
        names = [p.name for p in self.space]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"search {self.name!r}: the space needs distinct parameters, got {names}")
        if self.scheduler not in ("asha", "median", "fifo"):
            raise ValueError(f"search {self.name!r}: scheduler must be asha, median or fifo, got {self.scheduler!r}")
        if self.num_samples < 1 or self.grace_period < 1:
            raise ValueError(f"search {self.name!r}: num_samples and grace_period must be >= 1")
        self.finetune_for({p.name: (p.values[0]) for p in self.space})  # every point of the space is a valid config
        if self.search_fold is not None:
            from alignlab.platform.protocol import search_groups

            outer = set(search_groups(self.base.task, self.points())) - {None}
            if outer - {self.search_fold}:
                raise ValueError(f"search {self.name!r}: it samples from the training folds of fold {self.search_fold}, "
                                 f"so it cannot choose the setting of calculations tested on fold(s) "
                                 f"{sorted(outer - {self.search_fold})}; leave search_fold None for one search per fold")

    def finetune_for(self, params: dict) -> FinetuneConfig:
        return dataclasses.replace(self.base, **params)

    def max_epochs_upper(self) -> int:
        p = {q.name: q for q in self.space}.get("max_epochs")
        return int(p.upper()) if p else self.base.max_epochs

    def points(self) -> tuple[tuple[int, int], ...]:
        from alignlab.platform.protocol import calculations

        return self.final_points or tuple(calculations())

    def nested(self) -> tuple["SearchSpec", ...]:
        """The searches `run_study` runs for this declaration: one per outer fold (named `<name>-fold<f>`, each
        reporting on the points of its fold), or itself for a task whose test set is the same for every point."""
        from alignlab.platform.protocol import search_groups

        if self.search_fold is not None:
            return (self,)
        return tuple(dataclasses.replace(self, name=self.name if fold is None else f"{self.name}-fold{fold}",
                                         search_fold=pts[0][0] if fold is None else fold, final_points=pts)
                     for fold, pts in search_groups(self.base.task, self.points()).items())

    def search_finetune(self) -> FinetuneConfig:
        """The config a trial starts from (before the trial's values): the outer fold and the search's seed."""
        assert self.search_fold is not None, "call nested() first"
        return dataclasses.replace(self.base, fold=self.search_fold, seed=self.search_seed)

    def calcs_for(self, best: dict) -> tuple[CalcSpec, ...]:
        ft = self.finetune_for(best)
        return tuple(CalcSpec(model=self.model, row=self.row, col=self.col, group=self.group,
                              finetune=dataclasses.replace(ft, fold=f, seed=s)) for f, s in self.points())


@dataclass(frozen=True, kw_only=True)
class Study:
    name: str
    title: str
    corpus: CorpusConfig
    models: tuple[ModelSpec, ...]
    calcs: tuple[CalcSpec, ...]
    baseline_col: str
    """Column of the table that significance is tested against (`report.significant_gain`: paired t-test), row by row."""
    baseline_cells: tuple[tuple[str, str], ...] = ()
    """(row, col) cells tested against instead, one per group: every row is compared with the baseline cell
    of its group (the paper's Tables 1-2: one underlined cell per task). Empty: `baseline_col`, row by row."""
    searches: tuple[SearchSpec, ...] = ()
    task_langs: tuple[str, ...] = ("en", "es", "fr")
    task_max_docs_per_lang: int | None = None
    task_snippets: int = 600
    ct_data: str = "npm"
    """CT dataset: "npm" (the shipped hand-labelled real-text set) or "templated" (see protocol.CT_DATA)."""
    eval_files: tuple[tuple[str, str], ...] = ()
    """(task, path) of a user's own test files: every calculation of that task is also scored on each,
    with its own columns (`eval_<file stem>_accuracy`, ...) in results.parquet and the report."""
    plots: tuple[str, ...] = ()
    """Which plots the report draws: "bars" (accuracy per column with error bars), "budget" (accuracy vs n),
    "by_size" (accuracy per column, one line per row, one panel per group)."""
    notes: str = ""

    def __post_init__(self) -> None:
        keys = [m.key for m in self.models]
        if len(set(keys)) != len(keys):
            raise ValueError(f"study {self.name}: model keys repeat: {keys}")
        unknown = {c.model for c in self.calcs} | {s.model for s in self.searches}
        unknown -= set(keys)
        if unknown:
            raise ValueError(f"study {self.name}: calculations use undeclared models {sorted(unknown)}")
        snames = [n.name for s in self.searches for n in s.nested()]
        if len(set(snames)) != len(snames):
            raise ValueError(f"study {self.name}: search names repeat: {snames}")
        cells = {(c.row, c.col) for c in self.calcs} | {(s.row, s.col) for s in self.searches}
        if self.baseline_col not in {col for _, col in cells}:
            raise ValueError(f"study {self.name}: baseline column {self.baseline_col!r} has no calculations")
        groups = {}
        for c in (*self.calcs, *self.searches):
            groups.setdefault(c.group or c.row, set()).add(c.row)
        for r, c in self.baseline_cells:
            if (r, c) not in cells:
                raise ValueError(f"study {self.name}: baseline cell {(r, c)} has no calculations")
        if self.baseline_cells:
            owners = [g for r, _ in self.baseline_cells for g, rows in groups.items() if r in rows]
            if len(set(owners)) != len(owners):
                raise ValueError(f"study {self.name}: more than one baseline cell in a group: {self.baseline_cells}")


def calc_id(model_id: str, ft: FinetuneConfig, salt: str = "", data: str = "") -> str:
    """A calculation's id: its model, its finetuning config, and (`data`) the task data and extra test
    files it is scored on, so that other data never counts as this calculation done."""
    return f"{ft.task}-{config_hash(model_id, ft, *([salt] if salt else []), *([data] if data else []))}"


# ---------------------------------------------------------------- model sizes at each preset

SIZE_GRID: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "smoke": ((16, 32), (1, 2)),
    "mini": ((64, 128), (1, 2)),
    "paper": ((256, 512, 768), (1, 2, 3)),
}
"""(widths, depths) standing in for the paper's 256/512/768 x 1/2/3 at each preset. The largest
stands in for 768x3. At mini it is the mini preset's own model (128x2), so a study's 768x3 analogue
is the same registry entry as the objective ablation's."""


def sized_model(preset: str, hidden: int, num_layers: int) -> ModelConfig:
    """The model of a given width and depth at a preset: the preset's shape (head size, FFN, length), resized."""
    if preset == "paper":
        return MODEL_SIZES[f"{hidden}x{num_layers}"]
    from alignlab.platform.config import PRETRAIN_PRESETS

    base = PRETRAIN_PRESETS[preset].model  # its recipe too (norm, dropout), not only its shape
    return dataclasses.replace(base, hidden=hidden, num_layers=num_layers, head_dim=min(base.head_dim, hidden))


def largest_size(preset: str) -> tuple[int, int]:
    """(width, depth) of the preset's stand-in for the paper's 768x3."""
    widths, depths = SIZE_GRID[preset]
    return max(widths), max(depths)


ALIGNED_OBJECTIVES = "mlm,nsp,whp,pad"
WITHOUT_ALIGNED = {"ct": ("-whp", "mlm,nsp,pad"), "ad": ("-pad", "mlm,nsp,whp")}
"""Per task, the model pretrained without the objective aligned to it (the paper's "768-"): its key and objectives."""


def sized_pretrain(preset: str, hidden: int, num_layers: int, objectives: str = ALIGNED_OBJECTIVES) -> PretrainConfig:
    """The preset's pretraining run for a model of this size and objective set."""
    from alignlab.platform.config import PRETRAIN_PRESETS

    return dataclasses.replace(PRETRAIN_PRESETS[preset], model=sized_model(preset, hidden, num_layers),
                               objectives=objectives)


def protocol_points(preset: str) -> list[tuple[int, int]]:
    """(fold, seed) of a data point's calculations: the protocol's ten, two at smoke."""
    from alignlab.platform.protocol import calculations

    return calculations()[:2] if preset == "smoke" else calculations()


SMOKE_TASK_DOCS = 3000
"""Documents per language the smoke studies build their task datasets from (`Study.task_max_docs_per_lang`)."""


def planned_calc_ids(study: Study) -> list[str]:
    """The grid's calculation ids as `run_study` will name them, up to the corpus id (no Ray, nothing built)."""
    from alignlab.platform.pretrain_ray import model_id

    cid = f"planned-{config_hash(study.corpus)}"
    mids = {m.key: model_id(cid, m.pretrain) for m in study.models}
    return [calc_id(mids[c.model], c.finetune) for c in study.calcs]


# ---------------------------------------------------------------- running a study


def run_study(study: Study, root: Path | Storage, *, max_concurrent: int | None = None, progress: bool = True,
              trial_resources: dict | None = None, max_parallel_pretrain: int = 1) -> Path:
    """Run (or resume) a study and write its report; returns the report's path.

    `trial_resources` are one FEL trial's Ray resources ({"cpu": 1} by default); `max_parallel_pretrain`
    > 1 pretrains independent models side by side (each as a Ray task driving its own TorchTrainer) --
    for clusters: on a 2-CPU machine two trainers and their Ray Data pipelines starve each other of CPUs
    (RAY_NOTES pitfall 1), so locally the default 1 (one after the other) is the safe choice."""
    from alignlab.platform.corpus import build_corpus
    from alignlab.platform.protocol import build_tasks
    from alignlab.platform.ray_env import ensure_ray
    from alignlab.platform.report import collect_results, write_report

    t0 = time.time()
    st = as_storage(root)
    resources = dict(trial_resources or DEFAULT_TRIAL_RESOURCES)
    srel = f"studies/{study.name}"
    sdir = study_dir(st.local, study.name)
    ensure_ray()
    # Before any work: a request the cluster can never hold would otherwise wait forever (issue #17).
    check_trial_resources(resources)
    from alignlab.platform.pretrain_ray import check_pretrain_resources

    for cfg in {(m.pretrain.num_workers, m.pretrain.cpus_per_worker, m.pretrain.use_gpu): m.pretrain
                for m in study.models}.values():
        check_pretrain_resources(cfg)
    sdir.mkdir(parents=True, exist_ok=True)
    say = print if progress else (lambda *a, **k: None)
    say(f"[study {study.name}] building task datasets")
    tdir = build_tasks(st, langs=study.task_langs, max_docs_per_lang=study.task_max_docs_per_lang,
                       target_snippets=study.task_snippets, seed=study.corpus.seed, ct_data=study.ct_data)
    check_budgets(study, tdir)
    eval_sets = stage_eval_files(study, sdir)
    if eval_sets:
        st.push(f"{srel}/eval")
    data_key = config_hash(tdir.name, eval_sets) if eval_sets else tdir.name
    corpus_cfg = dataclasses.replace(study.corpus, holdout_ids_file=str(tdir / "heldout_doc_ids.txt"))
    say(f"[study {study.name}] building corpus ({corpus_cfg.source})")
    cdir = build_corpus(corpus_cfg, st, progress=progress)
    mdirs = pretrain_models(study, cdir, st, max_parallel=max_parallel_pretrain, say=say)

    def calc_dict(c: CalcSpec, salt: str = "") -> dict:
        mid = mdirs[c.model].name
        return {"calc_id": calc_id(mid, c.finetune, salt, data_key), "model_key": c.model, "model_id": mid,
                "model_dir": str(mdirs[c.model]), "task_dir": str(tdir), "row": c.row, "col": c.col,
                "group": c.group or c.row, "finetune": to_dict(c.finetune), "study_dir": str(sdir),
                "storage": st.uri, "task_id": tdir.name, "study_name": study.name,
                "eval_sets": {n: f for n, (task, f) in eval_sets.items() if task == c.finetune.task}}

    calcs = [calc_dict(c) for c in study.calcs]
    searches: dict[str, dict] = {}
    for s in (n for declared in study.searches for n in declared.nested()):
        say(f"[study {study.name}] search {s.name!r}: {s.num_samples} Optuna trials ({s.scheduler} pruning), "
            f"reported on (fold, seed) {list(s.points())}")
        base = calc_dict(CalcSpec(model=s.model, row=s.row, col=s.col, group=s.group, finetune=s.search_finetune()))
        searches[s.name] = run_search(s, base, sdir, resources=resources, max_concurrent=max_concurrent,
                                      progress=progress, storage=st)
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
        "notes": study.notes, "corpus_dir": str(cdir), "task_dir": str(tdir),
        "models": {m.key: {"model_id": mdirs[m.key].name, "pretrain": to_dict(m.pretrain)} for m in study.models},
        "calculations": ids,
        "cells": {c["calc_id"]: {"row": c["row"], "col": c["col"], "group": c["group"]} for c in calcs},
        "searches": list(searches.values()),
    })
    st.push_file(f"{srel}/study.json")
    finished = {f[: -len(".json")] for f in st.list(f"{srel}/trials") if f.endswith(".json")}
    pending = [c for c in calcs if c["calc_id"] not in finished]
    say(f"[study {study.name}] {len(calcs) - len(pending)} of {len(calcs)} calculations already done; "
        f"running {len(pending)}")
    if pending:
        run_trials(pending, sdir, max_concurrent=max_concurrent, progress=progress, resources=resources, storage=st)
    if st.remote:  # trials finished on other nodes wrote to the root: bring their result files over
        for f in st.list(f"{srel}/trials"):
            if not (sdir / "trials" / f).exists():
                st.pull_file(f"{srel}/trials/{f}")
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

    from alignlab.platform.tasks import load_examples, write_jsonl

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
    """Fail before any pretraining when a calculation asks for more examples than its task pool holds."""
    from alignlab.platform.protocol import TaskData

    data = TaskData.load(tdir)
    bad = set()
    for c in study.calcs:
        n = pool_size(data, c.finetune.task, c.finetune.fold)
        if c.finetune.budget > n:
            bad.add(f"{c.row}/{c.col}: {c.finetune.task.upper()} budget {c.finetune.budget} > {n} available")
    for s in (n for declared in study.searches for n in declared.nested()):
        for fold in {s.search_fold, *(f for f, _ in s.points())}:
            n = pool_size(data, s.base.task, fold)
            if s.base.budget > n:
                bad.add(f"search {s.name}: {s.base.task.upper()} budget {s.base.budget} > {n} available")
    if bad:
        raise ValueError(f"study {study.name}: budgets exceed the task pools of {tdir}: " + "; ".join(sorted(bad)))


def pool_size(data, task: str, fold: int) -> int:
    """Examples a calculation can sample its budget from: CT's 275-query pool, or AD's four training folds."""
    from alignlab.platform.protocol import NUM_FOLDS, _ad_folds

    if task == "ct":
        return len(data.ct_pool)
    return len(data.ad) - len(_ad_folds(data.ad)[fold % NUM_FOLDS])


def pretrain_models(study: Study, cdir: Path, root: Path | Storage, *, max_parallel: int = 1,
                    say=print) -> dict[str, Path]:
    """Every model of the study, pretrained or found in the registry; `max_parallel` > 1 runs them side by side."""
    from alignlab.platform.pretrain_ray import pretrain

    def label(m: ModelSpec) -> str:
        return (f"model {m.key!r} ({m.pretrain.model.label}, {'+'.join(m.pretrain.objective_names)}, "
                f"{m.pretrain.max_steps} steps)")

    if max_parallel <= 1:
        mdirs = {}
        for m in study.models:
            say(f"[study {study.name}] pretraining {label(m)}")
            mdirs[m.key] = pretrain(cdir, m.pretrain, root)
        return mdirs
    import ray

    from alignlab.platform.corpus import load_manifest
    from alignlab.platform.pretrain_ray import model_id

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
            running[task.remote(str(cdir), to_dict(m.pretrain), as_storage(root).uri)] = mid
        ready, _ = ray.wait(list(running), num_returns=1)
        done[running.pop(ready[0])] = Path(ray.get(ready[0]))
    return {m.key: done[model_id(cid, m.pretrain)] for m in study.models}


def _pretrain_task(cdir: str, cfg: dict, root: str) -> str:
    """A Ray task driving one pretraining run (the TorchTrainer-in-a-task pattern of RAY_NOTES §3)."""
    from alignlab.platform.pretrain_ray import pretrain
    from alignlab.platform.ray_env import quiet_ray_data
    from alignlab.platform.storage import resolve_root

    quiet_ray_data()  # the DataContext is per process: same deterministic row order as from the driver
    return str(pretrain(Path(cdir), pretrain_from_dict(cfg), resolve_root(root)))


class _Progress:
    """Trials done / total and an ETA, printed as trials finish."""

    def __init__(self, total: int, enabled: bool, what: str = "trials"):
        self.total, self.done, self.t0, self.enabled, self.what = total, 0, time.time(), enabled, what

    def tick(self, extra: str = "", done: int | None = None) -> None:
        self.done = self.done + 1 if done is None else done
        if not self.enabled:
            return
        el = time.time() - self.t0
        eta = el / self.done * (self.total - self.done)
        print(f"[{self.what}] {self.done}/{self.total} done, {el:.0f}s elapsed, ETA {eta:.0f}s{extra}", flush=True)


def check_trial_resources(resources: dict) -> None:
    """Refuse an FEL trial's resources that no node of the cluster (now or after autoscaling) can hold."""
    from alignlab.platform.resources import check_request

    check_request("an FEL trial", resources,
                  hint="lower --cpus-per-trial / --gpus-per-trial, or drop --trial-resources")


def _concurrency(resources: dict, max_concurrent: int | None) -> int:
    import ray

    if max_concurrent:
        return max_concurrent
    have = ray.cluster_resources()
    n = have.get("CPU", 1) / resources["cpu"] if resources.get("cpu") else have.get("CPU", 1)
    if resources.get("gpu"):
        n = min(n, have.get("GPU", 0) / resources["gpu"])
    return max(1, int(n))


def _threads(resources: dict) -> int:
    return max(1, int(resources.get("cpu", 1)))


def _tune_storage(st: Storage | None, sdir: Path) -> dict:
    """Where Tune keeps its experiment state: under the study at the root (shared by every node)."""
    if st is None or not st.remote:
        return {"storage_path": str(sdir / "tune")}
    return {"storage_path": st.ray_path(f"studies/{sdir.name}/tune"), "storage_filesystem": st.ray_filesystem()}


FEL_EXPERIMENT = "fel"
"""The Tune experiment folder of a study's FEL calculations: `<study>/tune/fel/<calc-id>/`."""


def run_trials(calcs: list[dict], sdir: Path, *, max_concurrent: int | None = None, progress: bool = True,
               resources: dict | None = None, storage: Storage | None = None) -> None:
    from ray import tune

    resources = dict(resources or DEFAULT_TRIAL_RESOURCES)
    check_trial_resources(resources)
    prog = _Progress(len(calcs), progress)

    class _ProgressCallback(tune.Callback):
        def on_trial_complete(self, iteration, trials, trial, **info):
            prog.tick()

    uri = next((c["storage"] for c in calcs if c.get("storage")), None)
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(fel_trial, storage_uri=uri), resources),
        param_space={"calc": tune.grid_search([_tune_safe(c) for c in calcs]), "threads": _threads(resources)},
        # Reusing trial actors saves each calculation a fresh worker process (torch import, ~seconds on a small
        # box); a calculation sets its own seeds and builds everything it uses, so its result is unchanged.
        tune_config=tune.TuneConfig(max_concurrent_trials=_concurrency(resources, max_concurrent), reuse_actors=True,
                                    trial_dirname_creator=lambda t: t.config["calc"]["calc_id"],
                                    trial_name_creator=lambda t: t.config["calc"]["calc_id"]),
        # One experiment folder per study, reused by every rerun: each trial's folder is its calculation id, so a
        # resumed study adds the calculations it had not finished beside the others (not a new fel-<hash> each time).
        run_config=tune.RunConfig(name=FEL_EXPERIMENT,
                                  **_tune_storage(storage, sdir), verbose=0, callbacks=[_ProgressCallback()],
                                  failure_config=tune.FailureConfig(max_failures=1)),
    )
    results = tuner.fit()
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(f"{len(errors)} FEL calculation(s) failed; first error: {errors[0]}")


def _tune_safe(calc: dict) -> dict:
    """A calc dict as it goes into a Tune param space, which Tune writes to params.json, result.json, its
    experiment state and TensorBoard: the storage URI without credentials (`storage.redact`). The trial gets
    the real URI beside it (`tune.with_parameters`, through the object store; `_trial_calc`)."""
    from alignlab.platform.storage import redact

    return {**calc, "storage": redact(calc["storage"])} if calc.get("storage") else calc


def _trial_calc(calc: dict, storage_uri: str | None) -> dict:
    return {**calc, "storage": storage_uri} if storage_uri and calc.get("storage") else calc


def fel_trial(config: dict, storage_uri: str | None = None) -> None:
    """A Ray Tune function trainable: one FEL calculation, plain PyTorch (no TorchTrainer start-up cost)."""
    import torch
    from ray import tune

    calc = _trial_calc(config["calc"], storage_uri)
    torch.set_num_threads(config.get("threads", 1))
    result = run_one(calc)
    tune.report({**{k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)},
                 "failed": int(result.get("status") == "failed")})


def run_one(calc: dict) -> dict:
    """Run a calculation described by a study's calc dict and write its trial file (atomically). A calculation
    whose selection numbers are never finite is written as `status: failed` with the reason (`error`)."""
    from torch.utils.tensorboard import SummaryWriter

    from alignlab.platform.finetune import NonFiniteError, load_pretrained, run_calculation
    from alignlab.platform.protocol import TaskData, context_free_baselines, extra_test_scores, fel_split
    from alignlab.platform.tasks import load_examples

    ft = finetune_from_dict(calc["finetune"])
    calc = localize(calc)
    sdir = Path(calc["study_dir"])
    data = TaskData.load(Path(calc["task_dir"]))
    train, val, test = fel_split(data, ft.task, ft)
    other = _other_task_train(data, ft)
    pre = load_pretrained(calc["model_dir"])
    tb_dir = sdir / "tensorboard" / f"{calc['row']}|{calc['col']}|{calc['calc_id']}".replace("/", "_").replace(" ", "_")
    writer = SummaryWriter(str(tb_dir))
    try:
        try:
            res = run_calculation(pre, ft, train, test, val=val, other_task_train=other,
                                  on_epoch=lambda e, m: [writer.add_scalar(f"select/{k}", v, e) for k, v in m.items()])
        except NonFiniteError as e:
            # Recorded as failed, with its reason: the study goes on, the report lists it, a rerun keeps it.
            return _write_trial(calc, sdir, tb_dir, {"status": "failed", "error": str(e)})
        tests = {**data.extra_tests(ft.task), **{name: load_examples(ft.task, sdir / "eval" / f)
                                                 for name, f in calc.get("eval_sets", {}).items()}}
        res.update(extra_test_scores(res.pop("_model"), pre.tok, ft, tests, train + val, titles=data.titles))
        # Baselines learn from the whole budget the model had (its training and validation examples).
        res.update(context_free_baselines(ft.task, train + val, test, titles=data.titles))
        hp = {f"ft/{k}": v for k, v in calc["finetune"].items()}
        hp.update({"model": calc["model_key"], "model_id": calc["model_id"], "row": calc["row"], "col": calc["col"]})
        writer.add_hparams(hp, {f"result/{k}": res[k] for k in ("accuracy", "perplexity", "best_accuracy", "epochs")},
                           run_name=".")
    finally:
        writer.close()
    return _write_trial(calc, sdir, tb_dir, {"status": "ok", **res})


def _write_trial(calc: dict, sdir: Path, tb_dir: Path, res: dict) -> dict:
    import ray

    try:
        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"
    except Exception:  # noqa: BLE001 -- outside a Ray worker the node is simply "local"
        node = "local"
    row = {"calc_id": calc["calc_id"], "model_key": calc["model_key"], "model_id": calc["model_id"],
           "row": calc["row"], "col": calc["col"], "group": calc.get("group", calc["row"]), "node": node,
           **{f"ft_{k}": v for k, v in calc["finetune"].items()}, **res}
    write_json(sdir / "trials" / f"{calc['calc_id']}.json", row)
    if calc.get("storage"):
        st = as_storage(calc["storage"])
        if tb_dir.exists():
            st.push(f"studies/{calc['study_name']}/tensorboard/{tb_dir.name}")
        st.push_file(f"studies/{calc['study_name']}/trials/{calc['calc_id']}.json")  # last: marks it finished
    return row


def localize(calc: dict) -> dict:
    """A calc dict with this node's folders: with a remote root, its model and tasks are pulled here first."""
    if not calc.get("storage"):
        return calc
    st = as_storage(calc["storage"])
    if not st.remote:
        return calc
    from alignlab.platform.pretrain_ray import fetch_model

    st.pull(f"tasks/{calc['task_id']}", marker="stats.json")
    for f in calc.get("eval_sets", {}).values():
        st.pull_file(f"studies/{calc['study_name']}/eval/{f}")
    return {**calc, "model_dir": str(fetch_model(st, calc["model_id"])), "task_dir": str(st.local / "tasks" / calc["task_id"]),
            "study_dir": str(study_dir(st.local, calc["study_name"]))}


def _other_task_train(data, ft: FinetuneConfig):
    """The other task's training sample for the multitask scheme (`mt:pred+trm`), else None."""
    from alignlab.platform.protocol import fel_split

    if ft.scheme != "mt:pred+trm":
        return None
    other_cfg = dataclasses.replace(ft, task="ct" if ft.task == "ad" else "ad")
    return fel_split(data, other_cfg.task, other_cfg)[0]


# ---------------------------------------------------------------- Optuna searches


SEARCH_STATE_SYNC_S = 10
"""How often a search's Tune experiment state is uploaded to the storage root, at most: a killed search
resumes from the last upload."""


def run_search(spec: SearchSpec, base_calc: dict, sdir: Path, *, resources: dict | None = None,
               max_concurrent: int | None = None, progress: bool = True, storage: Storage | None = None) -> dict:
    """Run (or find) one Optuna search; returns its summary (best params and value, every trial).

    Pruning vs. Optuna (RAY_NOTES pitfall 9): when a scheduler stops a trial, Ray's OptunaSearch tells
    Optuna it COMPLETED with its last, early value, which biases TPE toward settings that look good
    early. Here a trial's last report carries `search_complete=1` only when the calculation ran to its
    own end (patience or max_epochs); `_PruneAwareOptunaSearch` tells Optuna PRUNED for every other one
    (keeping the per-epoch values it reported as intermediate values, which TPE ranks below every
    completed trial), and the best setting is chosen among completed trials only -- all of them
    compared at the end of their own runs, never at an early epoch.
    """
    from ray import tune

    out_file = sdir / "searches" / f"{spec.name}.json"
    out_rel = f"studies/{sdir.name}/searches/{spec.name}.json"
    if out_file.exists() or (storage is not None and storage.pull_file(out_rel)):
        return read_json(out_file)
    resources = dict(resources or DEFAULT_TRIAL_RESOURCES)
    check_trial_resources(resources)
    prog = _Progress(spec.num_samples, progress, what=f"search {spec.name}")

    class _ProgressCallback(tune.Callback):
        # Counted from Tune's own trial list, so that a restored search (below) counts its earlier trials.
        def setup(self, **info):
            prog.t0 = time.time()

        def on_trial_complete(self, iteration, trials, trial, **info):
            r = trial.last_result or {}
            how = "completed" if r.get("search_complete") else f"pruned at epoch {r.get('epoch', '?')}"
            prog.tick(f" (last trial {how}, {SEARCH_OBJECTIVE} {r.get(SEARCH_OBJECTIVE, float('nan')):.3f})",
                      done=sum(t.status == "TERMINATED" and t is not trial for t in trials) + 1)

    name = f"search-{spec.name}-{config_hash(base_calc['calc_id'], spec)}"
    where = _tune_storage(storage, sdir)
    trainable = tune.with_resources(tune.with_parameters(search_trial, storage_uri=base_calc.get("storage")), resources)
    exp_path = f"{where['storage_path'].rstrip('/')}/{name}"
    if tune.Tuner.can_restore(exp_path, storage_filesystem=where.get("storage_filesystem")):
        # A driver killed mid-search: Tune's experiment state holds the finished trials and the Optuna
        # sampler's state, so the search goes on from there; trials that were running restart from scratch
        # (a calculation has no checkpoint worth keeping).
        print(f"[search {spec.name}] resuming the interrupted search at {exp_path}", flush=True)
        tuner = tune.Tuner.restore(exp_path, trainable, resume_unfinished=True, restart_errored=True,
                                   storage_filesystem=where.get("storage_filesystem"))
    else:
        points = []
        if spec.start_from_base and all(p.contains(getattr(spec.base, p.name)) for p in spec.space):
            points = [{p.name: getattr(spec.base, p.name) for p in spec.space}]
        from ray.tune.search.optuna import OptunaSearch

        # The space goes to the searcher itself, not to param_space: a restored Tuner gets the searcher back
        # from its pickle but no param_space, and a searcher whose own state snapshot was not yet uploaded
        # would otherwise have no space to sample from.
        searcher = _PruneAwareOptunaSearch(
            space=OptunaSearch.convert_search_space({p.name: p.to_tune() for p in spec.space}),
            metric=SEARCH_OBJECTIVE, mode="max", seed=spec.seed, points_to_evaluate=points or None)
        tuner = tune.Tuner(
            trainable,
            param_space={"calc": _tune_safe(base_calc), "threads": _threads(resources)},
            tune_config=tune.TuneConfig(search_alg=searcher, scheduler=_scheduler(spec), metric=SEARCH_OBJECTIVE,
                                        mode="max", num_samples=spec.num_samples, reuse_actors=True,
                                        max_concurrent_trials=_concurrency(resources, max_concurrent),
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
        trials.append({"params": params, "status": "complete" if r.metrics.get("search_complete") else "pruned",
                       "epoch": r.metrics.get("epoch"), SEARCH_OBJECTIVE: r.metrics.get(SEARCH_OBJECTIVE),
                       "val_perplexity_at_best_ppl": r.metrics.get("val_perplexity_at_best_ppl")})
    complete = [t for t in trials if t["status"] == "complete" and _finite(t[SEARCH_OBJECTIVE])]
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


def _scheduler(spec: SearchSpec):
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, MedianStoppingRule

    if spec.scheduler == "asha":
        # max_t one past the longest run: a trial is never stopped by ASHA for merely reaching its own end,
        # so its final report (search_complete=1) always arrives.
        return ASHAScheduler(time_attr="epoch", max_t=spec.max_epochs_upper() + 1, grace_period=spec.grace_period,
                             reduction_factor=3)
    if spec.scheduler == "median":
        return MedianStoppingRule(time_attr="epoch", grace_period=spec.grace_period, min_samples_required=3)
    return FIFOScheduler()


def _prune_aware_optuna_search():
    from ray.tune.search.optuna import OptunaSearch

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
            if ot_trial is None or step is None or not _finite(result.get(self.metric)):
                return
            if step not in ot_trial.storage.get_trial(ot_trial._trial_id).intermediate_values:
                ot_trial.report(result[self.metric], step)

    return PruneAwareOptunaSearch


def _PruneAwareOptunaSearch(**kwargs):  # noqa: N802 -- a class, built late so this module imports without Ray
    return _prune_aware_optuna_search()(**kwargs)


def search_trial(config: dict, storage_uri: str | None = None) -> None:
    """A Ray Tune function trainable for one search trial: trains on the search's sample of its outer fold's
    training pool (`protocol.search_split`) and reports validation metrics every epoch; no test set is loaded."""
    import torch
    from ray import tune

    from alignlab.platform.finetune import load_pretrained, run_calculation
    from alignlab.platform.protocol import TaskData

    torch.set_num_threads(config.get("threads", 1))
    calc = localize(_trial_calc(config["calc"], storage_uri))
    params = {k: v for k, v in config.items() if k not in ("calc", "threads")}
    ft = dataclasses.replace(finetune_from_dict(calc["finetune"]), **params)
    data = TaskData.load(Path(calc["task_dir"]))
    train, val, other = search_examples(data, ft)
    pre = load_pretrained(calc["model_dir"])
    best = {"ppl": math.inf, "acc": float("nan")}

    def on_epoch(epoch: int, m: dict) -> None:
        if m["perplexity"] < best["ppl"]:
            best.update(ppl=m["perplexity"], acc=m["accuracy"])
        tune.report({"epoch": epoch, "val_accuracy": m["accuracy"], "val_perplexity": m["perplexity"],
                     SEARCH_OBJECTIVE: best["acc"], "val_perplexity_at_best_ppl": best["ppl"], "search_complete": 0})

    res = run_calculation(pre, ft, train, val, val=val, other_task_train=other, on_epoch=on_epoch)
    # The run's own end: the restored best-perplexity model scored on the validation split.
    tune.report({"epoch": res["epochs_run"], "val_accuracy": res["accuracy"], "val_perplexity": res["perplexity"],
                 SEARCH_OBJECTIVE: res["accuracy"], "val_perplexity_at_best_ppl": res["perplexity"],
                 "epochs": res["epochs"], "search_complete": 1})


def search_examples(data, ft: FinetuneConfig) -> tuple[list, list, list | None]:
    """Every example a search trial learns or selects from: (train, val, the other task's training examples
    for the multitask scheme or None). `ft` is `SearchSpec.search_finetune()` with the trial's values."""
    from alignlab.platform.protocol import search_split

    train, val = search_split(data, ft.task, ft)
    return train, val, _other_task_train(data, ft)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


finite = _finite


# ---------------------------------------------------------------- the command line of a study script


def study_main(build, argv: list[str] | None = None) -> Path:
    """The whole command line of a study script: `--preset`, `--storage`, concurrency and per-trial resources."""
    from alignlab.platform.config import PRESETS
    from alignlab.platform.errors import Parser, nonneg_float, positive_float, positive_int, run_guarded

    ap = Parser(description=build.__doc__)
    ap.add_argument("--preset", default="mini", choices=PRESETS, help="smoke | mini | paper (default mini)")
    ap.add_argument("--debug", action="store_true", help="show the traceback of an error (or set ALIGNLAB_DEBUG=1)")
    ap.add_argument("--storage", default=None,
                    help="storage root: a local path, file:// URI, or a remote URI such as s3://bucket/prefix "
                         "(default ./alignlab-storage)")
    ap.add_argument("--max-concurrent", type=positive_int, default=None,
                    help="FEL trials at once (default: as many as the cluster's CPUs/GPUs fit)")
    ap.add_argument("--cpus-per-trial", type=positive_float, default=1.0, help="Ray CPUs per FEL trial (default 1)")
    ap.add_argument("--gpus-per-trial", type=nonneg_float, default=0.0,
                    help="Ray GPUs per FEL trial, e.g. 0.25 to share a GPU by four trials (default 0)")
    ap.add_argument("--trial-resources", default=None, metavar="JSON",
                    help='extra Ray resources per FEL trial, e.g. \'{"fel_node": 1}\' to run trials only on nodes '
                         'of a worker type that offers that custom resource (an autoscaler adds them on demand)')
    ap.add_argument("--parallel-pretrain", type=positive_int, default=1,
                    help="independent pretraining runs side by side (default 1; >1 is for clusters)")
    ap.add_argument("--ct-data", choices=["npm", "templated"], default="npm",
                    help="CT data: the shipped hand-labelled npm summaries (default) or templated bundled titles")
    ap.add_argument("--eval-file", action="append", default=[], metavar="TASK=PATH",
                    help="also score every finetuned calculation of TASK (ct or ad) on this JSONL test file; "
                         "repeatable, e.g. --eval-file ct=my_ct.jsonl --eval-file ad=my_ad.jsonl")
    args = ap.parse_args(argv)
    done: list[Path] = []
    code = run_guarded(lambda: done.append(_run_study_command(build, args, ap)), argv)
    if code:
        raise SystemExit(code)
    return done[0]


def _run_study_command(build, args, ap) -> Path:
    from alignlab.platform.config import check_preset
    from alignlab.platform.storage import resolve_root

    eval_files = []
    for spec in args.eval_file:
        task, sep, path = spec.partition("=")
        if not sep or task not in ("ct", "ad") or not path:
            ap.error(f"--eval-file {spec!r}: expected ct=PATH or ad=PATH")
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
    study = dataclasses.replace(build(check_preset(args.preset)), ct_data=args.ct_data, eval_files=tuple(eval_files))
    root = resolve_root(args.storage)
    report = run_study(study, root, max_concurrent=args.max_concurrent,
                       trial_resources=resources, max_parallel_pretrain=args.parallel_pretrain)
    print(f"Report: {report}")
    if root.remote:
        print(f"Stored at: {root.url(f'studies/{study.name}/report.md')}")
    return report
