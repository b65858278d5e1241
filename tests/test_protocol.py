"""The FEL protocol (paper §3.4): ten calculations per data point, disjoint splits, honest validation."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from alignlab.platform.config import FinetuneConfig
from alignlab.platform.protocol import NUM_FOLDS, TaskData, calculations, fel_split
from alignlab.platform.tasks import ADExample, CTExample

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
    return TaskData(Path("."), _ad_examples(), [_ct(i, "pool") for i in range(NUM_POOL)],
                    [_ct(i, "test") for i in range(NUM_TEST)])


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
        train, val, test = fel_split(data, "ad", cfg)
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
    assert len(train_sets) == 10, "the ten calculations must draw ten different training sets"


@pytest.mark.parametrize("selection", ["paper", "honest"])
def test_ct_trains_on_samples_of_the_pool_and_always_tests_on_the_test_set(data, selection):
    train_sets = set()
    for fold, seed in calculations():
        cfg = FinetuneConfig(task="ct", budget=20, selection=selection, fold=fold, seed=seed)
        train, val, test = fel_split(data, "ct", cfg)
        assert test == data.ct_test
        assert _keys(train + val) <= _keys(data.ct_pool)
        assert not _keys(train + val) & _keys(test)
        train_sets.add(frozenset(_keys(train + val)))
    assert len(train_sets) == 10


@pytest.mark.parametrize("task,budget", [("ad", 30), ("ct", 20)])
def test_honest_validation_is_carved_from_the_budget_and_disjoint_from_train_and_test(data, task, budget):
    for fold, seed in calculations():
        cfg = FinetuneConfig(task=task, budget=budget, selection="honest", val_fraction=0.2, fold=fold, seed=seed)
        train, val, test = fel_split(data, task, cfg)
        assert len(train) + len(val) == budget, "validation must come out of the budget, not on top of it"
        assert len(val) == round(0.2 * budget)
        assert not _keys(val) & _keys(train)
        assert not _keys(val) & _keys(test)
        paper_train, paper_val, _ = fel_split(data, task, dataclasses.replace(cfg, selection="paper"))
        assert paper_val == [] and len(paper_train) == budget


@pytest.mark.parametrize("task", ["ad", "ct"])
def test_a_budget_larger_than_the_pool_is_a_clear_value_error(data, task):
    available = NUM_POOL if task == "ct" else 2 * NUM_SNIPPETS * (NUM_FOLDS - 1) // NUM_FOLDS
    cfg = FinetuneConfig(task=task, budget=available + 1)
    with pytest.raises(ValueError, match=rf"budget {available + 1} exceeds the {available} {task.upper()} training"):
        fel_split(data, task, cfg)
    fel_split(data, task, dataclasses.replace(cfg, budget=available))  # exactly the pool is fine
