"""Configs are frozen, validated with messages a user can act on, round-trip through dicts, and hash stably."""
import dataclasses

import pytest

from alignlab.platform import config as C
from alignlab.platform.encoder.model_config import ModelConfig
from alignlab.platform.corpus.corpus_config import CorpusConfig
from alignlab.platform.fel.finetune_config import FinetuneConfig
from alignlab.platform.presets import Preset


def test_a_bad_preset_name_is_a_value_error_naming_the_choices():
    with pytest.raises(ValueError, match=r"unknown preset 'huge'.*smoke, mini, paper"):
        C.check_preset("huge")


@pytest.mark.parametrize("field", ["hidden", "num_layers", "ffn", "head_dim"])
def test_a_negative_model_size_is_a_value_error_naming_the_field(field):
    with pytest.raises(ValueError, match=f"ModelConfig.{field} must be > 0"):
        ModelConfig(**{field: -1})


def test_hidden_must_be_a_multiple_of_the_head_size():
    with pytest.raises(ValueError, match="multiple of head_dim"):
        ModelConfig(hidden=100, head_dim=64)


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        C.MODEL_SIZES["768x3"].hidden = 1


def test_the_paper_sizes_are_the_nine_of_table_1():
    for h in (256, 512, 768):
        for n in (1, 2, 3):
            m = C.MODEL_SIZES[f"{h}x{n}"]
            assert (m.hidden, m.num_layers, m.head_dim, m.ffn, m.max_len, m.dropout) == (h, n, 64, 3072, 128, 0.1)


def test_the_paper_preset_matches_section_3_3():
    p = Preset.named("paper").pretrain
    assert (p.batch_size, p.lr, p.model.max_len) == (256, 1e-4, 128)
    # batch_size is the global batch: one GPU worker trains all 256 rows of a step (a study trains its models one per
    # GPU side by side, study/layout.py), and the run sees the paper's 500M examples whatever the number of workers
    # (it used to be 4 x 256 per step with 4 workers: 2B examples).
    assert (p.num_workers, p.worker_batch_size) == (1, 256)
    assert dataclasses.replace(p, num_workers=4).worker_batch_size == 64
    assert p.max_steps * p.batch_size == pytest.approx(500_000_000, rel=0.01)
    assert dataclasses.replace(p, num_workers=8).max_steps * p.batch_size == pytest.approx(500_000_000, rel=0.01)
    f = Preset.named("paper").finetune
    assert (f.batch_size, f.dropout, f.lr, f.budget, f.scheme) == (64, 0.1, 1e-4, 200, "pred")


def test_objective_names_expand_to_configs_and_unknown_names_are_rejected():
    cfg = dataclasses.replace(Preset.named("smoke").pretrain, objectives="mlm,nsp,whp,pad")
    assert cfg.objective_names == ("mlm", "nsp", "whp", "pad")
    with pytest.raises(ValueError, match="unknown objective 'sop'.*registered objectives are"):
        dataclasses.replace(cfg, objectives="mlm,sop")
    with pytest.raises(ValueError, match="listed twice"):
        dataclasses.replace(cfg, objectives="mlm,mlm")


def test_pretrain_config_round_trips_through_a_dict_and_keeps_its_hash():
    cfg = dataclasses.replace(Preset.named("mini").pretrain, objectives="mlm,pad")
    back = C.pretrain_from_dict(C.to_dict(cfg))
    assert back == cfg
    assert C.config_hash(back) == C.config_hash(cfg)
    assert C.config_hash(dataclasses.replace(cfg, seed=1)) != C.config_hash(cfg)


def test_finetune_config_rejects_unknown_schemes_and_selection_modes():
    with pytest.raises(ValueError, match="scheme must be one of"):
        FinetuneConfig(scheme="all")
    with pytest.raises(ValueError, match="selection must be one of"):
        FinetuneConfig(selection="test")


def test_a_non_bundled_corpus_needs_paths():
    with pytest.raises(ValueError, match="needs at least one input path"):
        CorpusConfig(source="web")


