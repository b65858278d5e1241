"""Honest validation never cuts a test unit in two: AD's validation split is carved by snippet, so a snippet's
positive and negative pair never fall on both sides of the train/validation split (it would flatter
validation and the epochs selected on it). CT's texts are units of their own: its split is unchanged."""
from __future__ import annotations

from pathlib import Path

from alignlab.tasks.ad_data import ADExample
from alignlab.tasks.ct_data import CTExample
from alignlab.platform.fel.finetune_config import FinetuneConfig
from alignlab.platform.fel.protocol import calculations, fel_split, validation_split
from alignlab.platform.tasks.task_data import TaskData
from alignlab.platform.tasks.task import task as task_named


def _ad(num_snippets: int = 60) -> list[ADExample]:
    out = []
    for i in range(num_snippets):
        snippet = f"snippet {i} mentions the grand union of {i} builders"
        out += [ADExample("gub", snippet, 1), ADExample("xqz", snippet, 0)]
    return out


def _data() -> TaskData:
    ct = [CTExample(("when", "was", f"thing{i}", "made"), ("N", "N", "SE", "N")) for i in range(40)]
    return TaskData(Path("."), {"ad": _ad(), "ct_pool": ct, "ct_test": ct[:5]})


def test_no_snippet_has_a_pair_in_training_and_its_other_pair_in_validation():
    data = _data()
    for budget in (20, 40, 60):
        for fold, seed in calculations():
            cfg = FinetuneConfig(task="ad", budget=budget, selection="honest", val_fraction=0.2, fold=fold, seed=seed)
            train, val, _ = fel_split(data, task_named("ad"), cfg)
            shared = {e.snippet for e in train} & {e.snippet for e in val}
            assert not shared, f"budget {budget}, fold {fold}: snippets on both sides: {sorted(shared)[:3]}"
            assert len(train) + len(val) == budget and len(val) >= round(0.2 * budget)


def test_validation_takes_whole_units_in_the_order_they_first_appear():
    a, b, c = (ADExample("abc", s, lab) for s, lab in (("one", 1), ("two", 0), ("three", 1)))
    a2 = ADExample("xyz", "one", 0)
    # Two examples wanted: snippet "one" comes first with both its pairs (a, a2), so validation is exactly them.
    train, val = validation_split([a, b, a2, c], task_named("ad"), 2)
    assert val == [a, a2] and train == [b, c]
    # Three wanted: "one" (2 pairs) then "two" (1): three, and "three" stays in training.
    train, val = validation_split([a, b, a2, c], task_named("ad"), 3)
    assert val == [a, b, a2] and train == [c]


def test_ct_validation_is_the_first_examples_of_the_sample_as_before():
    data = _data()
    cfg = FinetuneConfig(task="ct", budget=20, selection="honest", val_fraction=0.2, fold=1, seed=0)
    train, val, _ = fel_split(data, task_named("ct"), cfg)
    assert len(val) == 4 and len(train) == 16
    sample = val + train
    assert validation_split(sample, task_named("ct"), 4) == (train, val)
