"""Pretraining on a CUDA GPU under Ray Train, end to end at smoke size: the Train worker trains on the GPU Ray Train
assigned it, its batches reach the GPU from the prefetch thread or from a collating process, and the run's
throughput record names the GPU and its MFU. The same reading of a run is applied to the session's smoke model,
trained on the CPU (conftest.py), so the test's own reading is exercised everywhere; the GPU cases skip without one.

On a GPU machine: `python -m pytest tests/test_gpu_pretraining.py` (`benchmarks/throughput/gpu_checks.sh` runs it with the
other CUDA tests)."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from fault_hooks import Probe, registered

from alignlab.platform.presets import Preset
from alignlab.platform.pretrain.driver import pretrain
from alignlab.platform.runtime.throughput import peak_flops

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (and a torch built for it)")


@CUDA
@pytest.mark.ray
@pytest.mark.parametrize("collate_workers", [0, 1])
def test_a_pretraining_run_on_a_gpu_trains_on_the_gpu_ray_train_gave_it_and_its_record_names_that_gpu(
        smoke_corpus, tmp_path, collate_workers):
    cfg = dataclasses.replace(Preset.named("smoke").pretrain, objectives="mlm,nsp,whp,pad", max_steps=6, checkpoint_every=3,
                              log_every=1, use_gpu=True, collate_workers=collate_workers)
    out = tmp_path / "probe"
    out.mkdir()
    mdir = pretrain(smoke_corpus, cfg, tmp_path / "root", after_step=registered(Probe(str(out))))
    _trained_on_its_device_and_recorded_it(cfg, out, mdir)


@pytest.mark.ray
def test_a_pretraining_run_on_the_cpu_trains_there_and_its_record_names_the_cpu(smoke_model, smoke_model_cfg,
                                                                                 smoke_model_probe):
    """The session's smoke model (conftest.py), read as the GPU runs above are."""
    _trained_on_its_device_and_recorded_it(smoke_model_cfg, smoke_model_probe, smoke_model)


def _trained_on_its_device_and_recorded_it(cfg, out, mdir) -> None:
    use_gpu = cfg.use_gpu
    steps = [json.loads(line) for line in (out / "rank0.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, cfg.max_steps + 1))
    device = "cuda:0" if use_gpu else "cpu"
    for s in steps:
        assert s["device"] == s["ray_device"] == device, s  # the trainer was given the device Ray Train assigned
        # ... and trained there: its weights, the gradients of its step and its optimizer state are on it
        assert s["tensor_devices"] == [device], s
    done = json.loads((mdir / "final" / "eval.json").read_text())
    tp = done["throughput"]
    assert tp["device"] == (torch.cuda.get_device_name(0) if use_gpu else "cpu") and tp["num_devices"] == 1
    if use_gpu:
        assert tp["precision"] == "bf16"  # "auto" on a GPU
    assert tp["num_samples"] == cfg.max_steps * cfg.batch_size
    assert 0 < tp["num_tokens"] <= tp["num_samples"] * max(cfg.seq_len_at(s) for s in range(cfg.max_steps))
    assert tp["tokens_per_s"] > 0 and tp["device_hours"] > 0
    # MFU exactly where the peak table knows the device (never on a CPU).
    assert (tp["mfu"] is None) == (peak_flops(tp["device"], tp["precision"]) is None)
    if tp["mfu"] is not None:
        assert 0 < tp["mfu"] < 1
    assert all(np.isfinite(v) for k, v in done.items() if isinstance(v, float)), done


@pytest.mark.ray
@CUDA
def test_two_small_models_on_half_a_gpu_each_train_at_the_same_time_on_the_one_gpu(smoke_corpus, tmp_path):
    """What a study does with models that cannot fill a GPU (study/layout.pack): each Train worker asks Ray for half
    a GPU, so both runs train at once, each on the one GPU, as two Ray tasks (study.run.pretrain_models)."""
    import ray
    from fault_hooks import StepTimes, pretrain_in_task

    from alignlab.platform.config import to_dict

    out = tmp_path / "times"
    out.mkdir()
    task = ray.remote(num_cpus=0)(registered(pretrain_in_task))
    runs = []
    for seed in (1, 2):
        cfg = dataclasses.replace(Preset.named("smoke").pretrain, objectives="mlm,nsp", max_steps=60, checkpoint_every=60,
                                  log_every=1, use_gpu=True, gpus_per_worker=0.5, seed=seed)
        runs.append(task.remote(str(smoke_corpus), to_dict(cfg), str(tmp_path / "root"),
                                registered(StepTimes(str(out), f"seed{seed}", meet=("seed1", "seed2")))))
    assert len({ray.get(r) for r in runs}) == 2
    spans = []
    for seed in (1, 2):
        steps = [json.loads(line) for line in (out / f"seed{seed}-rank0.jsonl").read_text().splitlines()]
        assert len(steps) == 60 and {s["device"] for s in steps} == {"cuda:0"}
        assert {d for s in steps for d in s["tensor_devices"]} == {"cuda:0"}, steps[0]
        # Each waited after its first step for the other's: both training at once, not one after the other.
        assert steps[0]["met"] is True, f"seed{seed} trained alone: the other run never started beside it"
        spans.append((steps[0]["t"], steps[-1]["t"]))
    (a0, a1), (b0, b1) = spans
    assert a0 < b1 and b0 < a1, spans  # their training overlapped: neither waited for the other's GPU


def test_the_reading_of_a_run_fails_one_whose_step_ran_off_the_device_it_was_given(tmp_path):
    """The device check reads where the step ran, not only the device the trainer was told: a run given cuda:0
    whose weights, gradients and optimizer state stayed on the CPU (a trainer that never moved its model) fails it,
    where the two device labels alone agree."""
    cfg = dataclasses.replace(Preset.named("smoke").pretrain, max_steps=2, use_gpu=True)
    (tmp_path / "rank0.jsonl").write_text("".join(
        json.dumps({"step": i, "device": "cuda:0", "ray_device": "cuda:0", "tensor_devices": ["cpu"]}) + "\n"
        for i in (1, 2)))
    with pytest.raises(AssertionError, match="'tensor_devices': \\['cpu'\\]"):
        _trained_on_its_device_and_recorded_it(cfg, tmp_path, tmp_path)
