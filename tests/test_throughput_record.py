"""The throughput record of a pretraining run (issues #42, #56): the one FLOP count (the encoder per real token,
the heads per what they score: MLM's decoder per predicted position), the peak table, MFU, and the counts the
training loop keeps across a resume."""
from __future__ import annotations

import dataclasses

import pytest

from alignlab.platform.pretrain.cost import expected_run_flops
from alignlab.platform.runtime.throughput import (MEASURED, batch_flops, encoder_flops_per_token, estimate_device_hours,
                                                  peak_flops, same_device, summary)


def test_the_encoder_costs_six_times_its_matrices_plus_the_attention_term_per_token():
    n = 3 * (4 * 768 * 768 + 2 * 768 * 3072)
    assert n == 21_233_664
    assert encoder_flops_per_token(768, 3, 3072, 128) == 6 * n + 12 * 3 * 768 * 128 == 130_940_928


class _Vocabulary:
    """What the objectives read of a tokenizer, at a vocabulary of `vocab_size` pieces (a real one of 111K pieces
    would need a corpus that large)."""

    def __init__(self, vocab_size: int):
        import numpy as np

        self.vocab_size, self.special_ids, self.mask_id = vocab_size, [0, 1, 2, 3, 4], 4
        self.counts = np.ones(vocab_size)


@pytest.mark.parametrize("vocab,per_predicted", [
    (32_000, 6 * (768 * 768 + 768 * 32_000)),     # = 150,994,944: the decoder 17% of the example's work
    (111_000, 6 * (768 * 768 + 768 * 111_000)),   # = 515,026,944: 37%
])
def test_a_768x3_batch_costs_the_hand_counted_flops_at_a_32k_and_a_111k_vocabulary(vocab, per_predicted):
    """Two rows of 128 and 100 real tokens at sequence length 128, MLM predicting 19 + 15 positions, WHP labelling
    7 tokens, NSP and PAD one [CLS] each: counted by hand, then by the objectives' own `head_flops` on the batch."""
    import torch

    from alignlab.platform.encoder.batching import IGNORE
    from alignlab.platform.encoder.registry import objective_config
    from alignlab.platform.presets import MODEL_SIZES

    m = MODEL_SIZES["768x3"]
    assert (m.hidden, m.num_layers, m.ffn) == (768, 3, 3072)
    mask = torch.zeros(2, 128, dtype=torch.int64)
    mask[0, :], mask[1, :100] = 1, 1
    mlm = torch.full((2, 128), IGNORE)
    mlm[0, 1:20], mlm[1, 1:16] = 7, 7
    whp = torch.full((2, 128), IGNORE)
    whp[0, 30:37] = 1
    batch = {"attention_mask": mask, "mlm": mlm, "whp": whp, "nsp": torch.tensor([0, 1]), "pad": torch.tensor([1, 0])}
    by_hand = (228 * 130_940_928            # 6 N + 12 L d T for each real token
               + 34 * per_predicted         # 6 (d^2 + d V) for each predicted position
               + 2 * 2 * 6 * (768 * 768 + 768 * 2)  # NSP's and PAD's pooler and output on each row's [CLS]
               + 7 * 6 * 768 * 4)          # WHP's d x 4 on each labelled token
    vocabulary = _Vocabulary(vocab)
    heads = sum(objective_config(name).build(vocabulary).head_flops(m, batch, seq_len=128)
                for name in ("mlm", "nsp", "whp", "pad"))
    assert batch_flops(m, 128, int(mask.sum()), heads) == by_hand


def test_every_bundled_objective_counts_its_heads_flops():
    from alignlab.platform.encoder.registry import is_plugin, objective_class, registered
    from alignlab.platform.presets import MODEL_SIZES

    for name, cls in registered().items():
        if not is_plugin(cls):
            flops = objective_class(cls).expected_head_flops(cls(), MODEL_SIZES["128x2"], 1000, seq_len=128, rows=2,
                                                             tokens=200)
            assert flops > 0, f"{name} leaves its head out of the FLOP count"


