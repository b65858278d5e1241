"""Data-parallel pretraining (issue #18) on real Ray Train workers (gloo on CPU), at smoke size.

`batch_size` is the global batch: every worker streams all rows in the same order, collates each global batch
whole and trains on its own slice (Pretrainer.batch), and each objective's loss is reweighted by the rank's share
of the global count, so that DDP's averaged gradient is the whole batch's. What is checked:
(a) the ranks train on disjoint rows that together are the step's global batch (the rows one worker trains on),
(b) every rank holds the same weights after every step,
(c) one step of 2 workers x b/2 equals one step of 1 worker x b, to float rounding,
(d) a run whose rank 1 is killed mid-run resumes from its checkpoint and ends with exactly the weights of an
    uninterrupted 2-worker run.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from fault_hooks import CrashRankOnce, Probe, registered

from alignlab.platform import registry as _registry  # noqa: F401 -- objective names resolve through it
from alignlab.platform.config import PRETRAIN_PRESETS

# Dropout 0: with dropout each rank draws its own masks, and (c) would hold in distribution only. fp32: under bf16
# autocast (precision "auto" on a CPU with native bf16) a matmul over 8 rows rounds otherwise than over 16.
CFG = dataclasses.replace(PRETRAIN_PRESETS["smoke"], objectives="mlm,nsp,whp,pad", max_steps=6, checkpoint_every=2,
                          log_every=1, model=dataclasses.replace(PRETRAIN_PRESETS["smoke"].model, dropout=0.0),
                          cpus_per_worker=0.25, threads_per_worker=1, precision="fp32")
TWO = dataclasses.replace(CFG, num_workers=2)


def _records(out: Path, rank: int) -> dict[int, dict]:
    rows = [json.loads(line) for line in (out / f"rank{rank}.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows}


@pytest.fixture(scope="module")
def runs(ray_session, smoke_corpus, tmp_path_factory):
    """One uninterrupted 2-worker run and one 1-worker run of the same global batch, both probed."""
    from alignlab.platform.pretrain_ray import pretrain

    root = tmp_path_factory.mktemp("dp-root")
    out2, out1 = tmp_path_factory.mktemp("probe2"), tmp_path_factory.mktemp("probe1")
    two = pretrain(smoke_corpus, TWO, root, after_step=registered(Probe(str(out2), save_at=(1,))))
    one = pretrain(smoke_corpus, CFG, root, after_step=registered(Probe(str(out1), save_at=(1,))))
    return {"root": root, "two": two, "one": one, "out2": out2, "out1": out1}


def test_the_global_batch_must_divide_among_the_workers():
    with pytest.raises(ValueError, match=r"batch_size \(16\) is the global batch .* num_workers \(3\)"):
        dataclasses.replace(CFG, num_workers=3)
    assert TWO.worker_batch_size == 8 and CFG.worker_batch_size == 16


def test_a_rank_takes_its_rows_of_the_collated_global_batch_with_the_labels_one_worker_would_draw(smoke_corpus):
    from alignlab.platform.pretrain import Pretrainer, to_numpy_rows
    from alignlab.platform.tokenizer import Tokenizer
    import pyarrow.parquet as pq

    tok = Tokenizer(smoke_corpus / "tokenizer.model")
    table = pq.read_table(sorted((smoke_corpus / "shards" / "train").glob("*.parquet"))[0]).slice(0, 16)
    rows = to_numpy_rows(table)
    whole = Pretrainer(CFG, tok).batch(rows, step=5)
    halves = [Pretrainer(TWO, tok, rank=r, world=2).batch(rows, step=5) for r in (0, 1)]
    for k, v in whole.items():
        # Padding may differ only in width: each half is cut from the same collated batch, so it is the whole's.
        assert torch.equal(torch.cat([halves[0][k], halves[1][k]]), v), k
    assert (whole["mlm"] != -100).sum() > 0  # MLM labels travel per row


@pytest.mark.ray
def test_the_ranks_train_on_disjoint_rows_that_make_up_the_one_worker_global_batch(runs):
    r0, r1, one = _records(runs["out2"], 0), _records(runs["out2"], 1), _records(runs["out1"], 0)
    assert sorted(r0) == sorted(r1) == sorted(one) == list(range(1, CFG.max_steps + 1))
    for step in r0:
        a, b = r0[step]["rows"], r1[step]["rows"]
        assert len(a) == len(b) == TWO.worker_batch_size
        assert not set(a) & set(b), f"step {step}: the ranks share rows"
        assert a + b == one[step]["rows"], f"step {step}: the ranks' rows are not the global batch"


@pytest.mark.ray
def test_every_rank_holds_the_same_weights_after_every_step(runs):
    r0, r1 = _records(runs["out2"], 0), _records(runs["out2"], 1)
    for step in r0:
        assert r0[step]["digest"] == r1[step]["digest"], f"the ranks' weights differ after step {step}"


@pytest.mark.ray
def test_one_step_of_two_workers_with_half_batches_equals_one_step_of_one_worker(runs):
    """The gradient of the first step (DDP's average over the two ranks' halves, after clipping) is the one worker's
    gradient of the whole batch, to float rounding. (Weights are not compared after Adam's first step: it moves
    every parameter by about +-lr whatever the size of its gradient, so a near-zero gradient whose rounding differs
    in sign moves a weight by 2 lr.)"""
    two = torch.load(runs["out2"] / "rank0-step1-grad.pt", weights_only=True)
    one = torch.load(runs["out1"] / "rank0-step1-grad.pt", weights_only=True)
    assert two.keys() == one.keys() and len(one) > 10
    for k, g in one.items():
        scale = float(g.abs().max())
        assert scale > 0, f"{k} got no gradient"
        assert torch.allclose(two[k], g, rtol=1e-4, atol=1e-5 * scale), \
            f"{k}: max diff {float((two[k] - g).abs().max()):.3g} of max {scale:.3g}"


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_a_killed_rank_resumes_from_the_checkpoint_to_the_uninterrupted_final_weights(runs, smoke_corpus,
                                                                                      tmp_path):
    from alignlab.platform.pretrain_ray import pretrain

    mdir = pretrain(smoke_corpus, TWO, tmp_path / "root", after_step=registered(CrashRankOnce(step=3, rank=1)))
    assert (mdir / ".crashed-once").exists()  # the crash happened, and the run went on
    straight = torch.load(runs["two"] / "final" / "model.pt", weights_only=True)
    resumed = torch.load(mdir / "final" / "model.pt", weights_only=True)
    for k, v in straight.items():
        assert torch.equal(v, resumed[k]), f"{k} differs after the resume"
    assert mdir.name == runs["two"].name
    changed = [k for k, v in straight.items()
               if not torch.equal(v, torch.load(runs["out2"] / "rank0-step1.pt", weights_only=True)[k])]
    assert changed  # training went on past step 1
