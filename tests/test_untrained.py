"""The untrained model (`--objectives none`, a study's `untrained` column): the same architecture and seed trained
for zero steps, a model id like any other, written in seconds without Ray Train, and the positive control every
study can add (`--with-untrained`; the objective ablation has it by default)."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from alignlab.platform.cli import main
from alignlab.platform.config import PretrainConfig, untrained
from alignlab.platform.presets import Preset
from alignlab.platform.pretrain.models import model_id
from alignlab.platform.study.spec import UNTRAINED_COL, with_untrained


def test_every_recipe_of_one_architecture_and_seed_shares_one_untrained_model_id():
    mini = Preset.named("mini").pretrain
    other = dataclasses.replace(mini, lr=1e-4, max_steps=10, objectives=("mlm", "nsp"), precision="bf16")
    assert untrained(mini) == untrained(other)
    mid = model_id("c0rpus", untrained(mini))
    assert mid.startswith("128x2-untrained-") and mid == model_id("c0rpus", untrained(other))
    assert model_id("c0rpus", untrained(dataclasses.replace(mini, seed=1))) != mid, "another seed, other weights"
    with pytest.raises(ValueError, match="max_steps must be >= 0"):
        PretrainConfig(max_steps=-1)


@pytest.mark.ray
def test_alignlab_pretrain_objectives_none_writes_the_initial_weights_without_training(smoke_corpus, storage_root,
                                                                                          capsys):
    argv = ["pretrain", "--preset", "smoke", "--objectives", "none", "--corpus", str(smoke_corpus),
            "--storage", str(storage_root)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    mid = next(line for line in out.splitlines() if line.startswith("Model: "))[len("Model: "):]
    assert "-untrained-" in mid
    final = storage_root / "models" / mid / "final"
    ev = json.loads((final / "eval.json").read_text())
    assert ev["step"] == 0 and ev["throughput"]["device_hours"] == 0.0 and "ray" not in {
        p.name for p in (storage_root / "models" / mid).iterdir()}, "no Train run: nothing was trained"
    # The weights are exactly what a Train worker builds first with that seed.
    from alignlab.platform.encoder.tokenizer import Tokenizer
    from alignlab.platform.pretrain.pretrain import Pretrainer

    cfg = untrained(Preset.named("smoke").pretrain)
    fresh = Pretrainer(cfg, Tokenizer(smoke_corpus / "tokenizer.model")).model.state_dict()
    saved = torch.load(final / "model.pt", weights_only=True)
    assert saved.keys() == fresh.keys() and all(torch.equal(saved[k], fresh[k]) for k in saved)
    assert main(argv) == 0 and mid in capsys.readouterr().out, "asked again: the same model, found"


def test_with_untrained_adds_a_control_column_of_the_baseline_architecture_to_every_row():
    from alignlab.studies import data_budget

    study = data_budget.build("smoke")
    ctl = with_untrained(study)
    assert ctl.control_col == UNTRAINED_COL and ctl.name == study.name
    rows = {c.row for c in study.calcs}
    assert {c.row for c in ctl.calcs if c.col == UNTRAINED_COL} == rows
    models = {m.key: m.pretrain for m in ctl.models}
    base_model = next(c.model for c in study.calcs if c.col == study.baseline_col)
    assert models[UNTRAINED_COL] == untrained(models[base_model])
    for row in rows:  # the control runs the row's own budget, folds and seeds, heads discarded
        ref = sorted((c.finetune.budget, c.finetune.fold, c.finetune.seed) for c in study.calcs
                     if c.row == row and c.col == study.baseline_col)
        mine = [c for c in ctl.calcs if c.row == row and c.col == UNTRAINED_COL]
        assert sorted((c.finetune.budget, c.finetune.fold, c.finetune.seed) for c in mine) == ref
        assert not any(c.finetune.keep_head for c in mine)
    assert with_untrained(ctl) is ctl