def test_the_plan_counts_a_paper_run_with_full_rows_and_the_expected_predicted_positions():
    from alignlab.platform.presets import MODEL_SIZES, Preset

    cfg = dataclasses.replace(Preset.named("paper").pretrain, objectives="mlm,nsp,whp,pad", max_steps=10)
    rows = 10 * 256
    per_row = (128 * 130_940_928 + 0.15 * 125 * 6 * (768 * 768 + 768 * 111_000)  # 15% of the 125 non-special tokens
               + 2 * 6 * (768 * 768 + 768 * 2) + 128 * 6 * 768 * 4)  # NSP, PAD; WHP on at most every token
    assert cfg.model == MODEL_SIZES["768x3"]
    assert expected_run_flops(cfg, 111_000) == pytest.approx(rows * per_row, rel=1e-12)
    assert per_row == pytest.approx(26.43e9, rel=1e-3)  # per example: the paper's 500M examples are 1.3e19 FLOP


@pytest.mark.parametrize("name,precision,tflops", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989), ("NVIDIA H100 PCIe", "bf16", 756), ("NVIDIA H200", "fp32", 67),
    ("NVIDIA A100-SXM4-40GB", "bf16", 312), ("NVIDIA A10G", "bf16", 125), ("NVIDIA L4", "fp32", 30.3),
    ("Tesla V100-SXM2-16GB", "fp32", 15.7)])
def test_the_peak_table_knows_the_common_gpus(name, precision, tflops):
    assert peak_flops(name, precision) == pytest.approx(tflops * 1e12)


def test_no_peak_means_no_mfu_rather_than_a_made_up_one():
    assert peak_flops("cpu", "fp32") is None
    assert peak_flops("Tesla T4", "bf16") is None  # no native bf16
    rec = summary(num_tokens=1000, num_samples=10, num_flops=1e9, seconds=2.0, num_devices=1, device_name="cpu",
                  precision="fp32")
    assert rec["mfu"] is None and rec["tokens_per_s"] == 500 and rec["samples_per_s"] == 5


def test_mfu_divides_the_counted_flops_by_the_peak_of_every_device():
    rec = summary(num_tokens=4_000_000, num_samples=40_000, num_flops=4e14, seconds=1.0, num_devices=4,
                  device_name="NVIDIA H100 80GB HBM3", precision="bf16")
    assert rec["mfu"] == pytest.approx(4e14 / (4 * 989e12), abs=1e-4)
    assert rec["flops"] == 4e14 and rec["flops_per_token"] == 1e8
    assert rec["device_hours"] == pytest.approx(4 / 3600, abs=1e-5)
    assert rec["tokens_per_s_per_device"] == 1_000_000


def test_a_run_packed_three_to_a_gpu_records_a_third_of_its_wall_time_as_device_hours():
    whole, packed = (summary(num_tokens=1000, num_samples=10, num_flops=1e12, seconds=3600.0, num_devices=1,
                             device_name="NVIDIA H100 80GB HBM3", precision="bf16", device_share=share)
                     for share in (1.0, 1 / 3))
    assert whole["device_hours"] == 1.0 and packed["device_hours"] == pytest.approx(1 / 3, abs=1e-5)
    assert packed["device_share"] == pytest.approx(1 / 3) and packed["mfu"] == whole["mfu"]


def test_a_plan_estimates_from_measured_rates_and_says_where_they_come_from():
    rates = {("128x2", "NVIDIA H100 80GB HBM3", "bf16"): 1000.0}
    hours, where = estimate_device_hours("128x2", "H100", "bf16", 3_600_000, rates)
    assert hours == pytest.approx(1.0) and "storage root" in where
    assert same_device("h100", "NVIDIA H100 80GB HBM3") and not same_device("cpu", "NVIDIA H100 80GB HBM3")
    hours, where = estimate_device_hours("768x3", "H100", "bf16", 3_600_000, rates)  # none at the root: the table
    assert hours == pytest.approx(1000.0 / MEASURED[("768x3", "NVIDIA H100 80GB HBM3")]) and "benchmark table" in where
    hours, where = estimate_device_hours("768x3", "A10G", "bf16", 10, rates)
    assert hours is None and "no measured throughput of 768x3 on A10G" in where


