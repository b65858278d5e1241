"""Issue #56: the layout a study runs, chosen from the cluster: how many models pretrain side by side (the default
of --parallel-pretrain) and what each stage costs in device-hours and wall time (`alignlab plan`). Pure functions
of the cluster's resources, so no GPU is needed."""
from __future__ import annotations

import dataclasses

import pytest

import alignlab.platform.registry  # noqa: F401  (the presets resolve their objectives through it)
from alignlab.platform.study.layout import side_by_side, wall_hours


def _gpu(workers: int = 1, cpus: float = 8.0):
    from alignlab.platform.presets import PRETRAIN_PRESETS

    return dataclasses.replace(PRETRAIN_PRESETS["paper"], num_workers=workers, cpus_per_worker=cpus)


def test_models_of_one_gpu_each_train_one_per_gpu_of_the_cluster_at_most_one_per_model():
    eight = {"GPU": 8.0, "CPU": 192.0}
    assert side_by_side(eight, [_gpu()] * 3) == 3
    assert side_by_side(eight, [_gpu()] * 11) == 8
    assert side_by_side(eight, [_gpu(workers=4)] * 3) == 2  # data-parallel runs of 4 GPUs each
    assert side_by_side({"GPU": 8.0, "CPU": 32.0}, [_gpu()] * 11) == 4  # 8 CPUs a worker: the CPUs hold 4


def test_on_cpus_or_before_an_autoscaler_adds_gpus_models_train_one_at_a_time():
    from alignlab.platform.presets import PRETRAIN_PRESETS

    assert side_by_side({"CPU": 64.0}, [PRETRAIN_PRESETS["mini"]] * 3) == 1
    assert side_by_side({"CPU": 64.0, "GPU": 8.0}, [PRETRAIN_PRESETS["mini"], _gpu()]) == 1  # one trains on CPUs
    assert side_by_side({"CPU": 0.0}, [_gpu()] * 3) == 1  # a head with no GPU node yet
    untrained = dataclasses.replace(_gpu(), max_steps=0)
    assert side_by_side({"GPU": 8.0, "CPU": 192.0}, [_gpu(), untrained]) == 1  # the untrained model costs no slot


def test_wall_time_starts_each_run_as_a_slot_frees_and_divides_a_run_over_its_workers():
    assert wall_hours([10.0, 10.0, 10.0], [1, 1, 1], 3) == 10.0
    assert wall_hours([10.0, 10.0, 10.0], [1, 1, 1], 2) == 20.0
    assert wall_hours([40.0, 40.0], [4, 4], 1) == 20.0
    assert wall_hours([0.0, 5.0], [1, 1], 1) == 5.0
    assert wall_hours([1.0, None], [1, 1], 2) is None


def test_the_paper_plan_on_eight_h100s_lays_out_the_models_and_the_per_gpu_batch(tmp_path, capsys):
    from alignlab.platform.cli import main

    assert main(["plan", "objective_ablation", "--preset", "paper", "--storage", str(tmp_path / "root"),
                 "--device", "H100", "--gpus", "8", "--gpus-per-trial", "0.25"]) == 0
    out = capsys.readouterr().out
    assert out.count("(4 workers, 64 per device)") == 3, out
    assert "layout on 8 GPUs: pretraining 2 models side by side" in out and "FEL 32 trials at once" in out
    # 3 runs of ~28.4 H100-hours over 4 GPUs each, 2 at once: two waves of ~7.1 h.
    line = next(line for line in out.splitlines() if "layout on" in line)
    assert "85.3 device-h, 14.2 h wall" in line, line
    assert main(["plan", "objective_ablation", "--preset", "paper", "--storage", str(tmp_path / "root"),
                 "--device", "H100", "--gpus", "8", "--parallel-pretrain", "1"]) == 0
    assert "pretraining 1 model side by side, 85.3 device-h, 21.3 h wall" in capsys.readouterr().out


def test_a_study_without_parallel_pretrain_takes_its_default_from_the_cluster(monkeypatch, tmp_path):
    from alignlab.platform.study import run

    seen = {}
    monkeypatch.setattr(run, "run_study", lambda study, root, **kw: seen.update(kw) or tmp_path / "report.md")
    run.study_main(_build(), ["--preset", "smoke", "--storage", str(tmp_path / "root")])
    assert seen["max_parallel_pretrain"] is None  # _run_study asks ray.cluster_resources() through side_by_side
    run.study_main(_build(), ["--preset", "smoke", "--storage", str(tmp_path / "root"), "--parallel-pretrain", "3"])
    assert seen["max_parallel_pretrain"] == 3


def _build():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "studies" / "objective_ablation.py"
    spec = importlib.util.spec_from_file_location("layout_objective_ablation", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build


def test_the_paper_preset_asks_eight_cpus_and_three_collating_processes_a_gpu_without_changing_its_model_id():
    from alignlab.platform.presets import PRETRAIN_PRESETS
    from alignlab.platform.pretrain.models import model_id

    paper = PRETRAIN_PRESETS["paper"]
    assert (paper.cpus_per_worker, paper.collate_workers, paper.use_gpu) == (8.0, 3, True)
    before = dataclasses.replace(paper, cpus_per_worker=4.0, collate_workers=2)  # the preset until issue #56
    assert model_id("bundled-x", paper) == model_id("bundled-x", before)
