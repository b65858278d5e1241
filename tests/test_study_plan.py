"""`--dry-run` / `alignlab plan` (issue #42): before anything runs, a study's models and calculations, which exist,
and its estimated device-hours from measured throughput; and the throughput record a real smoke pretraining run
leaves in eval.json and TensorBoard, which the plan estimates from."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

STUDIES = Path(__file__).resolve().parent.parent / "studies"


def _build(name: str):
    spec = importlib.util.spec_from_file_location(f"plan_study_{name}", STUDIES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*")} if root.exists() else {}


def test_a_dry_run_on_an_empty_root_lists_every_model_and_calculation_as_to_make_and_writes_nothing(tmp_path, capsys):
    from alignlab.platform.study.run import study_main

    root = tmp_path / "root"
    assert study_main(_build("objective_ablation"), ["--preset", "smoke", "--storage", str(root), "--dry-run"]) is None
    out = capsys.readouterr().out
    assert not root.exists()
    assert "not built yet" in out and out.count("to train") == 3 and out.count("to write") == 1, "+ the untrained one"
    assert "FEL calculations: 16, of which 16 to run" in out and "estimated total: unknown" in out


@pytest.fixture(scope="module")
def trained(smoke_corpus, smoke_model, storage_root):
    """The smoke objective ablation's first model, pretrained for real (the session's `smoke_model`, conftest.py)
    and copied to the session's root, as a finished model found there. Its Train run folder stays behind: a
    finished model is never resumed."""
    import shutil

    from alignlab.platform.config import check_preset
    from alignlab.platform.corpus.corpus import load_manifest
    from alignlab.platform.pretrain.driver import pretrain
    from alignlab.platform.pretrain.models import model_id
    from alignlab.platform.study.spec import with_precision

    study = with_precision(_build("objective_ablation")(check_preset("smoke")), "auto")
    cfg = study.models[0].pretrain
    assert model_id(load_manifest(smoke_corpus)["corpus_id"], cfg) == smoke_model.name
    here = storage_root / "models" / smoke_model.name
    if not here.exists():
        shutil.copytree(smoke_model, here, ignore=shutil.ignore_patterns("ray"))
    assert pretrain(smoke_corpus, cfg, storage_root) == here  # found finished, not trained again
    return study, here


@pytest.mark.ray
def test_a_smoke_run_records_its_throughput_in_eval_json_and_tensorboard(trained):
    import json

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from alignlab.platform.runtime.throughput import encoder_flops_per_token

    study, mdir = trained
    tp = json.loads((mdir / "final" / "eval.json").read_text())["throughput"]
    for k in ("tokens_per_s", "samples_per_s", "mfu", "train_seconds", "device_hours", "flops", "flops_per_token",
              "num_devices", "device", "precision", "num_tokens", "num_samples"):
        assert k in tp, k
    assert tp["device"] == "cpu" and tp["mfu"] is None and tp["num_devices"] == 1
    assert tp["tokens_per_s"] > 0 and tp["num_samples"] > 0 and tp["device_hours"] > 0
    # The heads are counted beside the encoder: more than the encoder's own FLOPs per token.
    m = study.models[0].pretrain
    assert tp["flops_per_token"] > encoder_flops_per_token(m.model.hidden, m.model.num_layers, m.model.ffn,
                                                           m.seq_len or m.model.max_len)
    acc = EventAccumulator(str(mdir / "tensorboard"))
    acc.Reload()
    assert {"throughput/tokens_per_s", "throughput/samples_per_s", "throughput/device_hours"} <= set(acc.Tags()["scalars"])


@pytest.mark.ray
def test_a_dry_run_knows_the_trained_model_and_estimates_the_others_from_its_throughput(trained, smoke_corpus,
                                                                                         storage_root, tmp_path,
                                                                                         capsys):
    """At a root of its own that holds the task data, the corpus and the trained model only: the session's root
    holds whatever models earlier tests trained there, and the study's other models may be among them."""
    import shutil

    from alignlab.platform.study.plan import study_plan
    from alignlab.platform.study.run import study_main

    study, trained_dir = trained
    root = tmp_path / "root"
    shutil.copytree(storage_root / "tasks", root / "tasks")
    shutil.copytree(smoke_corpus, root / "corpus" / smoke_corpus.name)
    mdir = shutil.copytree(trained_dir, root / "models" / trained_dir.name)
    before = _snapshot(root)
    study_main(_build("objective_ablation"), ["--preset", "smoke", "--storage", str(root), "--dry-run"])
    out = capsys.readouterr().out
    assert _snapshot(root) == before  # nothing built, locked or written
    plan = study_plan(study, root, device="cpu")
    assert plan["corpus_id"] == smoke_corpus.name and plan["corpus_built"]
    first, *rest, untrained = plan["models"]
    assert first["model_id"] == mdir.name and first["exists"] and first["device_hours"] == 0
    assert all(not m["exists"] and m["device_hours"] > 0 and "storage root" in m["source"] for m in rest)
    assert untrained["steps"] == 0 and untrained["device_hours"] == 0 and "untrained" in untrained["source"]
    assert mdir.name in out and out.count("to train") == 2 and "FEL calculations: 16, of which 16 to run" in out


def test_alignlab_plan_runs_a_study_scripts_dry_run(tmp_path, capsys):
    from alignlab.platform.cli import main

    root = tmp_path / "root"
    assert main(["plan", str(STUDIES / "model_size.py"), "--preset", "smoke", "--storage", str(root),
                 "--device", "A10G"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Plan of study model_size-smoke on A10G (nothing has run):") and not root.exists()
    assert main(["plan", str(tmp_path / "nope.py")]) != 0
    assert "nope.py is not a study script" in capsys.readouterr().err


def test_the_paper_plan_on_an_h100_counts_each_models_flops_and_the_mfu_its_estimate_assumes(tmp_path, capsys):
    """The one FLOP count (docs/throughput.md#the-flop-count) in the plan: each model's FLOPs with full rows at the
    paper corpus's 111K vocabulary, and the MFU that the device-hours estimate implies on the device's peak."""
    from alignlab.platform.cli import main
    from alignlab.platform.config import check_preset
    from alignlab.platform.runtime.throughput import MEASURED
    from alignlab.platform.pretrain.cost import expected_run_flops
    from alignlab.platform.study.plan import study_plan
    from alignlab.platform.study.spec import with_precision

    study = with_precision(_build("objective_ablation")(check_preset("paper")), "auto")
    plan = study_plan(study, tmp_path / "root", device="H100")
    rate = MEASURED[("768x3", "NVIDIA H100 80GB HBM3")]
    trained = 0
    for m, declared in zip(plan["models"], study.models):
        assert m["flops"] == expected_run_flops(declared.pretrain, study.corpus.vocab_size)
        if not declared.pretrain.max_steps:  # an untrained control column: no pretraining, nothing to count
            assert m["flops"] == 0 and m["mfu"] is None
            continue
        trained += 1
        assert m["flops"] == pytest.approx(1.3e19, rel=0.02)  # 500M examples of ~26 GFLOP
        assert m["mfu"] == pytest.approx(m["flops"] / (declared.pretrain.max_steps * 256 / rate) / 989e12)
    assert trained == 3
    assert main(["plan", str(STUDIES / "objective_ablation.py"), "--preset", "paper", "--storage",
                 str(tmp_path / "root"), "--device", "H100"]) == 0
    out = capsys.readouterr().out
    assert out.count("1.3e+19 FLOP") == 3 and out.count(f"at {plan['models'][0]['mfu']:.1%} MFU") == 3, out
