"""Every study script expands into valid studies at every preset, and a search study runs end to end on Ray."""
from __future__ import annotations

import dataclasses
import importlib.util
from collections import Counter
from pathlib import Path

import pytest

from alignlab.platform.config import PRESETS
from alignlab.platform.fel.finetune_config import FinetuneConfig
from alignlab.platform.study.spec import SearchParam, SearchSpec, Study, planned_calc_ids
from alignlab.platform.tasks.task import task as task_named

STUDIES = Path(__file__).resolve().parents[1] / "studies"
SEARCH_SCRIPTS = ("objective_mix",)
"""Scripts that build a search over pretraining (not a `Study` grid); tested in test_objective_mix.py."""
SCRIPTS = sorted(p.stem for p in STUDIES.glob("*.py") if p.stem not in SEARCH_SCRIPTS and not p.stem.startswith("_"))


def load_script(name: str):
    """A study script as a module (studies/ is a folder of scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"study_script_{name}", STUDIES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_paper_tables_each_have_a_study_script():
    assert {"objective_ablation", "model_size", "data_budget", "backprop", "learning_rate",
            "finetune_search"} <= set(SCRIPTS)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("name", SCRIPTS)
def test_every_study_script_expands_into_a_valid_study_without_duplicate_calculations(name, preset):
    study = load_script(name).build(preset)
    assert isinstance(study, Study) and preset in study.name
    assert study.calcs or study.searches
    ids = planned_calc_ids(study)
    dupes = [i for i, n in Counter(ids).items() if n > 1]
    assert not dupes, f"{name}/{preset}: calculations declared twice: {dupes}"
    used = {c.model for c in study.calcs} | {s.model for s in study.searches}
    assert used == {m.key for m in study.models}, "a declared model is never finetuned"
    # The paper-protocol grids never prune and each data point has the protocol's calculations.
    per_cell = Counter((c.row, c.col) for c in study.calcs)
    # (The null control runs all five folds at every preset: one fold has no spread to test by.)
    assert set(per_cell.values()) == {2 if preset == "smoke" and name != "null_control" else 10}


def test_objective_ablation_at_paper_scale_is_three_models_and_an_untrained_control_by_two_tasks_by_ten_calculations():
    study = load_script("objective_ablation").build("paper")
    assert len(study.models) == 4 and study.control_col == "untrained"
    assert Counter(c.finetune.task for c in study.calcs) == {"ct": 40, "ad": 40}
    assert len({(c.finetune.fold, c.finetune.seed) for c in study.calcs}) == 10
    assert {c.model for c in study.calcs} == {"all", "-whp", "-pad", "untrained"}
    models = {m.key: m.pretrain for m in study.models}
    assert models["untrained"].max_steps == 0 and models["untrained"].model == models["all"].model
    assert models["untrained"].seed == models["all"].seed
    assert all(not c.finetune.keep_head for c in study.calcs if c.col == "untrained")


def test_model_size_at_paper_scale_has_eleven_models_and_one_baseline_cell_per_task():
    study = load_script("model_size").build("paper")
    sizes = {m.key: m.pretrain.model.label for m in study.models}
    assert len(sizes) == 11
    assert {f"{h}x{n}" for h in (256, 512, 768) for n in (1, 2, 3)} <= set(sizes.values())
    assert sizes["-whp"] == sizes["-pad"] == "768x3"
    assert set(study.baseline_cells) == {("CT 768-", "3*"), ("AD 768-", "3*")}
    ablated = {(c.finetune.task, c.model) for c in study.calcs if c.row.endswith("-")}
    assert ablated == {("ct", "-whp"), ("ad", "-pad")}
    assert all(not c.finetune.keep_head for c in study.calcs if c.col == "3*")
    assert all(c.finetune.keep_head for c in study.calcs if c.col != "3*")


def test_the_paper_presets_sized_models_are_the_papers_model_sizes():
    from alignlab.platform.config import MODEL_SIZES
    from alignlab.platform.study.presets import sized_model

    for h in (256, 512, 768):
        for n in (1, 2, 3):
            assert sized_model("paper", h, n) == MODEL_SIZES[f"{h}x{n}"]


def test_the_smoke_data_budget_study_runs_the_presets_own_budgets_for_every_task():
    from alignlab.platform.presets import Preset

    study = load_script("data_budget").build("smoke")
    (ns, ref) = Preset.named("smoke").data_budgets
    assert {c.finetune.budget for c in study.calcs} == set(ns) and {c.finetune.task for c in study.calcs} == {"ct", "ad"}
    assert set(study.baseline_cells) == {(f"CT {ref}", "32-×2*"), (f"AD {ref}", "32-×2*")}
    assert study.notes.startswith("Smoke budgets")


def test_model_size_at_mini_shares_its_largest_model_with_the_objective_ablation():
    sizes = {m.key: m.pretrain for m in load_script("model_size").build("mini").models}
    ablation = {m.key: m.pretrain for m in load_script("objective_ablation").build("mini").models}
    assert sizes["128x2"] == ablation["all"] and sizes["-whp"] == ablation["-whp"]


def test_a_presets_objective_settings_carry_over_to_the_studys_objective_subsets(monkeypatch):
    from alignlab.objectives.masked_lm import MaskedLMConfig
    from alignlab.objectives.pseudo_acronym import PseudoAcronymConfig
    from alignlab.platform import presets
    from alignlab.platform.encoder.registry import objectives_like, resolve_objectives
    from alignlab.platform.presets import Preset

    base = dataclasses.replace(Preset.named("mini").pretrain, objectives=resolve_objectives(
        ["mlm", "nsp", "whp", PseudoAcronymConfig(chunk_labels=True)]))
    monkeypatch.setitem(presets._presets(), "mini", dataclasses.replace(Preset.named("mini"), pretrain=base))
    models = {m.key: m.pretrain for m in load_script("objective_ablation").build("mini").models}
    assert models["all"].objectives == base.objectives
    assert models["-whp"].objectives[-1] == PseudoAcronymConfig(chunk_labels=True)
    assert models["-pad"].objectives == base.objectives[:3]
    # Given explicitly, a config is taken as it is; a name the preset lacks gets the registry's defaults.
    mlm2 = MaskedLMConfig(weight=2.0)
    assert objectives_like([mlm2, "pad"], base.objectives) == (mlm2, PseudoAcronymConfig(chunk_labels=True))
    assert objectives_like("mlm,rtd", base.objectives)[1] == resolve_objectives("rtd")[0]
    assert objectives_like("", base.objectives) == resolve_objectives("")  # nothing named: the default set


def test_data_budget_skips_ct_at_1000_and_caps_ad_at_its_pool():
    study = load_script("data_budget").build("paper")
    budgets = {t: sorted({c.finetune.budget for c in study.calcs if c.finetune.task == t}) for t in ("ct", "ad")}
    assert budgets == {"ct": [50, 100, 150, 200], "ad": [50, 100, 150, 200, 768]}
    assert "1000" in study.notes and "768" in study.notes
    assert set(study.baseline_cells) == {("CT 200", "768-×3*"), ("AD 200", "768-×3*")}


def test_backprop_and_learning_rate_cover_the_paper_columns():
    schemes = {c.finetune.scheme for c in load_script("backprop").build("paper").calcs}
    assert schemes == {"pred", "pred+trm", "pred+trm+emb", "mt:pred+trm"}
    lr = load_script("learning_rate").build("paper")
    assert {c.finetune.lr for c in lr.calcs} == {1e-3, 1e-4, 1e-5}
    assert all(c.finetune.max_epochs >= 1000 for c in lr.calcs)


def test_finetune_search_runs_one_honest_search_per_task():
    study = load_script("finetune_search").build("paper")
    assert [s.base.task for s in study.searches] == ["ct", "ad"]
    for s in study.searches:
        assert s.base.selection == "honest" and s.scheduler in ("asha", "median")
        assert {p.name for p in s.space} == {"lr", "batch_size", "max_epochs", "dropout", "scheme"}
        assert len(s.points()) == 10


def _task_data():
    from alignlab.tasks.ad_data import ADExample
    from alignlab.tasks.ct_data import CTExample
    from alignlab.platform.tasks.task_data import TaskData

    ad = [ADExample(acr, f"snippet {i} of the acronym study", label) for i in range(300)
          for acr, label in ((f"s{i}a", 1), (f"s{i}b", 0))]
    ct = [CTExample(("when", "was", f"concept{i}", "made"), ("N", "N", "SE", "N")) for i in range(475)]
    return TaskData(Path("."), {"ad": ad, "ct_pool": ct[:275], "ct_test": ct[275:]})


def _key(ex) -> tuple:
    return ex.tokens if hasattr(ex, "tokens") else (ex.acronym, ex.snippet)


@pytest.mark.parametrize("preset", PRESETS)
def test_no_searched_example_is_in_the_test_set_of_a_calculation_that_reports_the_search(preset):
    """Nested selection: every example any trial of a search trains or validates on (for every scheme of the
    space, the multitask scheme's other-task examples included) lies outside the test set of every calculation
    its best setting is reported on; and every searched point is reported by exactly one search."""
    from alignlab.platform.fel.protocol import fel_split
    from alignlab.platform.study.search import search_examples

    data = _task_data()
    study = load_script("finetune_search").build(preset)
    for declared in study.searches:
        task = declared.base.task
        runs = declared.nested()
        reported = [pt for run in runs for pt in run.points()]
        assert sorted(reported) == sorted(declared.points()), "each point is reported by exactly one search"
        if task == "ct":
            assert [r.name for r in runs] == ["ct"], "CT's fixed, separate test set needs one search"
        else:
            assert {r.search_fold for r in runs} == {f for f, _ in declared.points()}, "AD: one search per test fold"
        [schemes] = [p.values for p in declared.space if p.name == "scheme"]
        for run in runs:
            for scheme in schemes:
                trial = dataclasses.replace(run.search_finetune(), scheme=scheme)
                train, val, other = search_examples(data, trial, task_named(task))
                searched = {_key(e) for e in train + val + (other or [])}
                assert len(train) + len(val) == trial.budget and val
                for calc in run.calcs_for({"scheme": scheme}):
                    test = fel_split(data, task_named(task), calc.finetune)[2]
                    leaked = searched & {_key(e) for e in test}
                    assert not leaked, (f"search {run.name} saw {len(leaked)} examples of the test set of "
                                        f"(fold, seed) {calc.finetune.fold, calc.finetune.seed}")
                if task == "ct":  # the CT search samples from the pool; the test set stays separate
                    assert {_key(e) for e in train + val} <= {_key(e) for e in data.ct_pool}


def test_a_search_on_one_folds_training_data_refuses_to_report_on_another_fold():
    base = FinetuneConfig(task="ad")
    lr = SearchParam(name="lr", kind="loguniform", values=(1e-5, 1e-2))
    with pytest.raises(ValueError, match="cannot choose the setting"):
        SearchSpec(name="x", model="m", base=base, space=(lr,), num_samples=2, row="AD", col="s", search_fold=0,
                   final_points=((0, 0), (1, 0)))
    ct = SearchSpec(name="x", model="m", base=dataclasses.replace(base, task="ct"), space=(lr,), num_samples=2,
                    row="CT", col="s", search_fold=0)
    assert ct.nested() == (ct,) and len(ct.points()) == 10


def test_a_search_refuses_test_set_selection_and_unsearchable_fields():
    base = FinetuneConfig(selection="paper")
    lr = SearchParam(name="lr", kind="loguniform", values=(1e-5, 1e-2))
    with pytest.raises(ValueError, match="honest"):
        SearchSpec(name="x", model="m", base=base, space=(lr,), num_samples=2, row="AD", col="s")
    with pytest.raises(ValueError, match="searchable"):
        SearchParam(name="fold", kind="choice", values=(0, 1))
    with pytest.raises(ValueError, match="low < high"):
        SearchParam(name="lr", kind="loguniform", values=(1e-2, 1e-5))


def test_a_study_rejects_a_baseline_that_has_no_calculations():
    study = load_script("backprop").build("smoke")
    with pytest.raises(ValueError, match="baseline"):
        dataclasses.replace(study, baseline_col="nope")
    with pytest.raises(ValueError, match="baseline cell"):
        dataclasses.replace(study, baseline_cells=(("CT", "nope"),))


@pytest.mark.ray
def test_finetune_search_at_smoke_runs_end_to_end_on_ray(ray_session, storage_root):
    from alignlab.platform.storage.root import read_json
    from alignlab.platform.study.run import run_study

    study = load_script("finetune_search").build("smoke")
    # One task's search keeps the test short; the script searches both. Eight trials, one at a time (so the
    # run is deterministic), give ASHA trials to prune: with a FIFO scheduler (no pruning) this test fails.
    search = dataclasses.replace(study.searches[-1], num_samples=8)
    study = dataclasses.replace(study, searches=(search,), calcs=tuple(c for c in study.calcs if c.row == search.row))
    report = run_study(study, storage_root, progress=False, max_concurrent=1)
    sdir = report.parent
    summary = read_json(sdir / "searches" / "ad-fold0.json")  # AD: one search per test fold (smoke: fold 0 only)
    assert len(summary["trials"]) == 8
    pruned = [t for t in summary["trials"] if t["status"] == "pruned"]
    assert pruned, f"no trial was pruned: {[t['status'] for t in summary['trials']]}"
    assert all(t["epoch"] < t["params"]["max_epochs"] for t in pruned), "pruned means stopped before its own end"
    base = study.searches[0].base  # the default setting is among the trials (Optuna points_to_evaluate)
    assert any(t["params"]["lr"] == pytest.approx(base.lr) and t["params"]["scheme"] == base.scheme
               for t in summary["trials"])
    assert any(t["status"] == "complete" for t in summary["trials"])
    assert 0.0 <= summary["best_value"] <= 1.0
    best = summary["best_params"]
    assert set(best) == {"lr", "batch_size", "max_epochs", "dropout", "scheme"}
    trials = [read_json(f) for f in (sdir / "trials").glob("*.json")]
    searched = [t for t in trials if t["col"] == "searched"]
    assert sorted([t["ft_fold"], t["ft_seed"]] for t in searched) == [[0, 0], [0, 1]] == summary["final_points"]
    assert all(t["ft_scheme"] == best["scheme"] and t["ft_lr"] == pytest.approx(best["lr"]) for t in searched)
    assert all(t["selection"] == "honest" for t in trials)
    text = report.read_text()
    assert "Selection mode: honest" in text and "Hyperparameter searches" in text and "searched" in text
    # A rerun finds the search and every calculation done.
    before = {f.name: f.stat().st_mtime for f in (sdir / "trials").glob("*.json")}
    run_study(study, storage_root, progress=False)
    assert {f.name: f.stat().st_mtime for f in (sdir / "trials").glob("*.json")} == before


def test_a_named_precision_trains_the_models_auto_trains_on_that_kind_of_cpu_under_its_own_study(tmp_path,
                                                                                                 monkeypatch):
    from alignlab.platform.runtime import precision
    from alignlab.platform.pretrain.models import model_id
    from alignlab.platform.study import run as study_run
    from alignlab.platform.study.spec import with_precision

    script = load_script("objective_ablation")
    study = script.build("mini")
    assert with_precision(study, "auto") is study
    fp32 = with_precision(study, "fp32")
    assert fp32.name == f"{study.name}-fp32" and {m.pretrain.precision for m in fp32.models} == {"fp32"}
    assert [m.key for m in fp32.models] == [m.key for m in study.models] and fp32.calcs == study.calcs
    # The untrained control is trained at no precision: every precision's study shares its one model.
    assert {m.pretrain.precision for m in with_precision(study, "bf16").models if m.pretrain.max_steps == 0} == {"fp32"}
    # The id of `--precision fp32` on this machine is the id `auto` names on a CPU where bf16 is no faster, and
    # `--precision bf16` that of `auto` on one with it: a named precision reuses the other kind of CPU's models.
    for has_bf16, named in ((False, "fp32"), (True, "bf16")):
        monkeypatch.setattr(precision, "cpu_prefers_bf16", lambda: has_bf16)
        assert [model_id("c", m.pretrain) for m in study.models] == \
               [model_id("c", m.pretrain) for m in with_precision(study, named).models]
    monkeypatch.setattr(precision, "cpu_prefers_bf16", lambda: True)
    assert model_id("c", study.models[0].pretrain) != model_id("c", fp32.models[0].pretrain)
    with pytest.raises(ValueError, match="fp16"):
        with_precision(study, "fp16")
    # The command line: --precision, with --pretrain-seeds on top.
    ran = []
    monkeypatch.setattr(study_run, "run_study", lambda s, root, **kw: ran.append(s) or tmp_path / "r.md")
    study_run.study_main(script.build, ["--precision", "fp32", "--pretrain-seeds", "2", "--storage", str(tmp_path)],
                         extra_objective_sets=True)
    (ran_study,) = ran
    assert ran_study.name == f"{study.name}-fp32-2pretrain_seeds"
    assert len(ran_study.models) == 2 * len(study.models) and {m.pretrain.precision for m in ran_study.models} == {"fp32"}
    # The objective-mixture search, the one study script of its own command line, takes it too.
    mix, searched = load_script("objective_mix"), []
    monkeypatch.setattr(mix, "run_objective_search", lambda spec, root, **kw: searched.append(spec) or tmp_path)
    mix.main(["--precision", "fp32", "--storage", str(tmp_path)])
    assert searched[0].name == "objective_mix-mini-fp32" and searched[0].pretrain.precision == "fp32"


def test_pretrain_seeds_make_the_pretraining_run_a_factor_of_every_cell():
    from alignlab.platform.study.spec import with_pretrain_seeds

    study = load_script("objective_ablation").build("mini")
    assert with_pretrain_seeds(study, 1) is study
    three = with_pretrain_seeds(study, 3)
    assert three.name == f"{study.name}-3pretrain_seeds"
    assert len(three.models) == 3 * len(study.models) and len(three.calcs) == 3 * len(study.calcs)
    runs = {m.key: m.pretrain for m in three.models}
    first = {m.key: m.pretrain for m in study.models}
    for key, cfg in first.items():
        assert runs[key] == cfg, "the first run is the study's own model, reused"
        assert [runs[k].seed for k in (key, f"{key}@seed{cfg.seed + 1}", f"{key}@seed{cfg.seed + 2}")] == \
               [cfg.seed, cfg.seed + 1, cfg.seed + 2]
    assert {(c.row, c.col) for c in three.calcs} == {(c.row, c.col) for c in study.calcs}
    assert len(set(planned_calc_ids(three))) == 3 * len(set(planned_calc_ids(study)))
    with pytest.raises(ValueError, match="searches"):
        with_pretrain_seeds(load_script("finetune_search").build("mini"), 2)
