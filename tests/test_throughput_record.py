"""The throughput record of a pretraining run (issue #42): the FLOP count, the peak table, MFU, and the counts
the training loop keeps across a resume."""
from __future__ import annotations

import dataclasses

import pytest

from alignlab.platform.throughput import (MEASURED, estimate_device_hours, flops_per_token, peak_flops, same_device,
                                          summary)


def test_flops_per_token_is_six_times_the_encoder_matrices_plus_the_attention_term():
    n = 3 * (4 * 768 * 768 + 2 * 768 * 3072)
    assert flops_per_token(768, 3, 3072, 128) == 6 * n + 12 * 3 * 768 * 128


@pytest.mark.parametrize("name,precision,tflops", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989), ("NVIDIA H100 PCIe", "bf16", 756), ("NVIDIA H200", "fp32", 67),
    ("NVIDIA A100-SXM4-40GB", "bf16", 312), ("NVIDIA A10G", "bf16", 125), ("NVIDIA L4", "fp32", 30.3),
    ("Tesla V100-SXM2-16GB", "fp32", 15.7)])
def test_the_peak_table_knows_the_common_gpus(name, precision, tflops):
    assert peak_flops(name, precision) == pytest.approx(tflops * 1e12)


def test_no_peak_means_no_mfu_rather_than_a_made_up_one():
    assert peak_flops("cpu", "fp32") is None
    assert peak_flops("Tesla T4", "bf16") is None  # no native bf16
    rec = summary(num_tokens=1000, num_samples=10, seconds=2.0, num_devices=1, device_name="cpu",
                  precision="fp32", fpt=1e6)
    assert rec["mfu"] is None and rec["tokens_per_s"] == 500 and rec["samples_per_s"] == 5


def test_mfu_divides_the_model_flops_by_the_peak_of_every_device():
    rec = summary(num_tokens=4_000_000, num_samples=40_000, seconds=1.0, num_devices=4,
                  device_name="NVIDIA H100 80GB HBM3", precision="bf16", fpt=1e8)
    assert rec["mfu"] == pytest.approx(4e6 * 1e8 / (4 * 989e12), abs=1e-4)
    assert rec["device_hours"] == pytest.approx(4 / 3600, abs=1e-5)
    assert rec["tokens_per_s_per_device"] == 1_000_000


def test_a_plan_estimates_from_measured_rates_and_says_where_they_come_from():
    rates = {("128x2", "NVIDIA H100 80GB HBM3", "bf16"): 1000.0}
    hours, where = estimate_device_hours("128x2", "H100", "bf16", 3_600_000, rates)
    assert hours == pytest.approx(1.0) and "storage root" in where
    assert same_device("h100", "NVIDIA H100 80GB HBM3") and not same_device("cpu", "NVIDIA H100 80GB HBM3")
    hours, where = estimate_device_hours("768x3", "H100", "bf16", 3_600_000, rates)  # none at the root: the table
    assert hours == pytest.approx(1000.0 / MEASURED[("768x3", "NVIDIA H100 80GB HBM3")]) and "benchmark table" in where
    hours, where = estimate_device_hours("768x3", "A10G", "bf16", 10, rates)
    assert hours is None and "no measured throughput of 768x3 on A10G" in where


def test_the_loop_counts_real_tokens_and_rows_and_a_resume_keeps_them(smoke_corpus):
    import pyarrow.parquet as pq

    from alignlab.platform.presets import PRETRAIN_PRESETS
    from alignlab.platform.pretrain.pretrain import Pretrainer, to_numpy_rows
    from alignlab.platform.pretrain.loop import train_loop
    from alignlab.platform.data.tokenizer import Tokenizer

    # Each batch collated at its own step, in stream order (no length bucketing), so a fresh trainer remakes them.
    cfg = dataclasses.replace(PRETRAIN_PRESETS["smoke"], max_steps=3, checkpoint_every=3, log_every=1,
                              precision="fp32", objectives="mlm,nsp", bucket_batches=1)
    tok = Tokenizer(smoke_corpus / "tokenizer.model")
    table = pq.read_table(sorted((smoke_corpus / "shards" / "train").glob("*.parquet"))[0])
    rows = to_numpy_rows(table.slice(0, cfg.batch_size))
    reports = []
    t = Pretrainer(cfg, tok)
    train_loop(t, lambda epoch: iter([rows] * 10), report=lambda m, ck: reports.append(m), log_every=1)
    # The batches' own masks (collation is keyed by step, so a fresh trainer makes the same ones).
    fresh = Pretrainer(cfg, tok)
    masks = [fresh.batch(rows, step=s, max_len=cfg.seq_len_at(s))["attention_mask"] for s in range(3)]
    assert t.state.num_tokens == sum(int(m.sum()) for m in masks) < sum(m.numel() for m in masks)  # padding left out
    assert t.state.num_samples == 3 * cfg.batch_size and t.state.train_seconds > 0
    assert all("throughput/tokens_per_s" in m and "throughput/mfu" not in m for m in reports)  # CPU: no peak
    again = Pretrainer(cfg, tok)
    again.load_state_dict(t.state_dict())
    assert (again.state.num_tokens, again.state.num_samples, again.state.train_seconds) == \
        (t.state.num_tokens, t.state.num_samples, t.state.train_seconds)


def test_the_report_has_a_cost_row_per_pretrained_model_and_the_fel_device_time(tmp_path):
    import json

    import pandas as pd

    from alignlab.platform.report.report import cost_table

    rec = summary(num_tokens=3_000_000, num_samples=30_000, seconds=600.0, num_devices=4,
                  device_name="NVIDIA A10G", precision="bf16", fpt=flops_per_token(768, 3, 3072, 128))
    final = tmp_path / "models" / "m1" / "final"
    final.mkdir(parents=True)
    (final / "eval.json").write_text(json.dumps({"step": 10, "throughput": rec}))
    study = {"corpus_dir": str(tmp_path / "corpus" / "c1"),
             "models": {"all": {"model_id": "m1"}, "old": {"model_id": "m0"}}}
    lines = cost_table(study, pd.DataFrame({"device_seconds": [30.0, 90.0]}))
    assert lines[2] == (f"| all | 4 x NVIDIA A10G | bf16 | 5,000 | 50.0 | {rec['mfu']:.1%} | 600 | 0.6667 |")
    assert lines[3].startswith("| old | – x – |")  # a model trained before throughput was recorded
    assert "2 with a recorded device time, 0.033 device-hours in all (60.0 s each on average)" in lines[-1]
