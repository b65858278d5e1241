"""The FEL protocol (paper §3.4): the ten calculations per data point over the task data
(`alignlab.platform.tasks.task_data`), their splits and the context-free baselines.

- AD: 5-fold cross-validation over snippets (a snippet's positive and negative share a fold) x 2
  seeds; the training set of budget n is sampled from the four training folds, the fifth is the test set.
- CT: 5 random samples of n from the 275-query pool ("fold" numbers the sample), tested on the
  200-query set, x 2 seeds.
The examples of a calculation depend on (task, budget, fold) only: the two seeds of a fold train on
the same sample, validate on the same split and test on the same set; the seed changes the
initialisation (fresh heads, dropout) and the batch order only (`finetune.finetune_calculation`).
In "honest" selection a validation split (`val_fraction` of n) is carved from the sampled budget,
so the model trains on the rest and the test set only scores the selected epochs.
Searches (`search_split`, `search_groups`) are nested: a search whose setting is reported on AD's
fold f samples only from fold f's four training folds; CT's searches sample from the pool.
Each task object (`alignlab.platform.tasks.task`) owns its data layout, folds, searches and baselines; this
module runs the protocol over whichever task a config names.
"""
from __future__ import annotations

import dataclasses
import random
from collections import Counter

from alignlab.platform.fel.finetune_config import FinetuneConfig
from alignlab.platform.fel.task_scoring import UNIT_PARTS, UNIT_SCORES, evaluate_examples, parts_per_test_unit
from alignlab.platform.tasks.task import Task, registered_tasks, task as task_named
from alignlab.platform.tasks.task_data import NUM_FOLDS, TaskData

NUM_SEEDS = 2


def calculations() -> list[tuple[int, int]]:
    """(fold, seed) of the ten calculations of one data point."""
    return [(fold, seed) for fold in range(NUM_FOLDS) for seed in range(NUM_SEEDS)]


def pool_size(data: TaskData, task: Task, fold: int) -> int:
    """Examples a calculation of this fold can sample its budget from."""
    return len(task.pool_and_test(data, fold)[0])


def _sample(pool: list, task: Task, cfg: FinetuneConfig, key: str) -> tuple[list, list]:
    """(train, val) of a budget drawn from `pool` by `key`; val is empty in "paper" selection."""
    if cfg.budget > len(pool):
        raise ValueError(f"budget {cfg.budget} exceeds the {len(pool)} {task.name.upper()} training examples "
                         "available")
    check_honest_budget(cfg)
    sample = random.Random(key).sample(pool, cfg.budget)
    if cfg.selection == "paper":
        return sample, []
    return validation_split(sample, task, validation_size(cfg.budget, cfg.val_fraction))


def validation_split(sample: list, task: Task, n_val: int) -> tuple[list, list]:
    """(train, val) of a sampled budget: whole test units (`Task.test_unit`) go to validation in the order they
    first appear until it holds at least `n_val` examples. A unit cut in two (AD: a snippet's positive in
    training, its negative in validation) would flatter validation and the epochs selected on it. Where every
    example is its own unit (CT) this is the first `n_val` examples, as before."""
    units = [task.test_unit(ex) for ex in sample]
    size = Counter(units)
    val_units, n = set(), 0
    for u in dict.fromkeys(units):
        if n >= n_val:
            break
        val_units.add(u)
        n += size[u]
    return ([ex for ex, u in zip(sample, units) if u not in val_units],
            [ex for ex, u in zip(sample, units) if u in val_units])


def validation_size(budget: int, val_fraction: float) -> int:
    """Examples of an honest calculation's budget held out for selection: at least 2, so a perplexity exists."""
    return max(2, round(val_fraction * budget))


def check_honest_budget(cfg: FinetuneConfig) -> None:
    """Refuse an honest calculation whose validation split would take its whole budget (no training example
    left), naming the smallest budget that leaves one."""
    if cfg.selection == "paper" or cfg.budget > validation_size(cfg.budget, cfg.val_fraction):
        return
    smallest = next(b for b in range(cfg.budget + 1, 10 * cfg.budget + 100)
                    if b > validation_size(b, cfg.val_fraction))
    raise ValueError(f"{cfg.task.upper()} budget {cfg.budget} in {cfg.selection} selection: the validation split "
                     f"({validation_size(cfg.budget, cfg.val_fraction)} examples, val_fraction {cfg.val_fraction}, "
                     f"at least 2) takes the whole budget and leaves no training example; use --budget "
                     f"{smallest} or more, or --selection paper")


def fel_split(data: TaskData, task: Task, cfg: FinetuneConfig) -> tuple[list, list, list]:
    """(train, val, test) of one calculation; val is empty in "paper" selection.

    Keyed by (task, budget, fold), never by the seed: the paper's "two random seeds" train the same
    sample twice with a different initialisation and batch order (§3.4: five samples x two seeds)."""
    pool, test = task.pool_and_test(data, cfg.fold)
    train, val = _sample(pool, task, cfg, f"{task.name}-{cfg.budget}-{cfg.fold}")
    return train, val, test


def multitask_train(data: TaskData, cfg: FinetuneConfig, task: Task) -> list:
    """The training sample of `task`'s multitask partner for the same calculation (scheme mt:pred+trm)."""
    other = dataclasses.replace(cfg, task=task.multitask_partner)
    return fel_split(data, task_named(other.task), other)[0]


