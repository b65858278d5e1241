"""The data-parallel loss reweighting (`Pretrainer._global_share`, the counts' all-reduce `reduce_counts`): one step
on 2 DDP workers (torch.distributed's gloo, two processes, no Ray) yields the gradient of the mean loss over both
ranks' rows, the gradient that 1 worker gets from the same global batch. The ranks hold unequal numbers of rows, so
each objective scores unequal counts on them: without the reweighting DDP would average the two ranks' means, which
weighs the smaller rank's rows more (the test checks that this gradient is measurably another one)."""
from __future__ import annotations

import dataclasses
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from tiny_model import real_texts, rows, tiny_tokenizer

from alignlab.platform.presets import Preset

# fp32 and no dropout: the two runs then compute the same function, and their gradients differ by rounding only.
# No clipping: the gradients are compared as the backward pass leaves them.
_SMOKE = Preset.named("smoke").pretrain
ONE = dataclasses.replace(_SMOKE, objectives="mlm,nsp,whp,pad", precision="fp32", grad_clip=0.0,
                          model=dataclasses.replace(_SMOKE.model, dropout=0.0))
TWO = dataclasses.replace(ONE, num_workers=2)
ROWS_PER_RANK = (3, 7)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_step(rank: int, tok_path: str, batches_path: str, out: str, port: int) -> None:
    """One step of a DDP rank, as the Ray Train worker makes it (driver.py), and its gradients saved."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from alignlab.platform.encoder.tokenizer import Tokenizer
    from alignlab.platform.pretrain.driver import _all_reduce_sum
    from alignlab.platform.pretrain.pretrain import Pretrainer

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        trainer = Pretrainer(TWO, Tokenizer(tok_path), rank=rank, world=2, wrap=DistributedDataParallel,
                             reduce_counts=_all_reduce_sum)
        trainer.step(torch.load(batches_path, weights_only=False)[rank])
        torch.save({n: p.grad.clone() for n, p in trainer.model.named_parameters()}, f"{out}/grads{rank}.pt")
    finally:
        dist.destroy_process_group()


def _one_worker_gradients(trainer, batches: list[dict], *, reweighted: bool) -> dict[str, torch.Tensor]:
    """The gradient of one worker's loss over all the batches' rows: each objective's mean over its scored items
    of every batch (its count-weighted mean of the batches' means). `reweighted=False`: the plain mean of the
    batches' means, what DDP's average gives when each rank keeps its own mean."""
    trainer.model.zero_grad(set_to_none=True)
    outs = [trainer.forward(trainer.to_device(trainer.prepare(b))) for b in batches]
    total = 0.0
    for name, coeff in trainer.coefficients.items():
        losses = [out[name][0] for out in outs]
        counts = [out[name][1]["count"].detach().float() for out in outs]
        mean = (sum(l * c for l, c in zip(losses, counts)) / sum(counts) if reweighted
                else sum(losses) / len(losses))
        total = total + coeff * mean
    total.backward()
    return {n: p.grad.clone() for n, p in trainer.model.named_parameters()}


def test_two_ddp_workers_with_unequal_rows_get_the_gradient_of_one_worker_on_the_global_batch(tmp_path):
    from alignlab.platform.pretrain.pretrain import Pretrainer

    torch.set_num_threads(1)
    tok = tiny_tokenizer(tmp_path / "tok")
    all_rows = rows(tok, real_texts()[: sum(ROWS_PER_RANK)])
    cut = ROWS_PER_RANK[0]
    reference = Pretrainer(ONE, tok)
    batches = [reference.collate({k: v[:cut] for k, v in all_rows.items()}, step=0),
               reference.collate({k: v[cut:] for k, v in all_rows.items()}, step=1)]
    torch.save(batches, tmp_path / "batches.pt")

    mp.start_processes(_rank_step, args=(str(tmp_path / "tok" / "tokenizer.model"), str(tmp_path / "batches.pt"),
                                         str(tmp_path), _free_port()), nprocs=2, start_method="spawn")
    ranks = [torch.load(tmp_path / f"grads{r}.pt") for r in range(2)]

    counts = [[int(out[name][1]["count"]) for name in reference.coefficients]
              for out in (reference.forward(reference.to_device(reference.prepare(b))) for b in batches)]
    assert all(c0 != c1 for c0, c1 in zip(*counts)), f"every objective must score unequal counts on the ranks: {counts}"
    want = _one_worker_gradients(reference, batches, reweighted=True)
    unweighted = _one_worker_gradients(reference, batches, reweighted=False)
    assert ranks[0].keys() == want.keys()
    for name, g in want.items():
        torch.testing.assert_close(ranks[0][name], g, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")
        torch.testing.assert_close(ranks[1][name], ranks[0][name], rtol=0, atol=0)
    # The check can fail: the average of the ranks' own means is another gradient, far beyond the tolerance.
    flat = torch.cat([g.flatten() for g in want.values()])
    gap = torch.cat([(unweighted[n] - g).flatten() for n, g in want.items()])
    assert gap.norm() > 0.01 * flat.norm()


def test_two_ranks_start_from_the_same_weights_and_each_draws_its_own_dropout_masks(tmp_path):
    """Each rank's own random stream after the shared initial weights (Pretrainer), and each rank's own state back
    from a data-parallel checkpoint: a rank that drew another's masks would train on other noise than it resumes to."""
    from alignlab.platform.pretrain.pretrain import Pretrainer

    tok = tiny_tokenizer(tmp_path / "tok")
    cfg = dataclasses.replace(TWO, model=_SMOKE.model)
    assert cfg.model.dropout > 0
    draws, weights, states = [], [], []
    for rank in (0, 1, 0):
        trainer = Pretrainer(cfg, tok, rank=rank, world=2)
        states.append(trainer.rng_state())
        draws.append(torch.rand(64))
        weights.append(trainer.model.state_dict())
    assert all(torch.equal(v, weights[1][k]) for k, v in weights[0].items())
    assert not torch.equal(draws[0], draws[1]) and torch.equal(draws[0], draws[2])
    saved = trainer.state_dict(rng_by_rank=states[:2])
    rank1 = Pretrainer(cfg, tok, rank=1, world=2)
    torch.manual_seed(12345)
    rank1.load_state_dict(saved)
    assert torch.equal(torch.rand(64), draws[1]), "rank 1 resumed with another rank's random state"
