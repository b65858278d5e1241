"""Configs are frozen, validated with messages a user can act on, round-trip through dicts, and hash stably."""
import dataclasses

import pytest

from alignlab.platform import config as C


def test_a_bad_preset_name_is_a_value_error_naming_the_choices():
    with pytest.raises(ValueError, match=r"unknown preset 'huge'.*smoke, mini, paper"):
        C.check_preset("huge")


@pytest.mark.parametrize("field", ["hidden", "num_layers", "ffn", "head_dim"])
def test_a_negative_model_size_is_a_value_error_naming_the_field(field):
    with pytest.raises(ValueError, match=f"ModelConfig.{field} must be > 0"):
        C.ModelConfig(**{field: -1})


def test_hidden_must_be_a_multiple_of_the_head_size():
    with pytest.raises(ValueError, match="multiple of head_dim"):
        C.ModelConfig(hidden=100, head_dim=64)


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        C.MODEL_SIZES["768x3"].hidden = 1


def test_the_paper_sizes_are_the_nine_of_table_1():
    for h in (256, 512, 768):
        for n in (1, 2, 3):
            m = C.MODEL_SIZES[f"{h}x{n}"]
            assert (m.hidden, m.num_layers, m.head_dim, m.ffn, m.max_len, m.dropout) == (h, n, 64, 3072, 128, 0.1)


def test_the_paper_preset_matches_section_3_3():
    p = C.PRETRAIN_PRESETS["paper"]
    assert (p.batch_size, p.lr, p.model.max_len) == (256, 1e-4, 128)
    assert p.max_steps * p.batch_size == pytest.approx(500_000_000, rel=0.01)
    f = C.FINETUNE_PRESETS["paper"]
    assert (f.batch_size, f.dropout, f.lr, f.budget, f.scheme) == (64, 0.1, 1e-4, 200, "pred")


def test_objective_names_expand_to_configs_and_unknown_names_are_rejected():
    cfg = dataclasses.replace(C.PRETRAIN_PRESETS["smoke"], objectives="mlm,nsp,whp,pad")
    assert cfg.objective_names == ("mlm", "nsp", "whp", "pad")
    with pytest.raises(ValueError, match="unknown objective 'sop'.*registered objectives are"):
        dataclasses.replace(cfg, objectives="mlm,sop")
    with pytest.raises(ValueError, match="listed twice"):
        dataclasses.replace(cfg, objectives="mlm,mlm")


def test_pretrain_config_round_trips_through_a_dict_and_keeps_its_hash():
    cfg = dataclasses.replace(C.PRETRAIN_PRESETS["mini"], objectives="mlm,pad")
    back = C.pretrain_from_dict(C.to_dict(cfg))
    assert back == cfg
    assert C.config_hash(back) == C.config_hash(cfg)
    assert C.config_hash(dataclasses.replace(cfg, seed=1)) != C.config_hash(cfg)


def test_finetune_config_rejects_unknown_schemes_and_selection_modes():
    with pytest.raises(ValueError, match="scheme must be one of"):
        C.FinetuneConfig(scheme="all")
    with pytest.raises(ValueError, match="selection must be one of"):
        C.FinetuneConfig(selection="test")


def test_a_non_bundled_corpus_needs_paths():
    with pytest.raises(ValueError, match="needs at least one input path"):
        C.CorpusConfig(source="web")


def test_the_encoder_init_is_berts_by_default_and_fan_in_on_request():
    import torch

    from alignlab.platform.model import Encoder

    torch.manual_seed(0)
    bert = Encoder(C.MODEL_SIZES["128x2"], 1000)
    fan = Encoder(dataclasses.replace(C.MODEL_SIZES["128x2"], init="fan_in"), 1000)
    assert bert.layers[0].qkv.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert fan.layers[0].qkv.weight.std().item() == pytest.approx(128**-0.5, rel=0.05)
    assert fan.layers[0].ffn_out.weight.std().item() == pytest.approx(512**-0.5, rel=0.05)
    assert fan.tok.weight.std().item() == pytest.approx(128**-0.5, rel=0.05)
    assert float(fan.layers[0].qkv.bias.detach().abs().max()) == 0.0
    with pytest.raises(ValueError, match="init"):
        C.ModelConfig(init="xavier")