@pytest.mark.ray
def test_the_loop_counts_real_tokens_rows_and_each_batchs_flops_and_a_resume_keeps_them(smoke_corpus):
    import pyarrow.parquet as pq

    from alignlab.platform.encoder.tokenizer import Tokenizer
    from alignlab.platform.presets import Preset
    from alignlab.platform.pretrain.loop import train_loop
    from alignlab.platform.pretrain.pretrain import Pretrainer, to_numpy_rows

    # Each batch collated at its own step, in stream order (no length bucketing), so a fresh trainer remakes them.
    cfg = dataclasses.replace(Preset.named("smoke").pretrain, max_steps=3, checkpoint_every=3, log_every=1,
                              precision="fp32", objectives="mlm,nsp", bucket_batches=1)
    tok = Tokenizer(smoke_corpus / "tokenizer.model")
    table = pq.read_table(sorted((smoke_corpus / "shards" / "train").glob("*.parquet"))[0])
    rows = to_numpy_rows(table.slice(0, cfg.batch_size))
    reports = []
    t = Pretrainer(cfg, tok)
    train_loop(t, lambda epoch: iter([rows] * 10), report=lambda m, ck: reports.append(m), log_every=1)
    # The batches' own masks (collation is keyed by step, so a fresh trainer makes the same ones).
    fresh = Pretrainer(cfg, tok)
    batches = [fresh.batch(rows, step=s, max_len=cfg.seq_len_at(s)) for s in range(3)]
    masks = [b["attention_mask"] for b in batches]
    assert t.state.num_tokens == sum(int(m.sum()) for m in masks) < sum(m.numel() for m in masks)  # padding left out
    # Each batch's own count: its real tokens through the encoder, and MLM's decoder on its predicted positions.
    assert t.state.num_flops == sum(fresh.batch_flops(b, cfg.seq_len_at(s)) for s, b in enumerate(batches))
    decoder = 6 * (cfg.model.hidden ** 2 + cfg.model.hidden * tok.vocab_size)
    predicted = sum(int((b["mlm"] != -100).sum()) for b in batches)
    encoder_only = sum(batch_flops(cfg.model, cfg.seq_len_at(s), int(m.sum()), 0.0) for s, m in enumerate(masks))
    nsp = 3 * cfg.batch_size * 6 * (cfg.model.hidden ** 2 + 2 * cfg.model.hidden)
    assert t.state.num_flops == encoder_only + predicted * decoder + nsp
    assert t.state.num_samples == 3 * cfg.batch_size and t.state.train_seconds > 0
    assert all("throughput/tokens_per_s" in m and "throughput/mfu" not in m for m in reports)  # CPU: no peak
    again = Pretrainer(cfg, tok)
    again.load_state_dict(t.state_dict())
    assert (again.state.num_tokens, again.state.num_samples, again.state.num_flops, again.state.train_seconds) == \
        (t.state.num_tokens, t.state.num_samples, t.state.num_flops, t.state.train_seconds)


def test_the_report_has_a_cost_row_per_pretrained_model_and_the_fel_device_time(tmp_path):
    import json

    import pandas as pd

    from alignlab.platform.report.report import cost_table

    rec = summary(num_tokens=3_000_000, num_samples=30_000, num_flops=3_000_000 * 2e8, seconds=600.0, num_devices=4,
                  device_name="NVIDIA A10G", precision="bf16")
    final = tmp_path / "models" / "m1" / "final"
    final.mkdir(parents=True)
    (final / "eval.json").write_text(json.dumps({"step": 10, "throughput": rec}))
    study = {"corpus_dir": str(tmp_path / "corpus" / "c1"),
             "models": {"all": {"model_id": "m1"}, "old": {"model_id": "m0"}}}
    lines = cost_table(study, pd.DataFrame({"device_seconds": [30.0, 90.0]}))
    assert lines[2] == (f"| all | 4 x NVIDIA A10G | bf16 | 5,000 | 50.0 | {rec['mfu']:.1%} | 600 | 0.6667 |")
    assert lines[3].startswith("| old | – x – |")  # a model trained before throughput was recorded
    assert "2 with a recorded device time, 0.033 device-hours in all (60.0 s each on average)" in lines[-1]