def search_groups(task: Task, points) -> dict[int | None, tuple[tuple[int, int], ...]]:
    """The searches a searched cell needs (nested selection): outer fold -> the (fold, seed) points that
    report that search's best setting.

    AD's test fold changes with the fold, and every snippet is in some fold's test set, so one search
    cannot serve all folds: fold f gets its own search, inside f's four training folds (nested
    cross-validation). CT's test set is the same separate 200-query set for every calculation, so one
    search on the pool serves every sample (key None)."""
    points = tuple((int(f), int(s)) for f, s in points)
    return task.search_groups(points)


def search_split(data: TaskData, task: Task, cfg: FinetuneConfig) -> tuple[list, list]:
    """(train, val) of a search trial whose setting is reported on the calculations of outer fold `cfg.fold`.

    Drawn from that fold's training pool only (AD: the four other folds; CT: the pool), by a key of its
    own, so the search never sees the test set of a calculation that reports its setting. Searches
    select in honest mode: val is carved from the budget as in a calculation."""
    pool, _ = task.pool_and_test(data, cfg.fold)
    key = f"search-{task.name}-{cfg.budget}-{task.search_pool_key(cfg.fold)}"
    return _sample(pool, task, dataclasses.replace(cfg, selection="honest"), key)


def baseline_names() -> tuple[str, ...]:
    """Every task's context-free baselines, in task order (the report's columns)."""
    return tuple(dict.fromkeys(b for t in registered_tasks() for b in t.baselines))


def context_free_baselines(task: Task, train: list, test: list, *, data: TaskData | None = None,
                           **context) -> dict:
    """Every context-free baseline of `task`, trained on `train` (the calculation's budget) and scored on `test`,
    as {"baseline_<name>": accuracy}, plus "baseline_best" and "baseline_best_name" (the strongest; a model's effect
    only counts above it), and each baseline's per-test-unit scores ("unit_count_baseline_<name>",
    "unit_correct_baseline_<name>", in the order of `test`'s units: the model's own `unit_keys`), so the report
    compares the model with them unit by unit. A task that scores its baselines only as accuracies
    (`Task.baseline_scores` alone) gets no per-unit columns."""
    # What a task's baselines read from its task folder besides the examples (`Task.baseline_context`), unless given.
    context = {**(task.baseline_context(data) if data is not None else {}), **context}
    try:
        hits = task.baseline_hits(train, test, **context)
    except NotImplementedError:
        hits = None
    scores = ({k: sum(sum(h) for h in v) / sum(len(h) for h in v) for k, v in hits.items()} if hits is not None
              else task.baseline_scores(train, test, **context))
    out = {f"baseline_{k}": v for k, v in scores.items()}
    best = max(out, key=lambda k: out[k])
    out = {**out, "baseline_best": out[best], "baseline_best_name": best[len("baseline_"):]}
    for k, v in (hits or {}).items():
        per_unit = units_of_hits(task, test, v)
        out[f"unit_count_baseline_{k}"], out[f"unit_correct_baseline_{k}"] = per_unit["unit_count"], per_unit["unit_correct"]
    return out


def units_of_hits(task: Task, test: list, hits: list[list[bool]]) -> dict[str, list]:
    """Per-example hit lists summed per test unit (`Task.test_unit`), in the order units first appear in `test`:
    the same keys, order and meaning as a model's `task_scoring.scores_per_test_unit`."""
    import torch

    from alignlab.platform.fel.task_scoring import scores_per_test_unit

    if len(hits) != len(test):
        raise ValueError(f"{task.name}: a baseline returned hits for {len(hits)} examples, the test set has {len(test)}")
    rows = torch.tensor([i for i, h in enumerate(hits) for _ in h], dtype=torch.long)
    flat = torch.tensor([bool(x) for h in hits for x in h], dtype=torch.bool)
    return scores_per_test_unit(task, test, flat, rows)


UNIT_COUNTS = ("accuracy", "perplexity", "count", "num_examples")


def test_unit_metrics(model, tok, cfg: FinetuneConfig, test: list, task: Task) -> dict:
    """The selected model's task-specific metrics on its test set (`Task.unit_metrics`: a tagging task's span F1),
    scored only for a task that has some."""
    if type(task).unit_metrics is Task.unit_metrics:
        return {}
    m = evaluate_examples(model, task, test, tok, options=cfg.task_options)
    return {k: v for k, v in m.items() if k not in UNIT_COUNTS}


def extra_test_scores(model, tok, cfg: FinetuneConfig, tests: dict[str, list], budget: list, *,
                      task: Task, data: TaskData | None = None) -> dict:
    """The selected model's accuracy on each extra test set (out-of-domain AD, a user's --eval-file), with
    the context-free baselines trained on the same budget and scored on that set:
    {"eval_<name>_accuracy", "eval_<name>_perplexity", "eval_<name>_baseline_<b>", ...}, and the per-test-unit
    scores the report's decision counts ("eval_<name>_unit_correct", ...: `task_scoring.scores_per_test_unit`) and,
    for a task with parts, each unit's part ("eval_<name>_unit_parts": `task_scoring.parts_per_test_unit`)."""
    out: dict = {}
    for name, examples in tests.items():
        m = evaluate_examples(model, task, examples, tok, options=cfg.task_options, per_unit=True)
        out[f"eval_{name}_accuracy"], out[f"eval_{name}_perplexity"] = m["accuracy"], m["perplexity"]
        out.update({f"eval_{name}_{k}": m[k] for k in UNIT_SCORES})
        out.update({f"eval_{name}_{k}": v for k, v in m.items() if k not in UNIT_COUNTS + UNIT_SCORES})
        out.update({f"eval_{name}_{UNIT_PARTS}": v for v in parts_per_test_unit(task, examples).values()})
        out[f"eval_{name}_num_test"] = len(examples)
        for k, v in context_free_baselines(task, budget, examples, data=data).items():
            out[f"eval_{name}_{k}"] = v
    return out
