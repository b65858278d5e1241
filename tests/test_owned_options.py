"""Options the paper's objectives and tasks own live with them, not in the engine's configs (issue #44): AD's
acronym input form is a task option, PAD's share of rows is its own objective option. Their moves keep every
id: the ids below were made by the code before the move, and must still name the same models and calculations."""
from __future__ import annotations

import dataclasses

import pytest

from alignlab.platform.config import to_dict
from alignlab.platform.encoder.registry import default_set, objectives_like
from alignlab.platform.fel.finetune import finetuned_id
from alignlab.platform.fel.finetune_config import FinetuneConfig
from alignlab.platform.fel.finetune_config import finetune_from_dict
from alignlab.platform.presets import Preset
from alignlab.platform.pretrain.models import model_id


def test_calculation_ids_made_before_the_task_options_moved_still_name_the_same_calculations():
    smoke = Preset.named("smoke").finetune
    assert finetuned_id("m", dataclasses.replace(smoke, task="ct")) == "ct-e2914289cbb3"
    assert finetuned_id("m", dataclasses.replace(smoke, task="ad")) == "ad-ab6bd1c43fb3"
    assert finetuned_id("m", dataclasses.replace(Preset.named("mini").finetune, task="ad")) == "ad-3efb68e52ef5"


def test_model_ids_made_before_the_layout_fraction_moved_still_name_the_same_models():
    # Pinned in bf16 ("auto" resolves per CPU); the pins move with PRETRAIN_CODE_VERSION, not with the fraction's key.
    # The mini pin moved once more when its [CLS] became exempt from the distance bias (issue #65).
    for preset, want in (("smoke", "32x1-mlm+nsp+whp+pad-fec4a1d9e1cb"), ("mini", "128x2-mlm+nsp+whp+pad-d90cd9fc7184")):
        base = dataclasses.replace(Preset.named(preset).pretrain, precision="bf16")
        assert model_id("corpusX", dataclasses.replace(base, objectives=objectives_like(default_set(), base.objectives))) == want


def test_a_task_option_round_trips_through_the_config_dict_and_one_at_its_default_is_dropped():
    text = FinetuneConfig(task="ad", task_options=(("acronym_form", "text"),))
    assert to_dict(text)["acronym_form"] == "text" and "task_options" not in to_dict(text)
    assert finetune_from_dict(to_dict(text)) == text
    assert FinetuneConfig(task="ad", task_options={"acronym_form": "letters"}) == FinetuneConfig(task="ad")
    assert finetune_from_dict(to_dict(FinetuneConfig(task="ct"))) == FinetuneConfig(task="ct")


def test_an_option_no_task_declares_or_a_value_it_does_not_allow_is_refused_naming_the_declared_ones():
    with pytest.raises(ValueError, match="no registered task declares the option 'letters_form'.*acronym_form"):
        FinetuneConfig(task="ad", task_options=(("letters_form", "text"),))
    with pytest.raises(ValueError, match="acronym_form must be one of 'letters', 'text'"):
        FinetuneConfig(task="ad", task_options=(("acronym_form", "words"),))


def test_the_fel_command_line_keeps_a_task_options_flag_with_its_choices(tmp_path, capsys):
    from alignlab.platform.cli import main

    with pytest.raises(SystemExit):
        main(["fel", "--model", "nope", "--task", "ad", "--acronym-form", "words", "--storage", str(tmp_path)])
    assert "invalid choice: 'words' (choose from 'letters', 'text')" in capsys.readouterr().err
    assert main(["fel", "--model", "nope", "--task", "ad", "--acronym-form", "text", "--storage", str(tmp_path)]) == 2
    assert "not a finished pretrained model" in capsys.readouterr().err  # parsed: it got as far as the model


def test_the_layout_fraction_keeps_the_key_its_objective_declares_in_the_config_dict_and_round_trips():
    from alignlab.platform.config import pretrain_from_dict

    mini = Preset.named("mini").pretrain
    d = to_dict(mini)
    assert d["acronym_fraction"] == 0.5 and "layout_fraction" not in d  # PAD's layout_fraction_key
    assert pretrain_from_dict(d) == mini
