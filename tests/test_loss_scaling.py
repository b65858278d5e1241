"""`PretrainConfig.loss_scaling`: each objective's loss divided by log(its number of classes) (MUPPET §3.2)."""
from __future__ import annotations

import dataclasses
import math

import pytest

from tiny_model import batches, tiny_tokenizer

from alignlab.platform.config import pretrain_from_dict, to_dict
from alignlab.platform.encoder.registry import objective_config
from alignlab.platform.presets import Preset
from alignlab.platform.pretrain.models import model_id
from alignlab.platform.pretrain.pretrain import Pretrainer

WEIGHTS = {"mlm": 1.0, "nsp": 2.0, "whp": 0.5, "pad": 3.0}


def _cfg(scaling: str):
    objs = tuple(objective_config(n, weight=w) for n, w in WEIGHTS.items())
    return dataclasses.replace(Preset.named("smoke").pretrain, objectives=objs, loss_scaling=scaling, precision="fp32")


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tok"))


def test_objectives_declare_their_number_of_classes(tok):
    objs = {c.name: c.build(tok) for c in _cfg("none").objectives}
    assert {n: o.num_classes for n, o in objs.items()} == {"mlm": tok.vocab_size, "nsp": 2, "whp": 4, "pad": 2}


def test_the_log_classes_total_is_the_hand_computed_sum_on_a_fixed_batch(tok):
    batch = batches(tok, batch_size=16, num=1)[0]
    classes = {"mlm": tok.vocab_size, "nsp": 2, "whp": 4, "pad": 2}  # written out, not asked of the objectives
    totals = {}
    for scaling in ("none", "log_classes"):
        tr = Pretrainer(_cfg(scaling), tok)  # same seed: same weights, and the same batch from the same step
        m = tr.train_step(tr.collate(batch, step=0))
        losses = {n: m[f"train/{n}/loss"] for n in WEIGHTS}
        assert all(v > 0 for v in losses.values())
        if scaling == "none":
            want = sum(WEIGHTS[n] * losses[n] for n in WEIGHTS)
        else:
            want = sum(WEIGHTS[n] * losses[n] / math.log(classes[n]) for n in WEIGHTS)
        assert m["train/loss"] == pytest.approx(want, rel=1e-5)
        totals[scaling] = m["train/loss"]
    assert totals["log_classes"] < 0.8 * totals["none"]


def test_loss_scaling_is_validated_round_trips_and_is_part_of_the_model_id():
    with pytest.raises(ValueError, match="loss_scaling"):
        _cfg("sqrt")
    scaled = _cfg("log_classes")
    assert pretrain_from_dict(to_dict(scaled)) == scaled
    plain = _cfg("none")
    assert model_id("c", plain) != model_id("c", scaled)
