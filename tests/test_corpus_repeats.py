"""Issue #56: how many times pretraining would repeat its corpus, shown by `alignlab plan` and refused up front
beyond `MAX_CORPUS_REPEATS` (unless --allow-corpus-repeats): the bundled `smoke` and `mini` presets pass with a
wide margin, `paper` on the bundled corpus is refused before Ray starts or anything is built."""
from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from alignlab.platform.corpus.corpus_repeats import (MAX_CORPUS_REPEATS, check_corpus_repeats, corpus_repeats,
                                                   estimated_train_rows)

STUDIES = Path(__file__).resolve().parent.parent / "studies"


def _ablation(preset: str):
    from alignlab.platform.config import check_preset

    spec = importlib.util.spec_from_file_location("repeats_objective_ablation", STUDIES / "objective_ablation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build(check_preset(preset))


def _worst_repeats(study) -> float:
    rows = estimated_train_rows(study.corpus)
    return max(corpus_repeats(m.pretrain, rows) for m in study.models if m.pretrain.max_steps)


def test_the_row_estimate_of_the_bundled_corpus_is_within_two_percent_of_its_measured_build():
    from alignlab.platform.presets import Preset

    # benchmarks/results/corpus_throughput.json: the bundled corpus at the mini preset's max_len, 59,482 train rows.
    bundled = dataclasses.replace(Preset.named("mini").corpus, sources=(), source="bundled")
    assert bundled.source == "bundled"
    assert estimated_train_rows(bundled) == pytest.approx(59_482, rel=0.02)


def test_the_smoke_and_mini_presets_repeat_their_corpus_far_less_than_the_refusal_threshold():
    smoke, mini = _worst_repeats(_ablation("smoke")), _worst_repeats(_ablation("mini"))
    assert smoke < 0.5 and mini < 1.5, (smoke, mini)
    assert max(smoke, mini) * 10 < MAX_CORPUS_REPEATS  # a margin of more than ten


def test_a_study_of_the_paper_preset_on_the_bundled_corpus_is_refused_in_one_line_before_ray_starts(tmp_path):
    import ray

    from alignlab.platform.study.run import run_study

    study = _ablation("paper")
    assert _worst_repeats(study) > 1000
    started = ray.is_initialized()
    with pytest.raises(ValueError) as e:
        run_study(study, tmp_path / "root", progress=False)
    msg = str(e.value)
    assert "\n" not in msg and "would repeat corpus bundled more than 20 times" in msg
    assert "--source wikidump --path" in msg and "--preset mini" in msg and "--allow-corpus-repeats" in msg
    assert ray.is_initialized() == started and not (tmp_path / "root" / "corpus").exists()


def test_the_study_command_refuses_the_paper_preset_naming_the_fix(tmp_path, capsys):
    from alignlab.platform.study.run import study_main

    with pytest.raises(SystemExit) as e:
        study_main(_build_ablation(), ["--preset", "paper", "--storage", str(tmp_path / "root")])
    assert e.value.code != 0
    err = capsys.readouterr().err
    assert "would repeat corpus bundled more than 20 times" in err and "--allow-corpus-repeats" in err


def _build_ablation():
    spec = importlib.util.spec_from_file_location("repeats_objective_ablation2", STUDIES / "objective_ablation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build


def test_models_under_the_threshold_pass_and_over_it_are_refused_naming_the_worst():
    from alignlab.platform.presets import Preset

    cfg = dataclasses.replace(Preset.named("smoke").pretrain, max_steps=100, batch_size=10)  # 1,000 examples
    check_corpus_repeats({"a": cfg}, 1000 // MAX_CORPUS_REPEATS, "c-1", estimated=False)  # exactly at it: passes
    with pytest.raises(ValueError, match=r"^1 model would repeat corpus c-1 more than 20 times \('a': 100 steps x "
                                         r"batch 10 = 1,000 examples over 49 training rows, 20 passes\)"):
        check_corpus_repeats({"a": cfg}, 49, "c-1", estimated=False)


def test_the_plan_shows_each_models_passes_over_its_corpus_and_marks_the_refused(tmp_path, capsys):
    from alignlab.platform.cli import main

    for preset, refused in (("mini", False), ("paper", True)):
        assert main(["plan", "objective_ablation", "--preset", preset, "--storage", str(tmp_path / "root"),
                     "--device", "H100"]) == 0
        out = capsys.readouterr().out
        assert "(estimated from its sources' words); a model that repeats them more than 20 times is refused" in out
        assert out.count("passes over the corpus") == 3, out  # the untrained column trains on nothing
        assert (out.count("(refused: over 20)") == 3) == refused, out


def test_alignlab_pretrain_refuses_a_run_that_would_repeat_the_preset_corpus_before_building_it(tmp_path, capsys,
                                                                                                monkeypatch):
    from alignlab.platform import cli
    from alignlab.platform.pretrain import driver
    from alignlab.platform.runtime import ray_env

    monkeypatch.setattr(driver, "check_pretrain_resources", lambda cfg: None)  # the refusal, not this machine's CPUs
    monkeypatch.setattr(ray_env, "ensure_ray", lambda *a, **k: None)
    monkeypatch.setattr("alignlab.platform.runtime.resources.check_root_on_every_node", lambda root: None)
    # 30,000 steps x 16 = 480,000 smoke examples over its ~1,400 rows: ~350 passes.
    assert cli.main(["pretrain", "--preset", "smoke", "--max-steps", "30000", "--storage", str(tmp_path / "st")]) == 2
    err = capsys.readouterr().err
    assert "would repeat corpus bundled more than 20 times" in err and "--allow-corpus-repeats" in err
    assert not (tmp_path / "st" / "corpus").exists()
