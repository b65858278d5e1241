"""Data-parallel pretraining (issues #18, #42) on real Ray Train workers (gloo on CPU), at smoke size.

`batch_size` is the global batch: the driver splits the row stream across the workers (Ray Data's streaming
split, order preserved), each rank collates only its own `worker_batch_size` rows with its own key of the step's
randomness, and each objective's loss is reweighted by the rank's share of the global count, so that DDP's
averaged gradient is the mean over all the ranks' rows. What is checked:
(a) each rank trains on its own rows: never a row of another rank, in any step of the run,
(b) every rank holds the same weights after every step,
(c) each rank trains on the device Ray Train assigned it (`get_device`),
(d) a run whose rank 1 is killed mid-run resumes from its checkpoint and ends with exactly the weights of an
    uninterrupted 2-worker run, dropout on (the split is the same on every run of the same world size, and each
    rank restores its own random state: issue #56),
(e) one worker collates exactly as before the split: the whole stream, rank 0's key,
(f) the rows of each rank at each step are those pinned in tests/golden_versions.json for this code version.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from fault_hooks import Chain, CrashRankOnce, Probe, probed_steps, registered

from alignlab.platform.presets import Preset

# Dropout on (the smoke model's 0.1): each rank draws its own masks, which a resumed rank must draw again (d). fp32:
# under bf16 autocast (precision "auto" on a CPU where bf16 trains faster) a matmul over 8 rows rounds otherwise than
# over 16.
CFG = dataclasses.replace(Preset.named("smoke").pretrain, objectives="mlm,nsp,whp,pad", max_steps=6, checkpoint_every=2,
                          log_every=1, cpus_per_worker=0.25, threads_per_worker=1, precision="fp32")
TWO = dataclasses.replace(CFG, num_workers=2)


def _records(out: Path, rank: int) -> dict[int, dict]:
    rows = [json.loads(line) for line in (out / f"rank{rank}.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows}


@pytest.fixture(scope="module")
def runs(ray_session, smoke_corpus, tmp_path_factory):
    """One uninterrupted 2-worker run, probed. (A one-worker run trains the whole global batch each step:
    test_gpu_pretraining.py counts its samples.)"""
    from alignlab.platform.pretrain.driver import pretrain

    root = tmp_path_factory.mktemp("dp-root")
    out2 = tmp_path_factory.mktemp("probe2")
    two = pretrain(smoke_corpus, TWO, root, after_step=registered(Probe(str(out2), save_at=(1,))))
    return {"root": root, "two": two, "out2": out2}


def test_the_global_batch_must_divide_among_the_workers():
    with pytest.raises(ValueError, match=r"batch_size \(16\) is the global batch .* num_workers \(3\)"):
        dataclasses.replace(CFG, num_workers=3)
    assert TWO.worker_batch_size == 8 and CFG.worker_batch_size == 16


@pytest.mark.ray
def test_a_rank_collates_only_its_own_rows_with_its_own_key_and_one_worker_collates_as_before(smoke_corpus):
    from alignlab.platform.encoder.batching import Collator
    from alignlab.platform.encoder.tokenizer import Tokenizer
    from alignlab.platform.pretrain.pretrain import Pretrainer, to_numpy_rows
    import pyarrow.parquet as pq

    tok = Tokenizer(smoke_corpus / "tokenizer.model")
    table = pq.read_table(sorted((smoke_corpus / "shards" / "train").glob("*.parquet"))[0]).slice(0, 16)
    rows = to_numpy_rows(table)
    one = Pretrainer(CFG, tok)
    before = Collator(list(one.objectives.values()), tok, max_len=CFG.model.max_len,
                      layout_fraction=CFG.layout_fraction, seed=CFG.seed, rank=0)(rows, step=5)
    whole = one.batch(rows, step=5)
    assert whole.keys() == before.keys() and all(torch.equal(whole[k], before[k]) for k in whole)
    half = {k: v[:8] for k, v in rows.items()}
    r0, r1 = (Pretrainer(TWO, tok, rank=r, world=2) for r in (0, 1))
    b0, b1 = r0.batch(half, step=5), r1.batch(half, step=5)
    assert len(b0["input_ids"]) == len(b1["input_ids"]) == 8
    assert r0.last_row_ids == r1.last_row_ids == one.last_row_ids[:8]
    # The same rows under rank 1's key draw other labels: no rank replays another's randomness.
    assert any(not torch.equal(b0[k], b1[k]) for k in b0 if b0[k].shape == b1[k].shape) or b0.keys() != b1.keys()
    with pytest.raises(ValueError, match=r"rank 1 of 2 needs its 8 rows of the step's global batch of 16, got 16"):
        r1.batch(rows, step=5)


@pytest.mark.ray
def test_each_rank_trains_only_on_its_own_rows_in_every_step(runs):
    r0, r1 = _records(runs["out2"], 0), _records(runs["out2"], 1)
    assert sorted(r0) == sorted(r1) == list(range(1, CFG.max_steps + 1))
    seen0, seen1 = set(), set()
    for step in r0:
        a, b = r0[step]["rows"], r1[step]["rows"]
        assert len(a) == len(b) == TWO.worker_batch_size
        seen0 |= set(a)
        seen1 |= set(b)
    assert not seen0 & seen1, f"rows read by both ranks: {sorted(seen0 & seen1)[:5]}"


@pytest.mark.ray
def test_the_rows_each_rank_trains_on_at_each_step_change_only_with_the_code_versions(runs):
    """A golden digest per rank (tests/test_versions.py): which rows reach which rank, in which batches and order."""
    from test_versions import check_batches

    check_batches("batches smoke, 2 workers", runs["out2"], ranks=2)


@pytest.mark.ray
def test_every_rank_holds_the_same_weights_after_every_step(runs):
    r0, r1 = _records(runs["out2"], 0), _records(runs["out2"], 1)
    for step in r0:
        assert r0[step]["digest"] == r1[step]["digest"], f"the ranks' weights differ after step {step}"


@pytest.mark.ray
def test_each_rank_trains_on_the_device_ray_train_assigned_it(runs):
    for rank in (0, 1):
        for rec in _records(runs["out2"], rank).values():
            assert rec["device"] == rec["ray_device"] == "cpu", rec


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_a_killed_rank_resumes_from_the_checkpoint_to_the_uninterrupted_final_weights(runs, smoke_corpus,
                                                                                      tmp_path):
    from alignlab.platform.pretrain.driver import pretrain

    assert TWO.model.dropout > 0  # each rank's own dropout masks, drawn again after the resume

    probe = tmp_path / "probe"
    probe.mkdir()
    mdir = pretrain(smoke_corpus, TWO, tmp_path / "root",
                    after_step=registered(Chain(Probe(str(probe)), CrashRankOnce(step=3, rank=1))))
    assert (mdir / ".crashed-once").exists()  # the crash happened, and the run went on
    # A resume, not a restart from step 0 (which ends at the same weights too): after the crash each rank went on
    # from the step-2 checkpoint, training steps 3 to 6 once each, and its weights after each of them are the
    # uninterrupted run's. The optimizer's state came back with the weights: fresh Adam moments at step 3 would
    # have moved the weights otherwise.
    for rank in (0, 1):
        records = probed_steps(probe, rank)
        steps = [r["step"] for r in records]
        (restart,) = [i for i in range(1, len(steps)) if steps[i] <= steps[i - 1]] or [None]
        assert restart is not None and steps[:restart] in ([1, 2], [1, 2, 3]) and steps[restart:] == [3, 4, 5, 6], \
            f"rank {rank} trained steps {steps}"
        straight_steps = _records(runs["out2"], rank)
        for r in records:
            assert r["digest"] == straight_steps[r["step"]]["digest"], f"rank {rank}'s weights after step {r['step']}"
    straight = torch.load(runs["two"] / "final" / "model.pt", weights_only=True)
    resumed = torch.load(mdir / "final" / "model.pt", weights_only=True)
    for k, v in straight.items():
        assert torch.equal(v, resumed[k]), f"{k} differs after the resume"
    assert mdir.name == runs["two"].name
    changed = [k for k, v in straight.items()
               if not torch.equal(v, torch.load(runs["out2"] / "rank0-step1.pt", weights_only=True)[k])]
    assert changed  # training went on past step 1