def test_the_encoder_init_is_berts_by_default_and_fan_in_on_request():
    import torch

    from alignlab.platform.encoder.model import Encoder

    torch.manual_seed(0)
    bert = Encoder(C.MODEL_SIZES["128x2"], 1000)
    fan = Encoder(dataclasses.replace(C.MODEL_SIZES["128x2"], init="fan_in"), 1000)
    assert bert.layers[0].qkv.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert fan.layers[0].qkv.weight.std().item() == pytest.approx(128**-0.5, rel=0.05)
    assert fan.layers[0].ffn_out.weight.std().item() == pytest.approx(512**-0.5, rel=0.05)
    assert fan.tok.weight.std().item() == pytest.approx(128**-0.5, rel=0.05)
    assert float(fan.layers[0].qkv.bias.detach().abs().max()) == 0.0
    with pytest.raises(ValueError, match="init"):
        ModelConfig(init="xavier")


# ---------------------------------------------------------------- model identity

# Every PretrainConfig field with a different value of it: the id must change for each, except the runtime-only
# ones. A new field must be added here, so it cannot join the config without a decision on its identity.
_OTHER_VALUE = {
    "model": C.MODEL_SIZES["128x2"], "objectives": "mlm,nsp", "batch_size": 8, "lr": 5e-4, "warmup_steps": 3,
    "decay": "linear", "max_steps": 13, "grad_clip": 0.5, "layout_fraction": 0.5, "subword_regularization_alpha": 0.1,
    "num_workers": 2, "precision": "fp32", "seed": 1, "loss_scaling": "log_classes",
    "adam_betas": (0.9, 0.98), "adam_eps": 1e-6, "weight_decay": 0.01, "seq_len": 32, "curriculum_fraction": 0.5,
    "corpus_embeddings": 0.1, "compile": True, "use_gpu": True,
    # set together: each is changed with its companion at a fixed value (see _COMPANION)
    "short_seq_len": 32, "short_seq_fraction": 0.5, "domain_sources": ("web",), "domain_fraction": 0.5,
    # runtime-only
    "checkpoint_every": 7, "checkpoint_every_minutes": 20.0, "log_every": 3, "eval_batches": 9, "cpus_per_worker": 2.0,
    "threads_per_worker": 2,
    "prefetch_batches": 5, "collate_workers": 2, "bucket_batches": 4, "loss_chunk_rows": 64,
    "gpus_per_worker": 0.5, "cuda_graphs": True,
}


# Fields valid only together: the id is compared between two configs that both set the companion.
_COMPANION = {"short_seq_len": {"short_seq_len": 16, "short_seq_fraction": 0.25},
              "short_seq_fraction": {"short_seq_len": 32, "short_seq_fraction": 0.25},
              "domain_sources": {"domain_sources": ("software",), "domain_fraction": 0.25},
              "domain_fraction": {"domain_sources": ("software",), "domain_fraction": 0.25},
              "cuda_graphs": {"compile": True}}


def _smoke(**changes):
    return dataclasses.replace(Preset.named("smoke").pretrain, **{"precision": "bf16", **changes})


def test_every_field_that_changes_what_a_model_learns_is_in_its_id_and_no_runtime_field_is():
    from alignlab.platform.pretrain.models import RUNTIME_FIELDS, model_id

    assert set(_OTHER_VALUE) == {f.name for f in dataclasses.fields(C.PretrainConfig)}
    base = model_id("corpus-x", _smoke())
    for name, value in _OTHER_VALUE.items():
        companion = _COMPANION.get(name, {})
        before = model_id("corpus-x", _smoke(**companion)) if companion else base
        changed = model_id("corpus-x", _smoke(**{**companion, name: value}))
        assert (changed == before) == (name in RUNTIME_FIELDS), name
    assert model_id("corpus-y", _smoke()) != base


def test_configs_differing_only_in_workers_are_two_models_and_only_in_runtime_fields_one():
    from alignlab.platform.pretrain.models import model_id

    # 1 x 16 and 2 x 16 are global batches of 16 and 32: two models.
    one, two = _smoke(num_workers=1), _smoke(num_workers=2)
    assert model_id("c", one) != model_id("c", two)
    # Checkpoint and report frequency, evaluation size, a worker's CPUs and threads: the same model.
    assert model_id("c", _smoke(num_workers=1, checkpoint_every=50, log_every=1, eval_batches=3, cpus_per_worker=2.0,
                                threads_per_worker=2)) == model_id("c", one)


