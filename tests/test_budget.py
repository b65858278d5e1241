"""A user's budget: every study script takes `--budget N` (data_budget also `--budgets`), a declared task takes
`budget=N`, a budget a pool cannot hold is refused naming both ways out, and data_budget keeps the rows a declared
task's pool holds."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from alignlab.platform.study.spec import reference_budget, with_budget
from alignlab.platform.study.tasks import parse_task_spec, with_tasks
from alignlab.platform.tasks.task_kinds import declare_task, undeclare
from in_process import run_in_process

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "software_ner"


def _study(name: str, preset: str = "smoke", **kw):
    from importlib import import_module

    return import_module(f"alignlab.studies.{name}").build(preset, **kw)


@pytest.fixture
def small_pool(tmp_path):
    """The software-name tagging example with a pool of 35 texts, declared as task `few`."""
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join((EXAMPLE / "pool.jsonl").read_text().splitlines(keepends=True)[:35]))
    declare_task("few", "tagging", pool, EXAMPLE / "test.jsonl", aligned_objective="whp")
    yield pool
    undeclare("few")


def test_budget_moves_every_calculation_at_the_reference_budget_and_names_another_study():
    study = _study("objective_ablation")
    assert reference_budget(study) == 40
    moved = with_budget(study, 30)
    assert {c.finetune.budget for c in moved.calcs} == {30} and moved.name == f"{study.name}-budget30"
    assert with_budget(study, 40) is study, "the preset's own budget: the same study"
    varied = _study("data_budget", budgets=(10, 20, 30), budget=20)
    assert sorted({c.finetune.budget for c in varied.calcs}) == [10, 20, 30]
    assert {r for r, _ in varied.baseline_cells} == {"CT 20", "AD 20"}
    assert varied.name != _study("data_budget").name


def test_every_study_script_takes_budget_and_data_budget_takes_budgets(capfd, monkeypatch, tmp_path):
    for script in ("objective_ablation", "model_size", "data_budget", "backprop", "learning_rate", "finetune_search"):
        code, out = run_in_process([sys.executable, str(REPO / "studies" / f"{script}.py"), "--help"], tmp_path, capfd,
                                   monkeypatch)
        assert code == 0 and "--budget N" in out and "--with-untrained" in out, script
        assert ("--budgets" in out) == (script == "data_budget"), script


def test_a_declared_budget_moves_only_that_tasks_rows(small_pool):
    assert parse_task_spec(f"name=few,kind=tagging,pool={small_pool},test=t.jsonl,budget=30")["budget"] == 30
    with pytest.raises(ValueError, match="budget must be a whole number"):
        parse_task_spec("name=few,kind=tagging,pool=p,test=t,budget=lots")
    study = with_tasks(_study("objective_ablation"), ["few"], None, {"few": 30})
    by_task = {t: {c.finetune.budget for c in study.calcs if c.finetune.task == t} for t in ("ct", "ad", "few")}
    assert by_task == {"ct": {40}, "ad": {40}, "few": {30}}
    # The declared task claims what the task its rows copy claims; --only-tasks keeps the claims of its rows only.
    assert set(study.claims) == {("CT", "all*"), ("AD", "all*"), ("FEW", "all*")}
    assert with_tasks(_study("objective_ablation"), ["few"], ["few"]).claims == (("FEW", "all*"),)


def test_data_budget_keeps_the_rows_a_declared_pool_holds_and_moves_its_baseline_to_the_largest(small_pool):
    study = with_tasks(_study("data_budget", budgets=(20, 30, 40)), ["few"], ["few"])
    rows = sorted({(c.row, c.finetune.budget) for c in study.calcs})
    assert rows == [("FEW 20", 20), ("FEW 30", 30)], "40 > the pool's 35: that row is dropped"
    assert [r for r, _ in study.baseline_cells] == ["FEW 30"]


@pytest.mark.ray
def test_a_budget_the_pool_cannot_hold_is_refused_before_any_work_naming_both_ways_out(small_pool, tmp_path):
    spec = f"name=few,kind=tagging,pool={small_pool},test={EXAMPLE / 'test.jsonl'},aligned=whp"
    cmd = [sys.executable, str(REPO / "studies" / "objective_ablation.py"), "--preset", "smoke", "--storage",
           str(tmp_path / "storage"), "--task", spec, "--only-tasks", "few"]
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode != 0
    err = run.stderr
    assert "FEW budget 40 > 35 available" in err
    assert "--budget 35 or less" in err and "--task name=few,...,budget=35" in err
    assert not list((tmp_path / "storage").glob("corpus/*")), "refused before the corpus was built"
