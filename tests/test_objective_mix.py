"""The objective-mixture search (studies/objective_mix.py): its space, its Pareto front, and a smoke run on Ray."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from test_studies import load_script

from alignlab.platform.config import PRESETS
from alignlab.platform.study.objective_search import MixSearchSpec, pareto_front, search_id

REPO = Path(__file__).resolve().parents[1]
SWNER = "name=swner,kind=tagging,pool=examples/software_ner/pool.jsonl,test=examples/software_ner/test.jsonl"


@pytest.mark.parametrize("preset", PRESETS)
def test_the_script_expands_into_a_valid_search_whose_mixtures_are_valid_pretraining_configs(preset):
    spec = load_script("objective_mix").build(preset)
    assert isinstance(spec, MixSearchSpec) and preset in spec.name
    assert set(spec.candidates) == {"mlm", "nsp", "whp", "pad", "rtd"}
    params = {f"on_{n}": n in ("whp", "rtd") for n in spec.candidates} | {f"w_{n}": 3.0 for n in spec.candidates}
    cfg = spec.pretrain_for(params)
    assert cfg.objective_names == ("whp", "rtd") and all(o.weight == 3.0 for o in cfg.objectives)
    assert cfg.max_steps == spec.pretrain.max_steps  # the preset's budget, whatever the mixture
    none_on = {**params, **{f"on_{n}": False for n in spec.candidates}}
    assert spec.pretrain_for(none_on).objective_names == ("mlm",)
    assert spec.finetune.selection == "honest"
    with pytest.raises(ValueError, match="unknown objective"):
        dataclasses.replace(spec, candidates=("mlm", "nope"))


def test_the_pareto_front_keeps_exactly_the_undominated_trials():
    rows = [{"ct_val_accuracy": 0.6, "ad_val_accuracy": 0.5},   # dominated by 2
            {"ct_val_accuracy": 0.5, "ad_val_accuracy": 0.7},   # front (best AD)
            {"ct_val_accuracy": 0.7, "ad_val_accuracy": 0.55},  # front (best CT)
            {"ct_val_accuracy": 0.7, "ad_val_accuracy": 0.55},  # a tie is not dominated
            {"ct_val_accuracy": float("nan"), "ad_val_accuracy": 0.9},
            {"status": "error"}]
    assert pareto_front(rows, ("ct_val_accuracy", "ad_val_accuracy")) == [1, 2, 3]


def test_a_mini_trial_leaves_ray_data_a_whole_cpu_on_two_cpus_without_changing_the_model_id():
    """The mini search hung on 2 CPUs (trial 0.1 + worker 1.0 left Ray Data 0.9 CPU): the worker's logical CPUs
    are cut to fit, its torch threads and the model id are not."""
    from alignlab.platform.presets import Preset
    from alignlab.platform.pretrain.models import model_id
    from alignlab.platform.runtime.resources import RAY_DATA_CPUS
    from alignlab.platform.study.objective_search import TRIAL_CPUS, beside_trials

    mini = dataclasses.replace(Preset.named("mini").pretrain, objectives="mlm,nsp")
    fitted = beside_trials(mini, 2.0, 1)
    assert fitted.cpus_per_worker * fitted.num_workers + TRIAL_CPUS + RAY_DATA_CPUS <= 2.0
    assert fitted.cpus_per_worker > 0.5 and fitted.threads_per_worker == mini.threads_per_worker == 2
    assert model_id("c", fitted) == model_id("c", mini)
    smoke = Preset.named("smoke").pretrain
    assert beside_trials(smoke, 2.0, 1) is smoke  # 0.5 + 0.1 + 1 fits: untouched
    assert beside_trials(mini, 16.0, 2) is mini  # a bigger machine: untouched
    auto = dataclasses.replace(mini, threads_per_worker=0)  # "as many threads as CPUs" keeps its 1 thread
    assert beside_trials(auto, 2.0, 1).threads_per_worker == 1


@pytest.mark.ray
def test_the_search_runs_at_smoke_on_ray_and_reports_a_pareto_front(ray_session, storage_root):
    import time

    from alignlab.platform.study.objective_search import run_objective_search

    # Two trials (`--num-samples 2`; the preset's smoke search has 3): the default mixture and one the sampler drew,
    # each a pretraining under Ray Train, are enough for a front, the journal and a rerun that trains nothing.
    spec = dataclasses.replace(load_script("objective_mix").build("smoke"), num_samples=2)
    t0 = time.time()
    report = run_objective_search(spec, storage_root, progress=False)
    wall = time.time() - t0
    summary = json.loads((report.parent / "search.json").read_text())
    METRICS = spec.metrics()
    assert METRICS == ("ct_val_accuracy", "ad_val_accuracy")
    assert summary["metrics"] == list(METRICS) and summary["modes"] == ["max", "max"]
    done = [t for t in summary["trials"] if t["status"] == "complete"]
    assert len(summary["trials"]) == spec.num_samples and len(done) == spec.num_samples
    for t in done:
        assert 0 <= t["ct_val_accuracy"] <= 1 and 0 <= t["ad_val_accuracy"] <= 1
        assert (storage_root / "models" / t["model_id"] / "final" / "model.pt").exists()
        assert t["objectives"] == "+".join(n for n, _ in t["mixture"])
    front = [t for t in done if t["pareto"]]
    assert front and summary["pareto_front"] == [t["model_id"] for t in front]
    for t in front:
        assert not any(o["ct_val_accuracy"] >= t["ct_val_accuracy"] and o["ad_val_accuracy"] >= t["ad_val_accuracy"]
                       and (o["ct_val_accuracy"], o["ad_val_accuracy"]) != (t["ct_val_accuracy"], t["ad_val_accuracy"])
                       for o in done)
    text = report.read_text()
    assert "Pareto front" in text and text.count("| yes |") == len(front)
    # The search's persistent Optuna study (issue #18): a journal beside search.json that Optuna itself opens,
    # one trial per row with both accuracies; the report has one importance entry per task's accuracy.
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    journal = report.parent / "search.optuna.journal"
    assert summary["optuna"] == {"study": summary["tune_name"], "storage": str(journal), "journal": journal.name}
    study = optuna.load_study(study_name=summary["tune_name"], storage=JournalStorage(JournalFileBackend(str(journal))))
    assert len(study.trials) == spec.num_samples and all(t.state.name == "COMPLETE" for t in study.trials)
    assert sorted(tuple(t.values) for t in study.trials) == sorted(tuple(t[m] for m in METRICS) for t in done)
    for m in METRICS:
        [line] = [x for x in text.splitlines() if x.startswith(f"Parameter importance for {m}")]
        png = report.parent / "plots" / f"importance-{spec.name}-{m}.png"
        assert (png.read_bytes()[:4] == b"\x89PNG") if png.name in text else "none (" in line, line
    # A rerun finds the finished search and trains nothing.
    before = {t["model_id"]: (storage_root / "models" / t["model_id"] / "final" / "model.pt").stat().st_mtime_ns
              for t in done}
    run_objective_search(spec, storage_root, progress=False)
    assert {m: (storage_root / "models" / m / "final" / "model.pt").stat().st_mtime_ns for m in before} == before
    print(f"\nobjective_mix smoke search wall: {wall:.0f}s")


def test_a_search_without_declared_tasks_keeps_its_name_and_the_id_it_had_before_tasks_could_be_declared():
    from alignlab.platform.config import config_hash
    from alignlab.platform.study.tasks import search_with_tasks

    for preset in PRESETS:
        spec = load_script("objective_mix").build(preset)
        assert search_with_tasks(spec, [], None, ()) is spec and spec.name == f"objective_mix-{preset}"
        before = config_hash(spec.name, spec.pretrain, spec.finetune, list(spec.candidates), list(spec.weights),
                             [list(p) for p in spec.points], spec.seed, "tasks-id")  # the id's formula until now
        assert search_id(spec, "tasks-id") == f"objective-search-{before}"


def test_declared_tasks_name_the_search_and_its_id_and_the_first_one_is_maximized_unless_named(monkeypatch):
    from alignlab.platform.study.tasks import declare_specs, search_with_tasks
    from alignlab.platform.tasks.task_kinds import undeclare

    monkeypatch.chdir(REPO)
    spec = load_script("objective_mix").build("smoke")
    try:
        names = declare_specs([SWNER])
        only = search_with_tasks(spec, names, ["swner"])
        assert only.name.startswith("objective_mix-smoke-tasks-") and only.scored_tasks() == ("swner",)
        assert only.metrics() == ("swner_val_accuracy",) and [d["name"] for d in only.declared] == ["swner"]
        assert search_id(only, "t") != search_id(spec, "t") and only.declared[0]["digest"]
        both = search_with_tasks(spec, names, None, ("swner:span_f1", "ct"))
        assert both.scored_tasks()[-1] == "swner" and both.metrics() == ("swner_val_span_f1", "ct_val_accuracy")
        assert both.name != only.name
        with pytest.raises(ValueError, match="not a metric of the scored tasks"):
            search_with_tasks(spec, names, ["swner"], ("ct",))
    finally:
        undeclare("swner")


# -m slow (~65 s): the default suite runs the smoke search on Ray (above), a declared task re-declared in the Tune
# workers of a study (test_e2e.py), and how declared tasks name the search and its metric (above).
@pytest.mark.slow
@pytest.mark.ray
def test_a_smoke_search_on_a_declared_task_maximizes_its_metric_and_names_it_in_results_and_report(
        ray_session, storage_root, monkeypatch):
    """`--task ... --only-tasks swner` on the script's command line, as a user runs it: the trials (Ray Tune
    workers, which re-declare the task from the trial's config) score swner only, and Optuna gets its accuracy."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from alignlab.platform.tasks.task_kinds import undeclare

    monkeypatch.chdir(REPO)
    try:
        report = load_script("objective_mix").main(["--preset", "smoke", "--storage", str(storage_root),
                                                    "--num-samples", "2", "--task", SWNER, "--only-tasks", "swner"])
    finally:
        undeclare("swner")
    summary = json.loads((report.parent / "search.json").read_text())
    assert summary["name"].startswith("objective_mix-smoke-tasks-") and summary["tasks"] == ["swner"]
    assert summary["metrics"] == ["swner_val_accuracy"] and summary["modes"] == ["max"]
    assert [d["name"] for d in summary["declared"]] == ["swner"] and summary["declared"][0]["kind"] == "tagging"
    done = [t for t in summary["trials"] if t["status"] == "complete"]
    assert len(summary["trials"]) == len(done) == 2
    for t in done:
        assert 0 <= t["swner_val_accuracy"] <= 1 and 0 <= t["swner_val_span_f1"] <= 1
        assert not any(k.startswith(("ct_", "ad_")) for k in t)  # only the declared task was scored
    journal = report.parent / "search.optuna.journal"
    study = optuna.load_study(study_name=summary["tune_name"], storage=JournalStorage(JournalFileBackend(str(journal))))
    assert sorted(t.values for t in study.trials) == sorted([t["swner_val_accuracy"]] for t in done)
    text = report.read_text()
    assert "SWNER val acc" in text and "declared from files: SWNER" in text and "CT" not in text.split("##")[0]


def test_a_bad_declared_task_file_stops_the_search_before_any_work_naming_file_and_line(tmp_path, capsys):
    bad = tmp_path / "pool.jsonl"
    bad.write_text('{"tokens": ["a"], "tags": ["O", "O"]}\n')
    spec = f"name=bad,kind=tagging,pool={bad},test={REPO / 'examples' / 'software_ner' / 'test.jsonl'}"
    with pytest.raises(SystemExit) as stop:
        load_script("objective_mix").main(["--preset", "smoke", "--storage", str(tmp_path / "st"), "--task", spec])
    assert stop.value.code == 2 and f"{bad}:1: 2 tags for 1 tokens" in capsys.readouterr().err
    assert not (tmp_path / "st").exists()
