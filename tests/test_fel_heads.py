"""The held-out set of benchmarks/probes/fel_heads.py (the trained head against the logistic head at mini): every
calculation is scored on its pool remainder, which shares no test unit with the calculation's budget nor with the
task's test set, so choosing a head on it touches no reported test score."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "probes"))  # as when the script is run
import fel_heads  # noqa: E402

from alignlab.platform.fel.protocol import fel_split
from alignlab.platform.presets import Preset
from alignlab.platform.tasks.task import task as task_named
from alignlab.platform.tasks.task_data import NUM_FOLDS, SHIPPED_TASK_DATA, TaskData


@pytest.fixture(scope="module")
def data() -> TaskData:
    # The shipped npm files: CT's pool and test set, and the out-of-domain AD pairs standing in for AD's folds.
    files = {"ct_pool": "ct_pool.jsonl", "ct_test": "ct_test.jsonl", "ad": "ad_ood.jsonl"}
    load = {"ct_pool": task_named("ct"), "ct_test": task_named("ct"), "ad": task_named("ad")}
    return TaskData(SHIPPED_TASK_DATA, {k: load[k].load_examples(SHIPPED_TASK_DATA / f) for k, f in files.items()})


@pytest.mark.parametrize("name", ["ct", "ad"])
def test_the_pool_remainder_shares_no_test_unit_with_the_budget_or_the_test_set_on_every_fold(data, name):
    task = task_named(name)
    for fold in range(NUM_FOLDS):
        cfg = dataclasses.replace(Preset.named("mini").finetune, task=name, fold=fold)
        train, val, test = fel_split(data, task, cfg)
        held = fel_heads.pool_remainder(data, task, train, val, fold)
        units = {task.test_unit(ex) for ex in held}
        assert held and len(units) >= 50, (fold, len(units))
        assert not units & {task.test_unit(ex) for ex in [*train, *val]}
        assert not units & {task.test_unit(ex) for ex in test}
        pool, _ = task.pool_and_test(data, fold)
        # Whole units only: every pool example of a held-out unit is held out.
        assert len(held) == sum(task.test_unit(ex) in units for ex in pool)
