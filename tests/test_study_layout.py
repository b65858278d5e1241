"""Issue #56: the layout a study runs, chosen from the cluster: how many models pretrain side by side (the default
of --parallel-pretrain) and what each stage costs in device-hours and wall time (`alignlab plan`). Pure functions
of the cluster's resources, so no GPU is needed."""
from __future__ import annotations

import dataclasses

import pytest

from alignlab.platform.study.layout import MAX_MODELS_PER_GPU, models_per_gpu, pack, side_by_side, wall_hours


def _gpu(workers: int = 1, cpus: float = 8.0):
    from alignlab.platform.presets import Preset

    return dataclasses.replace(Preset.named("paper").pretrain, num_workers=workers, cpus_per_worker=cpus)


def test_models_of_one_gpu_each_train_one_per_gpu_of_the_cluster_at_most_one_per_model():
    eight = {"GPU": 8.0, "CPU": 192.0}
    assert side_by_side(eight, [_gpu()] * 3) == 3
    assert side_by_side(eight, [_gpu()] * 11) == 8
    assert side_by_side(eight, [_gpu(workers=4)] * 3) == 2  # data-parallel runs of 4 GPUs each
    assert side_by_side({"GPU": 8.0, "CPU": 32.0}, [_gpu()] * 11) == 4  # 8 CPUs a worker: the CPUs hold 4


def test_on_cpus_or_before_an_autoscaler_adds_gpus_models_train_one_at_a_time():
    from alignlab.platform.presets import Preset

    assert side_by_side({"CPU": 64.0}, [Preset.named("mini").pretrain] * 3) == 1
    assert side_by_side({"CPU": 64.0, "GPU": 8.0}, [Preset.named("mini").pretrain, _gpu()]) == 1  # one trains on CPUs
    assert side_by_side({"CPU": 0.0}, [_gpu()] * 3) == 1  # a head with no GPU node yet
    untrained = dataclasses.replace(_gpu(), max_steps=0)
    assert side_by_side({"GPU": 8.0, "CPU": 192.0}, [_gpu(), untrained]) == 1  # the untrained model costs no slot


def test_wall_time_starts_each_run_as_a_slot_frees_and_divides_a_run_over_its_workers():
    assert wall_hours([10.0, 10.0, 10.0], [1, 1, 1], 3) == 10.0
    assert wall_hours([5.0, 5.0, 5.0], [0.5, 0.5, 0.5], 3) == 10.0  # half a GPU each: as long as alone
    assert wall_hours([10.0, 10.0, 10.0], [1, 1, 1], 2) == 20.0
    assert wall_hours([40.0, 40.0], [4, 4], 1) == 20.0
    assert wall_hours([0.0, 5.0], [1, 1], 1) == 5.0
    assert wall_hours([1.0, None], [1, 1], 2) is None


def test_the_paper_plan_on_eight_h100s_lays_out_one_model_per_gpu_and_data_parallel_only_when_asked(tmp_path, capsys):
    from alignlab.platform.cli import main

    root = str(tmp_path / "root")
    assert main(["plan", "objective_ablation", "--preset", "paper", "--storage", root,
                 "--device", "H100", "--gpus", "8", "--gpus-per-trial", "0.25"]) == 0
    out = capsys.readouterr().out
    assert out.count("1953125 steps x 256 (1 worker)") == 3, out  # one GPU a model: a 768x3 step fills it alone
    assert "layout on 8 GPUs: pretraining 3 models side by side" in out and "FEL 32 trials at once" in out
    # 3 runs of ~28.4 H100-hours, one GPU each, all at once.
    line = next(line for line in out.splitlines() if "layout on" in line)
    assert "85.3 device-h, 28.4 h wall" in line, line
    assert main(["plan", "objective_ablation", "--preset", "paper", "--storage", root,
                 "--device", "H100", "--gpus", "8", "--parallel-pretrain", "1"]) == 0
    assert "pretraining 1 model side by side, 85.3 device-h, 85.3 h wall" in capsys.readouterr().out
    # Data parallelism when the user asks: 4 workers of 64 rows each, 2 models at once on 8 GPUs.
    assert main(["plan", "objective_ablation", "--preset", "paper", "--storage", root,
                 "--device", "H100", "--gpus", "8", "--train-workers", "4"]) == 0
    out = capsys.readouterr().out
    assert out.count("1953125 steps x 256 (4 workers, 64 per device)") == 3, out
    assert "pretraining 2 models side by side, 85.3 device-h, 14.2 h wall" in out, out


