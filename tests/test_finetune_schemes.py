"""The finetuning schemes on a pre-LN encoder: the schemes that train the Transformer layers train its final
LayerNorm (the top of the encoder, what the heads read), and no scheme trains a fixed sinusoidal position table."""
from __future__ import annotations

import pytest
import torch

from alignlab.platform.config import SCHEMES
from alignlab.platform.encoder.model_config import ModelConfig
from alignlab.platform.encoder.model import AlignModel
from alignlab.platform.fel.finetune_schemes import trainable_parameters
from alignlab.platform.tasks.task import head_for, task_names


def _model(norm: str, position: str) -> AlignModel:
    cfg = ModelConfig(hidden=32, num_layers=2, head_dim=16, ffn=64, max_len=32, norm=norm, position=position)
    model = AlignModel(cfg, vocab_size=50)
    for t in task_names():
        model.heads[t] = head_for(t, cfg.hidden, 0.1)
    return model


def _trained(model: AlignModel, scheme: str) -> set[int]:
    return {id(p) for p in trainable_parameters(model, scheme, tuple(task_names())[:1])}


@pytest.mark.parametrize("scheme", ["pred+trm", "mt:pred+trm", "pred+trm+emb"])
def test_schemes_that_train_the_layers_train_a_pre_ln_models_final_layernorm(scheme):
    model = _model("pre", "learned")
    trained = _trained(model, scheme)
    final = list(model.encoder.final_ln.parameters())
    assert final and all(id(p) in trained and p.requires_grad for p in final)


def test_pred_trains_only_the_head_so_the_cached_encoder_outputs_stay_valid():
    model = _model("pre", "learned")
    trained = _trained(model, "pred")
    assert not any(id(p) in trained for p in model.encoder.parameters())


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_no_scheme_unfreezes_a_sinusoidal_position_table(scheme, norm):
    model = _model(norm, "sinusoidal")
    pos = model.encoder.pos.weight
    assert id(pos) not in _trained(model, scheme) and not pos.requires_grad


def test_a_learned_position_table_is_trained_with_the_embeddings():
    model = _model("pre", "learned")
    assert id(model.encoder.pos.weight) in _trained(model, "pred+trm+emb")
    assert id(model.encoder.pos.weight) not in _trained(model, "pred+trm")


def test_a_step_of_pred_trm_emb_moves_the_final_layernorm_and_leaves_the_sinusoids_alone():
    torch.manual_seed(0)
    model = _model("pre", "sinusoidal")
    task = task_names()[0]
    params = trainable_parameters(model, "pred+trm+emb", (task,))
    pos, final = model.encoder.pos.weight.detach().clone(), model.encoder.final_ln.weight.detach().clone()
    opt = torch.optim.Adam(params, lr=1e-2)
    ids = torch.randint(5, 50, (4, 12))
    h = model.encoder(ids, torch.zeros_like(ids))
    loss = h.pow(2).mean() + sum(p.sum() for p in model.heads[task].parameters()) * 0
    loss.backward()
    opt.step()
    assert torch.equal(model.encoder.pos.weight, pos), "the sinusoidal table is a formula, never trained"
    assert not torch.equal(model.encoder.final_ln.weight, final)
