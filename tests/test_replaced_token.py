"""RTD (ELECTRA's replaced-token detection) as one objective: labels, the model-time input edit, pretraining."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from tiny_model import batches, tiny_tokenizer

from alignlab.platform.encoder.model import AlignModel
from alignlab.platform.encoder.registry import resolve_objectives
from alignlab.platform.presets import Preset
from alignlab.platform.pretrain.pretrain import Pretrainer

ALL = "mlm,nsp,whp,pad,rtd"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tok"))


def _setup(tok, names=ALL):
    cfg = dataclasses.replace(Preset.named("smoke").pretrain, objectives=names, precision="fp32")
    tr = Pretrainer(cfg, tok)
    return tr, tr.objectives["rtd"], tr.model.heads["rtd"]


def test_replaced_positions_are_exactly_the_ones_labelled_1_and_a_sample_equal_to_the_original_is_0(tok):
    tr, rtd, head = _setup(tok)
    tr.model.eval()
    batch = tr.collate(batches(tok)[0], step=3)
    with torch.no_grad():
        out = rtd.edit_input(head, batch)
    before, after, labels = batch["input_ids"], out["input_ids"], out["rtd_labels"]
    changed = before != after
    assert changed.any(), "a random generator should replace some tokens"
    assert torch.equal(changed, labels == 1), "replaced positions must be exactly the ones labelled 1"
    pos = out["rtd_positions"]
    assert not (labels.view(-1)[pos] == -100).any()
    # Never a special token, padding, an acronym example, or a position MLM predicts.
    specials = torch.isin(before, torch.as_tensor(tok.special_ids))
    assert (labels[specials | ~batch["attention_mask"]] == -100).all()
    assert (labels[batch["row_format"] == 1] == -100).all()
    assert (labels[batch["input_locked"]] == -100).all() and batch["input_locked"].any()
    assert not torch.isin(after.view(-1)[pos], torch.as_tensor(tok.special_ids)).any()
    # About mask_prob of the candidates are drawn.
    assert 0.08 < pos.numel() / int((labels != -100).sum()) < 0.25
    # The same step draws the same corruption (resumable); a generator sure of the original replaces nothing there.
    with torch.no_grad():
        again = rtd.edit_input(head, tr.collate(batches(tok)[0], step=3))
    assert torch.equal(again["input_ids"], after)
    orig = out["rtd_gen_labels"]
    x = int(orig[0])  # a generator that always samples the token at the first drawn position
    head.generator.logits = lambda h: torch.full((h.shape[0], tok.vocab_size), -30.0).index_fill_(1, torch.tensor([x]), 30.0)
    with torch.no_grad():
        forced = rtd.edit_input(head, batch)
    lab = forced["rtd_labels"].view(-1)[pos]
    assert torch.equal(lab, (orig != x).long())
    assert lab[0] == 0 and (forced["input_ids"].view(-1)[pos] == x).all()
    assert torch.equal(forced["input_ids"] != before, forced["rtd_labels"] == 1)


def test_rtd_trains_with_every_other_objective_and_its_generator_and_discriminator_both_learn(tok):
    tr, rtd, head = _setup(tok)
    assert rtd.num_classes == 2 and rtd.config.discriminator_weight == 50.0
    g = head.generator
    assert g.proj.out_features == tr.cfg.model.hidden // 4  # a quarter of the encoder's width by default
    b = tr.collate(batches(tok)[0], step=0)
    gen_before = g.layers[0].qkv.weight.detach().clone()
    disc_before = head.discriminator.out.weight.detach().clone()
    m = tr.train_step(b)
    assert all(f"train/{n}/loss" in m for n in ALL.split(","))
    assert not torch.equal(gen_before, g.layers[0].qkv.weight) and not torch.equal(disc_before, head.discriminator.out.weight)
    ev = tr.evaluate(batches(tok)[1:3], max_batches=2)
    assert 0 <= ev["eval/rtd/accuracy"] <= 1 and 0 <= ev["eval/rtd/generator_accuracy"] <= 1
    assert 0 < ev["eval/rtd/replaced_fraction"] < 0.3


def test_rtd_alone_and_an_untied_generator_of_a_chosen_width(tok):
    from alignlab.platform.encoder.registry import objective_config

    cfg = dataclasses.replace(Preset.named("smoke").pretrain, precision="fp32",
                              objectives=(objective_config("rtd", generator_hidden=16, tie_embeddings=False),))
    tr = Pretrainer(cfg, tok)
    head = tr.model.heads["rtd"]
    assert head.generator.enc.tok is not tr.model.encoder.tok and head.generator.enc.cfg.hidden == 16
    first = tr.train_step(tr.collate(batches(tok)[0], step=0))["train/loss"]
    assert first > 0
    with pytest.raises(ValueError, match="rtd.mask_prob"):
        objective_config("rtd", mask_prob=0)


def test_objectives_accepts_rtd_in_the_cli_and_in_studies():
    from alignlab.platform.study.presets import sized_pretrain

    assert [c.name for c in resolve_objectives(ALL)] == ALL.split(",")
    assert sized_pretrain("smoke", 32, 1, ALL).objective_names == tuple(ALL.split(","))


def test_the_objective_ablation_takes_rtd_as_an_extra_column_under_its_own_study_name():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "studies"))
    import objective_ablation as oa

    plain = oa.build("smoke")
    study = oa.build("smoke", extra=("mlm,nsp,whp,pad,rtd", "rtd,nsp,whp,pad"))
    assert plain.name == "objective_ablation-smoke"  # the paper's table keeps its report
    assert study.name == "objective_ablation-smoke+rtd-mlm+rtd"
    models = {m.key: m.pretrain.objective_names for m in study.models}
    assert models["+rtd"] == tuple(ALL.split(",")) and models["-mlm+rtd"] == ("rtd", "nsp", "whp", "pad")
    plain_models = {m.key: m.pretrain for m in plain.models}
    assert plain_models == {m.key: m.pretrain for m in study.models if m.key in plain_models}
    cols = {c.col for c in study.calcs}
    assert cols == {"all*", "-whp*", "-pad*", "+rtd*", "-mlm+rtd*", "untrained"}
    per_col = [sum(c.col == col for c in study.calcs) for col in sorted(cols)]
    assert len(set(per_col)) == 1  # every column gets the same CT and AD calculations
    with pytest.raises(ValueError, match="already a column"):
        oa.build("smoke", extra=("mlm,nsp,pad",))


def test_objective_ablation_rejects_an_unknown_objective_at_parse_time(capsys):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "studies"))
    import objective_ablation as oa
    from alignlab.platform.study.run import study_main

    with pytest.raises(SystemExit) as e:
        study_main(oa.build, ["--preset", "smoke", "--objectives", "mlm,electra"], extra_objective_sets=True)
    assert e.value.code == 2 and "unknown objective electra" in capsys.readouterr().err


def test_the_laptop_budget_benchmark_reports_an_mlm_free_rtd_model_beside_its_all_original_rate(tok):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "probes"))
    import laptop_budget as lb
    from alignlab.platform.config import to_dict

    cfg = lb.build_config("rtd_for_mlm", resolve_objectives("mlm,nsp,whp,pad"))
    assert cfg.objective_names == ("rtd", "nsp", "whp", "pad") and cfg.model == lb.MINI.model
    assert lb.build_config("candidate", resolve_objectives("mlm,nsp")).objective_names == ("mlm", "nsp")
    # The figures come from a real evaluation of an RTD model (the keys the benchmark reads exist).
    tr = Pretrainer(dataclasses.replace(Preset.named("smoke").pretrain, objectives="rtd,nsp", precision="fp32"), tok)
    ev = tr.evaluate(batches(tok)[1:3], max_batches=2)
    fig = lb.rtd_figures(ev)
    assert fig["rtd_all_original"] == pytest.approx(100 * (1 - ev["eval/rtd/replaced_fraction"]), abs=0.01)
    assert fig["rtd"] == pytest.approx(100 * ev["eval/rtd/accuracy"], abs=0.01)
    fel = {"ct": {"accuracy": 50.0, "val_accuracy": 52.0}, "ad": {"accuracy": 60.0}}
    mlm_cfg = lb.build_config("candidate", resolve_objectives("mlm,nsp,whp,pad"))
    results = [{"recipe": "candidate", "config": to_dict(mlm_cfg), "steps": 10, "train_seconds": 5.0,
                "final": {"mlm": 12.0, "mlm_masked": 3.0, "nsp": 60.0, "whp": 70.0, "pad": 50.0}, "fel": fel},
               {"recipe": "rtd_for_mlm", "config": to_dict(cfg), "steps": 9, "train_seconds": 5.0,
                "final": {"nsp": 61.0, "whp": 71.0, "pad": 51.0, **fig}, "fel": fel}]
    head, _, mlm_row, rtd_row = lb.table(results)
    assert "RTD % (all-original %)" in head
    assert "| 12.0 (1.00x) | 3.0 (1.00x) |" in mlm_row and mlm_row.count("| - ") == 3  # no RTD figures for MLM
    assert "| rtd_for_mlm | rtd+nsp+whp+pad |" in rtd_row and "| - | - | 61.0 |" in rtd_row  # no MLM ratio
    assert f"{fig['rtd']:.1f} ({fig['rtd_all_original']:.1f})" in rtd_row


# RTD alone, and an untied generator, train without Ray above; under Ray Train one run of all five shows its
# generator's edit of the inputs inside the model's forward (where DDP sees it) and its eval metrics.
@pytest.mark.ray
def test_smoke_pretraining_with_all_five_objectives_from_the_command_line(smoke_corpus, tmp_path, capsys):
    from alignlab.platform.cli import main

    assert main(["pretrain", "--preset", "smoke", "--objectives", ALL, "--corpus", str(smoke_corpus),
                 "--storage", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    mid = next(ln.split()[1] for ln in out.splitlines() if ln.startswith("Model:"))
    assert mid.split("-")[1] == "mlm+nsp+whp+pad+rtd"
    ev = json.loads((tmp_path / "models" / mid / "final" / "eval.json").read_text())
    for name in ALL.split(","):
        assert 0 <= ev[f"eval/{name}/accuracy"] <= 1, name
    assert ev["eval/rtd/count"] > 0
