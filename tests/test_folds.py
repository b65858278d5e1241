"""More finetuning samples per cell (`--folds N`): the flag reaches every cell's calculations, the plan and the
power plan; a pool that cannot give N samples of the budget, or N that would use AD's test folds unequally, is
refused in one line; the overlap warning names the samples; and the decision reads AD's repeated cross-validation
as nested in its test folds, at the false-positive rate it is meant to have."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from alignlab.platform.study import run as study_run
from alignlab.platform.study.spec import planned_calc_ids, study_folds, with_folds
from alignlab.platform.study.tasks import with_tasks
from alignlab.platform.tasks.task import task as task_named
from alignlab.platform.tasks.task_data import SHIPPED_TASK_DATA, TaskData
from alignlab.platform.tasks.task_kinds import declare_task, undeclare

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "software_ner"


def _study(name: str = "objective_ablation", preset: str = "smoke"):
    from importlib import import_module

    return import_module(f"alignlab.studies.{name}").build(preset)


@pytest.fixture
def small_pool(tmp_path):
    """The software-name tagging example with a pool of 35 texts, declared as task `few`, and its TaskData."""
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join((EXAMPLE / "pool.jsonl").read_text().splitlines(keepends=True)[:35]))
    t = declare_task("few", "tagging", pool, EXAMPLE / "test.jsonl", aligned_objective="whp")
    yield TaskData(tmp_path, {"few_pool": t.load_examples(pool), "few_test": t.load_examples(EXAMPLE / "test.jsonl")})
    undeclare("few")


def test_folds_give_every_cell_n_samples_at_its_seeds_and_name_another_study():
    study = _study()
    assert study_folds(study) == 1, "smoke runs the protocol's first fold"
    four = with_folds(study, 4)
    assert four.name == f"{study.name}-4folds" and study_folds(four) == 4
    cells = {(c.model, c.row, c.col) for c in study.calcs}
    assert {(c.model, c.row, c.col) for c in four.calcs} == cells
    for cell in cells:
        points = sorted((c.finetune.fold, c.finetune.seed) for c in four.calcs if (c.model, c.row, c.col) == cell)
        assert points == [(f, s) for f in range(4) for s in (0, 1)], cell
    # The folds the study ran keep their calculation ids: only the new folds are new calculations.
    assert set(planned_calc_ids(study)) < set(planned_calc_ids(four))
    assert len(set(planned_calc_ids(four))) == 4 * len(set(planned_calc_ids(study)))
    mini = _study(preset="mini")
    assert with_folds(mini, 5) is mini, "the protocol's own five: the same study"
    with pytest.raises(ValueError, match="--folds must be >= 2"):
        with_folds(study, 1)
    searched = with_folds(_study("finetune_search", "mini"), 10)
    assert {f for s in searched.searches for n in s.nested() for f, _ in n.points()} == set(range(10))


def test_the_flag_reaches_the_study_the_plan_and_the_power_plan(tmp_path, monkeypatch, capsys):
    from alignlab.platform.cli import main
    from alignlab.studies import objective_ablation

    ran = []
    monkeypatch.setattr(study_run, "run_study", lambda s, root, **kw: ran.append(s) or tmp_path / "r.md")
    study_run.study_main(objective_ablation.build, ["--folds", "3", "--storage", str(tmp_path)],
                         extra_objective_sets=True)
    assert ran[0].name == "objective_ablation-mini-3folds" and study_folds(ran[0]) == 3
    assert {c.finetune.fold for c in ran[0].calcs} == {0, 1, 2}

    def plan(*extra):
        main(["plan", "objective_ablation", "--preset", "smoke", "--storage", str(tmp_path), *extra])
        return capsys.readouterr().out

    total = lambda out: int(out.split("FEL calculations: ")[1].split(",")[0])  # noqa: E731
    assert total(plan("--folds", "10")) == 10 * total(plan()), "smoke runs one fold per cell"
    from alignlab.platform.report import power as plan_power

    monkeypatch.setattr(plan_power, "RUNS", (1,))  # the lines are what is checked here, not the designs' search
    ten = plan("--folds", "10", "--detect", "1.5")
    assert "--folds N draws N finetuning samples per cell" in ten and "not yet a study flag" not in ten
    ad = ten[ten.index("  AD (components"):]
    assert "samples past its 5 folds repeat its test folds" in ad, "AD's plan says its extra samples are optimistic"
    assert "repeat its test folds" not in ten[ten.index("  CT (components"):ten.index("  AD (components")]


def test_a_pool_that_cannot_give_n_samples_of_the_budget_is_refused_in_one_line(small_pool):
    whole = with_tasks(_study(), ["few"], ["few"], {"few": 35})  # the budget is the whole pool: one sample exists
    with pytest.raises(ValueError) as e:
        study_run.check_folds(with_folds(whole, 2), small_pool)
    msg = str(e.value)
    assert "\n" not in msg and "need 2 distinct samples of FEW's budget 35 from a pool of 35 examples, which holds " \
                                "only 1" in msg and "--folds 1" not in msg
    almost = with_tasks(_study(), ["few"], ["few"], {"few": 34})  # C(35, 34) = 35 samples
    study_run.check_folds(with_folds(almost, 35), small_pool)
    with pytest.raises(ValueError, match="holds only 35; use --folds 35 or less"):
        study_run.check_folds(with_folds(almost, 36), small_pool)


def test_ad_folds_that_would_use_its_test_folds_unequally_are_refused(tmp_path):
    ad = task_named("ad")
    data = TaskData(tmp_path, {"ad": ad.load_examples(SHIPPED_TASK_DATA / "ad_ood.jsonl")})
    only_ad = with_tasks(_study(), [], ["ad"])
    with pytest.raises(ValueError, match=r"AD's folds cross-validate over 5 test folds.*--folds 5, 10"):
        study_run.check_folds(with_folds(only_ad, 7), data)
    study_run.check_folds(with_folds(only_ad, 10), data)
    study_run.check_folds(with_folds(only_ad, 3), data)  # three test folds, each once


def test_the_overlap_warning_names_the_samples_and_what_more_of_them_cannot_buy(small_pool):
    study = with_folds(with_tasks(_study(), ["few"], ["few"], {"few": 30}), 10)
    overlap = study_run.sample_overlap(study, small_pool)
    assert overlap == {"few": {"budget": 30, "pool": 35, "overlap": round(30 / 35, 3)}}
    (line,) = study_run.overlap_warnings(study, overlap)
    assert "share about 86% of their examples, so the 10 samples are nearly one" in line and "--folds" in line
    assert study_run.sample_overlap(with_tasks(_study(), ["few"], ["few"], {"few": 15}), small_pool) == {}


def _repeated_cv(rng, groups=5, per=2, units=24, sd_mu=0.5, sd_fold=0.1, sd_pool=0.6):
    """An A/A-like null on AD's layout: `groups` test folds of `units` two-pair snippets, each tested by `per` folds
    (f tests on f mod groups), two models with their own shift per snippet (model x unit: a difference on this test
    set, none on the population), per fold, and per test fold (`sd_pool`: the folds of one test fold sample from the
    same four training folds, so their shifts are alike)."""
    from alignlab.platform.report.unit_statistics import paired_test

    U = groups * units
    base, own = rng.normal(0, 1, U), {s: rng.normal(0, sd_mu, U) for s in "ab"}
    pool = {s: rng.normal(0, sd_pool, groups) for s in "ab"}
    fold, unit, correct = [], [], {"a": [], "b": []}
    for f in range(groups * per):
        ii = np.arange((f % groups) * units, (f % groups + 1) * units)
        for s in "ab":
            logit = base[ii] + own[s][ii] + pool[s][f % groups] + rng.normal(0, sd_fold) + rng.normal(0, 0.3, units)
            correct[s].append(rng.binomial(2, 1 / (1 + np.exp(-logit))))
        fold += [f] * units
        unit += list(ii)
    n = np.full(len(unit), 2.0)
    return paired_test({"folds": np.array(fold)}, np.array(unit), np.concatenate(correct["a"]), n,
                       np.concatenate(correct["b"]), n)


def test_ad_repeated_cross_validation_is_decided_nested_in_its_test_folds_at_its_level(monkeypatch):
    """Folds f and f + 5 share their snippets and their training pool: the decision treats each test fold as a
    replicate (4 degrees of freedom, its folds pooled), and under a true null its false-positive rate is at the level;
    the two-way cluster-robust decision it replaces there (folds and units as clusters, min(R, U) - 1 = 9 degrees of
    freedom) misses the folds' shared pool and calls too many (2,000 studies: 5.7% against 15.6%; without the shared
    pool 5.5% against 3.2%, docs/statistics.md)."""
    from alignlab.platform.report import unit_statistics

    ev = _repeated_cv(np.random.default_rng(0))
    assert ev.design == "nested" and ev.over == "test folds" and ev.n_replicates == 5
    assert ev.layout == "5 test folds × 2 folds each" and len(ev.parts) == 1 and ev.parts[0][1] == 4

    def rate():
        rng = np.random.default_rng(1)
        return float(np.mean([_repeated_cv(rng).p < 0.05 for _ in range(800)]))

    assert rate() <= 0.08  # 5.6% here; the Monte-Carlo sd of a 5% rate over 800 studies is 0.8 points
    monkeypatch.setattr(unit_statistics, "_shared_test_sets", lambda *a: None)
    assert _repeated_cv(np.random.default_rng(0)).design == "partly crossed"
    assert rate() >= 0.12  # 16.1% here


def test_a_fold_missing_from_a_repeated_cross_validation_falls_back_to_the_partly_crossed_decision():
    from alignlab.platform.report.unit_statistics import _shared_test_sets

    # Folds 0-9 over 5 test folds, fold 9 missing: test fold 4 has one fold, the others two.
    r = np.repeat(np.arange(9), 3)
    u = np.concatenate([np.arange(3 * (f % 5), 3 * (f % 5) + 3) for f in range(9)])
    assert _shared_test_sets(r, u, 9) is None
    full = np.repeat(np.arange(10), 3)
    group, within = _shared_test_sets(full, np.concatenate([u, np.arange(12, 15)]), 10)
    assert list(group) == [0, 1, 2, 3, 4] * 2 and list(within) == [0] * 5 + [1] * 5