def test_auto_precision_names_the_model_of_the_precision_it_resolves_to(monkeypatch):
    from alignlab.platform.pretrain.models import model_id
    from alignlab.platform.pretrain.pretrain import with_resolved_precision as resolved
    from alignlab.platform.runtime import precision

    auto = dataclasses.replace(Preset.named("smoke").pretrain, precision="auto")
    bf16, fp32 = (model_id("c", dataclasses.replace(auto, precision=p)) for p in ("bf16", "fp32"))
    assert bf16 != fp32
    assert model_id("c", auto) == model_id("c", resolved(auto))
    monkeypatch.setattr(precision, "cpu_prefers_bf16", lambda: True)
    assert resolved(auto).precision == "bf16" and model_id("c", auto) == bf16
    monkeypatch.setattr(precision, "cpu_prefers_bf16", lambda: False)
    assert resolved(auto).precision == "fp32" and model_id("c", auto) == fp32
    # GPU workers train in bf16 under "auto", whatever the driver's CPU; explicit precisions stay as asked. The
    # device kind is in the id: a GPU's bf16 (or fp32) digits are not a CPU's.
    gpu = dataclasses.replace(auto, use_gpu=True)
    assert resolved(gpu).precision == "bf16" and model_id("c", gpu) != bf16
    assert model_id("c", gpu) == model_id("c", dataclasses.replace(gpu, precision="bf16"))
    assert resolved(dataclasses.replace(auto, precision="fp32", use_gpu=True)).precision == "fp32"


def test_alignlab_pretrain_trains_at_the_precision_its_flag_names(tmp_path, monkeypatch):
    """`alignlab pretrain --precision fp32` hands the trainer an fp32 config; without the flag, the preset's."""
    import json

    from alignlab.platform import cli
    from alignlab.platform.corpus import corpus
    from alignlab.platform.pretrain import driver as pretrain_ray
    from alignlab.platform.runtime import ray_env

    asked = []

    def fake_pretrain(cdir, cfg, root):  # the engine itself is tested in test_pretrain.py; this is the flag's wiring
        asked.append(cfg.precision)
        (tmp_path / "m" / "final").mkdir(parents=True, exist_ok=True)
        (tmp_path / "m" / "final" / "eval.json").write_text(json.dumps({}))
        return tmp_path / "m"

    monkeypatch.setattr(pretrain_ray, "pretrain", fake_pretrain)
    monkeypatch.setattr(pretrain_ray, "check_pretrain_resources", lambda cfg: None)
    monkeypatch.setattr(ray_env, "ensure_ray", lambda *a, **k: None)
    monkeypatch.setattr(corpus, "build_corpus", lambda ccfg, root, **kw: tmp_path / "corpus")
    for flags in (["--precision", "fp32"], ["--precision", "bf16"], []):
        assert cli.main(["pretrain", "--preset", "smoke", "--storage", str(tmp_path / "st"), *flags]) == 0
    assert asked == ["fp32", "bf16", Preset.named("smoke").pretrain.precision]


def test_the_cost_table_of_the_cluster_page_follows_from_the_paper_presets_global_batch():
    """docs/cluster.md, "What the presets cost": examples = max_steps x the global batch (500M, not 500M x workers), FLOPs
    by the one count `alignlab plan` uses (`cost.expected_run_flops`: full rows, MLM's decoder on its predicted
    positions at the paper corpus's 111K vocabulary), hours at the assumed 50 TFLOP/s of an A10G."""
    import re
    from pathlib import Path

    from alignlab.platform.pretrain.cost import expected_run_flops

    repo = Path(__file__).resolve().parents[1]
    readme = (repo / "docs" / "cluster.md").read_text()
    p = Preset.named("paper").pretrain
    flops = {s: expected_run_flops(dataclasses.replace(p, model=C.MODEL_SIZES[s]), 111_000)
             for s in ("256x1", "512x3", "768x3")}
    hours = {s: f / 50e12 / 3600 for s, f in flops.items()}
    row = re.search(r"\| one 768x3 model \| `paper` \| 500M examples \(([\d.e]+) FLOP\) \| ≈ (\d+) A10G-hours", readme)
    assert row, "the cost table's 768x3 row is missing"
    assert p.max_steps * p.batch_size == 500_000_000
    assert float(row.group(1)) == pytest.approx(flops["768x3"], rel=0.05)
    assert int(row.group(2)) == pytest.approx(hours["768x3"], abs=1)
    assert f"256x1 {round(hours['256x1'])}, 512x3 {round(hours['512x3'])}, 768x3 {round(hours['768x3'])} each" in readme
    assert "≈ 220 A10G-hours" in readme and round(3 * hours["768x3"], -1) == 220
