"""Declaring a study: the models it pretrains, its FEL calculations and its Optuna searches, as plain data.

Frozen dataclasses and pure functions only (no Ray): a study script builds a `Study`, tests expand it into
configs and calculation ids without starting anything, and `study.run.run_study` runs it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from alignlab.platform.config import PRECISIONS, PretrainConfig, config_hash
from alignlab.platform.corpus.corpus_config import CorpusConfig
from alignlab.platform.fel.finetune_config import FinetuneConfig

# The task registry, the FEL protocol and the model store (torch, pyarrow) are imported inside the functions that
# use them: declaring and expanding a study stays plain data.

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
            from alignlab.platform.fel.protocol import search_groups
            from alignlab.platform.tasks.task import task

            outer = set(search_groups(task(self.base.task), self.points())) - {None}
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
        from alignlab.platform.fel.protocol import calculations

        return self.final_points or tuple(calculations())

    def nested(self) -> tuple["SearchSpec", ...]:
        """The searches `run_study` runs for this declaration: one per outer fold (named `<name>-fold<f>`, each
        reporting on the points of its fold), or itself for a task whose test set is the same for every point."""
        from alignlab.platform.fel.protocol import search_groups
        from alignlab.platform.tasks.task import task

        if self.search_fold is not None:
            return (self,)
        return tuple(dataclasses.replace(self, name=self.name if fold is None else f"{self.name}-fold{fold}",
                                         search_fold=pts[0][0] if fold is None else fold, final_points=pts)
                     for fold, pts in search_groups(task(self.base.task), self.points()).items())

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
    """Column of the table that significance is tested against (`significance.significant_gain`), row by row."""
    baseline_cells: tuple[tuple[str, str], ...] = ()
    """(row, col) cells tested against instead, one per group: every row is compared with the baseline cell
    of its group (the paper's Tables 1-2: one underlined cell per task). Empty: `baseline_col`, row by row."""
    searches: tuple[SearchSpec, ...] = ()
    task_langs: tuple[str, ...] = ("en", "es", "fr")
    task_max_docs_per_lang: int | None = None
    task_options: tuple[tuple[str, Any], ...] = ()
    """(name, value) of the tasks' own data-builder options (`Task.build_options`, e.g. which dataset a task
    builds, or how many examples it mines); the ones not given keep each task's default. Set on the command line by the flags each task adds
    (`Task.add_build_arguments`)."""
    eval_files: tuple[tuple[str, str], ...] = ()
    """(task, path) of a user's own test files: every calculation of that task is also scored on each,
    with its own columns (`eval_<file stem>_accuracy`, ...) in results.parquet and the report."""
    plots: tuple[str, ...] = ()
    """Which plots the report draws: "bars" (accuracy per column with error bars), "budget" (accuracy vs n),
    "by_size" (accuracy per column, one line per row, one panel per group)."""
    notes: str = ""
    control_col: str = ""
    """The column of untrained models (`with_untrained`): a positive control every pretrained cell of its row is
    tested against, never a candidate for bold; empty: none."""
    claims: tuple[tuple[str, str], ...] = ()
    """(row, col) cells whose comparison the study exists to make: each is one claim on the primary metric (above
    its baseline cell and above the row's strongest context-free baseline), Holm-corrected over the claims alone and
    the only cells that can be bold (`report.significance`). Empty: every compared cell is claimed."""

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
        for r, c in self.claims:
            if (r, c) not in cells:
                raise ValueError(f"study {self.name}: claim {(r, c)} has no calculations")
            if (r, c) in set(self.baseline_cells) or (not self.baseline_cells and c == self.baseline_col):
                raise ValueError(f"study {self.name}: claim {(r, c)} is a baseline cell; a claim compares a cell "
                                 "with its baseline")
        if self.baseline_cells:
            owners = [g for r, _ in self.baseline_cells for g, rows in groups.items() if r in rows]
            if len(set(owners)) != len(owners):
                raise ValueError(f"study {self.name}: more than one baseline cell in a group: {self.baseline_cells}")


def reference_budget(study: Study, task: str | None = None) -> int | None:
    """The finetuning budget of the study's baseline cells (of `task`'s rows, when given): the budget the study's
    question is asked at (200, the paper's, in every preset but smoke). None: no such calculation."""
    cells = set(study.baseline_cells)
    calcs = [c for c in study.calcs if (task is None or c.finetune.task == task)]
    base = [c for c in calcs if (c.row, c.col) in cells] or [c for c in calcs if c.col == study.baseline_col] or calcs
    return max((c.finetune.budget for c in base), default=None)


def with_budget(study: Study, budget: int, task: str | None = None) -> Study:
    """The study at another finetuning budget: every calculation and search (of `task`, when given) at the study's
    reference budget (`reference_budget`) trains on `budget` examples instead; rows at other budgets (a study that
    varies the budget) keep theirs. Another study (`<name>-budget<N>`, its own report) unless nothing changes."""
    if budget < 1:
        raise ValueError(f"--budget must be >= 1, got {budget}")
    ref = reference_budget(study, task)
    if ref is None or ref == budget:
        return study

    def moved(ft: FinetuneConfig) -> FinetuneConfig:
        if ft.budget == ref and (task is None or ft.task == task):
            return dataclasses.replace(ft, budget=budget)
        return ft

    calcs = tuple(dataclasses.replace(c, finetune=moved(c.finetune)) for c in study.calcs)
    searches = tuple(dataclasses.replace(s, base=moved(s.base)) for s in study.searches)
    name = study.name if task else f"{study.name}-budget{budget}"
    return dataclasses.replace(study, name=name, calcs=calcs, searches=searches)


UNTRAINED_COL = "untrained"


def with_untrained(study: Study) -> Study:
    """The study with an untrained column (`UNTRAINED_COL`, `Study.control_col`): in each row, the calculations of
    the row's cell in the baseline's column (else its first cell), on the untrained counterpart of that cell's model
    (`config.untrained`: the same architecture and seed, no pretraining; written in seconds, no device time), heads
    discarded. The report tests every pretrained cell of the row against it: the positive control that pretraining
    buys something at all. The study's name is unchanged: the column adds calculations and tests and changes no
    other cell."""
    from alignlab.platform.config import untrained

    if study.control_col:
        return study
    by_key = {m.key: m for m in study.models}
    models = list(study.models)
    calcs = list(study.calcs)
    for row in dict.fromkeys(c.row for c in study.calcs):
        mine = [c for c in study.calcs if c.row == row]
        cols = list(dict.fromkeys(c.col for c in mine))
        base_col = next((bc for br, bc in study.baseline_cells if bc in cols), None)
        col = base_col or (study.baseline_col if study.baseline_col in cols else cols[0])
        for c in (c for c in mine if c.col == col):
            cfg = untrained(by_key[c.model].pretrain)
            key = next((m.key for m in models if m.pretrain == cfg), None)
            if key is None:
                key = UNTRAINED_COL if all(m.key != UNTRAINED_COL for m in models) else \
                    f"{UNTRAINED_COL}-{cfg.model.label}-seed{cfg.seed}"
                models.append(ModelSpec(key=key, pretrain=cfg))
            calcs.append(dataclasses.replace(c, model=key, col=UNTRAINED_COL,
                                             finetune=dataclasses.replace(c.finetune, keep_head=False)))
    return dataclasses.replace(study, models=tuple(models), calcs=tuple(calcs), control_col=UNTRAINED_COL)


def with_pretrain_seeds(study: Study, runs: int) -> Study:
    """The study with every model pretrained `runs` times: seeds `seed`, `seed + 1`, ... of its own PretrainConfig.

    The first run is the study's own model (key and seed unchanged, so an existing model is reused); the others
    are keyed `<key>@seed<s>`. Every calculation is repeated on each run with its row and column unchanged, so a
    cell pools its runs and the report tests across them (`report.RUN_KEY`): the pretraining seed becomes a
    factor of the study instead of a constant. It is another study (`<name>-<runs>pretrain_seeds`, its own
    report). Searches choose a setting per model, so a study with searches is refused rather than searched on
    one run and reported on all."""
    if runs < 1:
        raise ValueError(f"--pretrain-seeds must be >= 1, got {runs}")
    if runs == 1:
        return study
    if study.searches:
        raise ValueError(f"study {study.name}: --pretrain-seeds with Optuna searches is not supported (a search "
                         "chooses a setting for one pretrained model); run the searches' study with one run")

    def key(m: ModelSpec, i: int) -> str:
        return m.key if i == 0 else f"{m.key}@seed{m.pretrain.seed + i}"

    models = tuple(dataclasses.replace(m, key=key(m, i), pretrain=dataclasses.replace(m.pretrain, seed=m.pretrain.seed + i))
                   for m in study.models for i in range(runs))
    by_key = {m.key: m for m in study.models}
    calcs = tuple(dataclasses.replace(c, model=key(by_key[c.model], i)) for c in study.calcs for i in range(runs))
    return dataclasses.replace(study, name=f"{study.name}-{runs}pretrain_seeds", models=models, calcs=calcs,
                               title=f"{study.title}, {runs} pretraining runs per model")


def study_folds(study: Study) -> int:
    """The finetuning samples (folds) of the study's cells: the most any cell has (the protocol's five at mini and
    paper, one at smoke)."""
    per_cell: dict[tuple, set] = {}
    for c in study.calcs:
        per_cell.setdefault((c.model, c.row, c.col), set()).add(c.finetune.fold)
    return max((len(f) for f in per_cell.values()), default=0)


def with_folds(study: Study, folds: int) -> Study:
    """The study with `folds` finetuning samples per cell instead of the preset's: folds 0..folds-1, each at the seeds
    its cell ran. A fold's examples depend on (task, budget, fold) only (`protocol.fel_split`), so folds 0-4 are the
    protocol's own and every fold past them is another sample of the budget from the same pool (CT: another draw
    from the pool; AD: its cross-validation repeated, fold f testing on test fold f mod 5 with a sample of its own
    from the four others). Whether the pools hold that many distinct samples, and AD's whole repetitions, are checked
    against the task data before any work (`run.check_folds`). Searches report their setting on the same points. It
    is another study (`<name>-<folds>folds`, its own report) unless nothing changes; the calculation ids of folds
    the study ran already stay what they were (the fold is a FinetuneConfig field, docs/ids.md)."""
    if folds < 2:
        raise ValueError(f"--folds must be >= 2 (a fold's spread needs two), got {folds}")
    cells: dict[tuple, list[CalcSpec]] = {}
    for c in study.calcs:
        cells.setdefault((c.model, c.row, c.col, dataclasses.replace(c.finetune, fold=0, seed=0)), []).append(c)
    if all(sorted({c.finetune.fold for c in mine}) == list(range(folds)) for mine in cells.values()) and \
            all(not s.final_points or sorted({f for f, _ in s.final_points}) == list(range(folds))
                for s in study.searches):
        return study
    calcs = []
    for mine in cells.values():
        first = mine[0]
        for fold in range(folds):
            for seed in dict.fromkeys(c.finetune.seed for c in mine):
                calcs.append(dataclasses.replace(first, finetune=dataclasses.replace(first.finetune, fold=fold,
                                                                                     seed=seed)))
    searches = tuple(dataclasses.replace(s, final_points=tuple(
        (f, seed) for f in range(folds) for seed in dict.fromkeys(seed for _, seed in s.points())))
                     for s in study.searches)
    return dataclasses.replace(study, name=f"{study.name}-{folds}folds", calcs=tuple(calcs), searches=searches,
                               title=f"{study.title}, {folds} finetuning samples per cell")


def with_precision(study: Study, precision: str) -> Study:
    """The study with every model pretrained at `precision` ("fp32" or "bf16") instead of its preset's ("auto").

    `auto` is resolved on the machine that starts a run (bf16 on a GPU or where the CPU trains faster in it,
    fp32 elsewhere), so one command trains other models, with other figures, on other machines. Naming the
    precision trains the same model ids everywhere, e.g. to compare two machines or to reproduce a result made
    on the other kind of CPU. A model id names its resolved precision, so `fp32` here reuses the models that
    `auto` trained on an fp32-only CPU. It is another study (`<name>-<precision>`, its own report), so the
    report of the default command is never replaced by another precision's. An untrained model (zero steps) keeps
    its fp32: nothing is trained, and every precision's study shares its one id."""
    if precision == "auto":
        return study
    if precision not in PRECISIONS:
        raise ValueError(f"--precision must be {', '.join(PRECISIONS)}, got {precision!r}")
    models = tuple(m if m.pretrain.max_steps == 0 else
                   dataclasses.replace(m, pretrain=dataclasses.replace(m.pretrain, precision=precision))
                   for m in study.models)
    return dataclasses.replace(study, name=f"{study.name}-{precision}", models=models,
                               title=f"{study.title}, {precision} pretraining")


FINETUNE_CODE_VERSION = 5
"""The version of the code that turns a pretrained model and a FinetuneConfig into a trial's scores (the protocol's
splits, the finetuning schemes, what a trial records: per-unit scores of the model and, since 2, of every
context-free baseline, for the report's paired tests; 3: AD's content-word span matcher baseline; 4: each test
unit's part, `Task.parts`, AD's pair kinds; 5: AD's span matchers follow PAD's word rule; since 2 a calculation's
randomness is keyed by its seed and fold, `finetune.calculation_seed`). Bump it in any change that alters them: it is in every calculation id, so a
study never counts an older trial as done."""


def calc_id(model_id: str, ft: FinetuneConfig, salt: str = "", data: str = "") -> str:
    """A calculation's id: its model, its finetuning config, (`data`) the task data and extra test files it is
    scored on, so that other data never counts as this calculation done, and FINETUNE_CODE_VERSION."""
    return f"{ft.task}-{config_hash(model_id, ft, *([salt] if salt else []), *([data] if data else []), {'code': FINETUNE_CODE_VERSION})}"


def planned_calc_ids(study: Study) -> list[str]:
    """The grid's calculation ids as `run_study` will name them, up to the corpus id (no Ray, nothing built)."""
    from alignlab.platform.pretrain.models import model_id

    cid = f"planned-{config_hash(study.corpus)}"
    mids = {m.key: model_id(cid, m.pretrain) for m in study.models}
    return [calc_id(mids[c.model], c.finetune) for c in study.calcs]