def test_models_whose_step_cannot_fill_a_gpu_are_packed_several_to_one_gpu_and_the_others_get_one_each():
    from alignlab.platform.config import MODEL_SIZES
    from alignlab.platform.pretrain.models import model_id

    small = dataclasses.replace(_gpu(), model=MODEL_SIZES["128x2"])
    assert models_per_gpu(small, 32_000) == MAX_MODELS_PER_GPU  # its step is kernel launches, not FLOPs
    assert models_per_gpu(_gpu(), 111_000) == 1  # the paper's 768x3 fills a GPU alone
    assert models_per_gpu(dataclasses.replace(_gpu(), model=MODEL_SIZES["256x2"]), 111_000) == 2
    # Never packed: a run on CPUs, a data-parallel run (a GPU per worker), a model that does not train.
    assert models_per_gpu(dataclasses.replace(small, use_gpu=False), 32_000) == 1
    assert models_per_gpu(dataclasses.replace(small, num_workers=4), 32_000) == 1
    assert models_per_gpu(dataclasses.replace(small, max_steps=0), 32_000) == 1

    big, dp = _gpu(), dataclasses.replace(small, num_workers=2)
    packed = pack([small, big, dp], 32_000)
    assert [c.gpus_per_worker for c in packed] == [1 / MAX_MODELS_PER_GPU, 1.0, 1.0]
    assert [c.gpus_per_worker for c in pack([small, big, dp], 32_000, per_gpu=3)] == [1 / 3, 1 / 3, 1.0]
    assert pack([small], 32_000, per_gpu=1)[0].gpus_per_worker == 1.0
    # A runtime field: the model is the same wherever it trains.
    assert model_id("bundled-x", packed[0]) == model_id("bundled-x", small)
    # Packed runs fill the GPUs K to one, within the CPUs they ask for.
    assert side_by_side({"GPU": 2.0, "CPU": 192.0}, [pack([small], 32_000, per_gpu=3)[0]] * 11) == 6
    assert side_by_side({"GPU": 1.0, "CPU": 17.0}, [packed[0]] * 11) == 2  # 8 CPUs each
    from alignlab.platform.pretrain.driver import worker_resources

    assert worker_resources(packed[0]) == {"CPU": 8.0, "GPU": 0.25}


def test_a_gpu_share_is_refused_for_data_parallel_workers_and_above_one_naming_the_field():
    with pytest.raises(ValueError, match="gpus_per_worker .* num_workers=2"):
        dataclasses.replace(_gpu(), num_workers=2, gpus_per_worker=0.5)
    with pytest.raises(ValueError, match="gpus_per_worker"):
        dataclasses.replace(_gpu(), gpus_per_worker=2.0)
    with pytest.raises(ValueError, match="gpus_per_worker must be > 0"):
        dataclasses.replace(_gpu(), gpus_per_worker=0.0)


def test_the_plan_of_packed_models_shows_them_per_gpu_and_their_share_of_the_device_hours(tmp_path, capsys):
    from alignlab.platform.cli import main

    assert main(["plan", "objective_ablation", "--preset", "paper", "--storage", str(tmp_path / "root"),
                 "--device", "H100", "--gpus", "1", "--models-per-gpu", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("1953125 steps x 256 (1 worker, 3 models per GPU)") == 3, out
    line = next(line for line in out.splitlines() if "layout on" in line)
    # Three runs on a third of one GPU each, at once: each takes as long as alone, a third of the GPU's hours.
    assert "pretraining 3 models side by side, 28.4 device-h, 28.4 h wall" in line, line


def test_a_study_without_parallel_pretrain_takes_its_default_from_the_cluster(monkeypatch, tmp_path):
    from alignlab.platform.study import run

    seen = {}
    monkeypatch.setattr(run, "run_study", lambda study, root, **kw: seen.update(kw) or tmp_path / "report.md")
    run.study_main(_build(), ["--preset", "smoke", "--storage", str(tmp_path / "root")])
    assert seen["max_parallel_pretrain"] is None  # _run_study asks ray.cluster_resources() through side_by_side
    run.study_main(_build(), ["--preset", "smoke", "--storage", str(tmp_path / "root"), "--parallel-pretrain", "3"])
    assert seen["max_parallel_pretrain"] == 3


def test_a_study_packs_its_small_gpu_models_and_gives_its_big_ones_a_gpu_each(monkeypatch, tmp_path):
    from alignlab.platform.study import run

    seen = {}
    monkeypatch.setattr(run, "run_study", lambda study, root, **kw: seen.update(study=study) or tmp_path / "r.md")
    run.study_main(_build(), ["--preset", "paper", "--storage", str(tmp_path / "root")])
    assert {m.pretrain.gpus_per_worker for m in seen["study"].models} == {1.0}  # 768x3: one GPU each
    run.study_main(_build(), ["--preset", "paper", "--storage", str(tmp_path / "root"), "--models-per-gpu", "2"])
    trained = [m.pretrain for m in seen["study"].models if m.pretrain.max_steps]
    assert trained and {c.gpus_per_worker for c in trained} == {0.5}


def _build():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "studies" / "objective_ablation.py"
    spec = importlib.util.spec_from_file_location("layout_objective_ablation", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build


def test_the_paper_preset_asks_eight_cpus_and_three_collating_processes_a_gpu_without_changing_its_model_id():
    from alignlab.platform.presets import Preset
    from alignlab.platform.pretrain.models import model_id

    paper = Preset.named("paper").pretrain
    assert (paper.cpus_per_worker, paper.collate_workers, paper.use_gpu) == (8.0, 3, True)
    before = dataclasses.replace(paper, cpus_per_worker=4.0, collate_workers=2)  # the preset until issue #56
    assert model_id("bundled-x", paper) == model_id("bundled-x", before)


def test_fel_trials_are_not_capped_by_the_clusters_resources_so_an_autoscaler_sees_them_waiting():
    """Without --max-concurrent, Tune asks for every pending trial's resources at once and an autoscaler adds nodes
    for those left waiting; a cap taken from the cluster's resources when the trials begin (a head with no GPU: one
    trial at a time) never asked for the GPU nodes. The autoscaling cluster itself runs under `-m slow`
    (tests/test_cluster.py `test_gpu_trials_make_the_autoscaler_add_gpu_nodes_run_side_by_side_there_and_idle_nodes_go`)."""
    from alignlab.platform.study.grid import concurrency

    for resources in ({"cpu": 0.5, "gpu": 0.5}, {"cpu": 1}, {"cpu": 0.5, "gpu": 0.5, "resources": {"TPU": 1}}):
        assert concurrency(resources, None) is None
        assert concurrency(resources, 3) == 3
