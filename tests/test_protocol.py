"""The FEL protocol (paper §3.4): ten calculations per data point, disjoint splits, honest validation."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from alignlab.tasks.ad_data import ADExample
from alignlab.tasks.ct_data import CTExample
from alignlab.platform.fel.finetune_config import FinetuneConfig
from alignlab.platform.fel.protocol import calculations, fel_split
from alignlab.platform.tasks.task_data import NUM_FOLDS, TaskData
from alignlab.platform.tasks.task import task as task_named

NUM_SNIPPETS = 40
NUM_POOL, NUM_TEST = 30, 12


def _ad_examples() -> list[ADExample]:
    """Two pairs per snippet (a positive and a negative), as in the paper's AD set."""
    out = []
    for i in range(NUM_SNIPPETS):
        snippet = f"snippet number {i} mentions the grand union of {i} builders today"
        out += [ADExample(f"gub{chr(97 + i % 26)}", snippet, 1), ADExample(f"xq{chr(97 + i % 26)}", snippet, 0)]
    return out


def _ct(i: int, prefix: str) -> CTExample:
    return CTExample(("when", "was", f"{prefix}{i}", "made"), ("N", "N", "SE", "N"))


@pytest.fixture()
def data() -> TaskData:
    return TaskData(Path("."), {"ad": _ad_examples(), "ct_pool": [_ct(i, "pool") for i in range(NUM_POOL)],
                                "ct_test": [_ct(i, "test") for i in range(NUM_TEST)]})


def _key(ex) -> tuple:
    return (ex.acronym, ex.snippet) if isinstance(ex, ADExample) else ex.tokens


def _keys(examples) -> set:
    return {_key(ex) for ex in examples}


def test_a_data_point_is_exactly_ten_distinct_calculations_five_folds_by_two_seeds():
    calcs = calculations()
    assert len(calcs) == 10 == len(set(calcs))
    assert {f for f, _ in calcs} == set(range(NUM_FOLDS)) and {s for _, s in calcs} == {0, 1}


@pytest.mark.parametrize("selection", ["paper", "honest"])
def test_ad_folds_never_split_a_snippet_between_train_and_test(data, selection):
    seen_test = []
    train_sets = set()
    for fold, seed in calculations():
        cfg = FinetuneConfig(task="ad", budget=30, selection=selection, fold=fold, seed=seed)
        train, val, test = fel_split(data, task_named("ad"), cfg)
        fit = train + val
        assert not _keys(fit) & _keys(test)
        assert not {e.snippet for e in fit} & {e.snippet for e in test}, "a snippet straddles train and test"
        # Both pairs of every test snippet are in the test fold.
        test_snippets = {e.snippet for e in test}
        assert sum(e.snippet in test_snippets for e in data.ad) == len(test)
        if seed == 0:
            seen_test.extend(test)
        train_sets.add(frozenset(_keys(fit)))
    # The five test folds partition the data set: every pair is tested exactly once per seed.
    assert len(seen_test) == len(data.ad) and _keys(seen_test) == _keys(data.ad)
    assert len(train_sets) == NUM_FOLDS, "five folds, each trained twice: five different training sets"


@pytest.mark.parametrize("selection", ["paper", "honest"])
def test_ct_trains_on_samples_of_the_pool_and_always_tests_on_the_test_set(data, selection):
    train_sets = set()
    for fold, seed in calculations():
        cfg = FinetuneConfig(task="ct", budget=20, selection=selection, fold=fold, seed=seed)
        train, val, test = fel_split(data, task_named("ct"), cfg)
        assert test == data.ct_test
        assert _keys(train + val) <= _keys(data.ct_pool)
        assert not _keys(train + val) & _keys(test)
        train_sets.add(frozenset(_keys(train + val)))
    assert len(train_sets) == NUM_FOLDS, "five samples of the pool, each trained with two seeds"


@pytest.mark.parametrize("task,budget", [("ad", 30), ("ct", 20)])
def test_honest_validation_is_carved_from_the_budget_and_disjoint_from_train_and_test(data, task, budget):
    for fold, seed in calculations():
        cfg = FinetuneConfig(task=task, budget=budget, selection="honest", val_fraction=0.2, fold=fold, seed=seed)
        train, val, test = fel_split(data, task_named(task), cfg)
        assert len(train) + len(val) == budget, "validation must come out of the budget, not on top of it"
        # Whole test units go to validation (AD: both pairs of a snippet), so it may hold one unit more.
        assert round(0.2 * budget) <= len(val) <= round(0.2 * budget) + 1
        assert not _keys(val) & _keys(train)
        assert not _keys(val) & _keys(test)
        paper_train, paper_val, _ = fel_split(data, task_named(task), dataclasses.replace(cfg, selection="paper"))
        assert paper_val == [] and len(paper_train) == budget


@pytest.mark.parametrize("task", ["ad", "ct"])
def test_a_budget_larger_than_the_pool_is_a_clear_value_error(data, task):
    available = NUM_POOL if task == "ct" else 2 * NUM_SNIPPETS * (NUM_FOLDS - 1) // NUM_FOLDS
    cfg = FinetuneConfig(task=task, budget=available + 1)
    with pytest.raises(ValueError, match=rf"budget {available + 1} exceeds the {available} {task.upper()} training"):
        fel_split(data, task_named(task), cfg)
    fel_split(data, task_named(task), dataclasses.replace(cfg, budget=available))  # exactly the pool is fine


@pytest.mark.parametrize("selection", ["paper", "honest"])
@pytest.mark.parametrize("task,budget", [("ad", 30), ("ct", 20)])
def test_the_seed_never_changes_a_calculations_examples_only_the_fold_does(data, task, budget, selection):
    """Paper §3.4: five samples (CT) or folds (AD), each trained with two seeds. The seed changes the
    initialisation and batch order (tests/test_finetune.py), never which examples train, validate or test."""
    splits = {}
    for fold, seed in calculations():
        cfg = FinetuneConfig(task=task, budget=budget, selection=selection, fold=fold, seed=seed)
        splits.setdefault(fold, []).append(tuple(map(_keys_in_order, fel_split(data, task_named(task), cfg))))
    for fold, (seed0, seed1) in splits.items():
        assert seed0 == seed1, f"fold {fold}: seeds 0 and 1 must train, validate and test on the same examples"
    assert len({s[0][0] for s in splits.values()}) == NUM_FOLDS, "each fold draws its own training sample"
    # Any seed, not just the protocol's two.
    cfg = FinetuneConfig(task=task, budget=budget, selection=selection, fold=3, seed=7)
    assert tuple(map(_keys_in_order, fel_split(data, task_named(task), cfg))) == splits[3][0]


def _keys_in_order(examples) -> tuple:
    return tuple(_key(ex) for ex in examples)
