"""Exact at any cluster shape (issue #56): the weights of a run depend on its seed, world size and precision, not on
the cluster it ran on or on where it was interrupted.

- The blocks Ray Data reads the shards in are fixed by the files (`driver.read_shards`), so the ranks of a run
  under 2 Ray CPUs and of the same run under 4 read the same batches, rank by rank and step by step (by default as
  Ray Train hands them out; under -m slow also trained, to the same weights).
- Each rank saves and restores its own random state (CPU, and CUDA on a GPU): a data-parallel run with dropout
  resumes to bit-identical weights (tests/test_data_parallel.py kills a rank of a 2-worker run with dropout 0.1),
  and a resumed rank gets its own dropout masks back, not rank 0's.
- On a GPU, the resume state is loaded onto the rank's own device and the CUDA generator is restored.
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fault_hooks import Probe, registered

from alignlab.platform.presets import Preset

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (and a torch built for it)")

# Two gloo workers, dropout on (the smoke model's 0.1), fp32 (bf16 is chosen by the CPU under "auto").
TWO = dataclasses.replace(Preset.named("smoke").pretrain, objectives="mlm,nsp,whp,pad", max_steps=6, checkpoint_every=3,
                          log_every=1, num_workers=2, cpus_per_worker=0.25, threads_per_worker=1, precision="fp32")

_OWN_RAY = r'''
import sys, json
sys.path.insert(0, {tests!r})
import ray
from alignlab.platform.config import pretrain_from_dict
from alignlab.platform.runtime.ray_env import quiet_ray_data

ray.init(address="local", num_cpus={cpus}, include_dashboard=False, log_to_driver=False, object_store_memory=2**30)
quiet_ray_data()
cfg = pretrain_from_dict(json.loads({cfg!r}))
'''
"""A Ray of its own with {cpus} CPUs, in a subprocess, and the run's config as `cfg`; a script goes on from here."""

_OWN_RAY_TRAIN = _OWN_RAY + r'''
from alignlab.platform.pretrain.driver import pretrain
from fault_hooks import Probe, registered

pretrain({corpus!r}, cfg, {root!r}, after_step=registered(Probe({out!r})))
'''

_OWN_RAY_ROWS = _OWN_RAY + r'''
from test_exact_at_any_shape import _rows_by_rank

print(json.dumps(_rows_by_rank({corpus!r}, cfg)))
'''


def _rows_by_rank(corpus: str, cfg) -> list[list[list[str]]]:
    """Each rank's batches of a first epoch, as the workers of a Train run get them: the corpus's training shards read
    by `read_shards`, split by `data_config` the way Ray Train splits them (`DataConfig.configure`, both workers on
    this node), each rank's iterator (`rank_batches`) drained on a thread of its own, since a streaming split moves
    only while every rank reads. A row is named by its document and chunk."""
    import threading

    import ray

    from alignlab.platform.corpus.corpus import load_manifest, shard_names
    from alignlab.platform.pretrain.driver import data_config, rank_batches, read_shards, split_paths
    from alignlab.platform.storage.root import as_storage

    cdir = Path(corpus)
    manifest, st = load_manifest(cdir), as_storage(cdir.parents[1])
    paths = split_paths(st, cdir, manifest["corpus_id"], shard_names(cdir, manifest, "train"))
    datasets = {"train": read_shards(paths, st.ray_filesystem())}
    node = ray.get_runtime_context().get_node_id()
    splits = data_config(cfg, datasets).configure(datasets, world_size=cfg.num_workers, worker_handles=None,
                                                  worker_node_ids=[node] * cfg.num_workers)
    rows: list[list[list[str]]] = [[] for _ in splits]
    failed: list[BaseException] = []

    def drain(rank: int) -> None:
        try:
            for b in rank_batches(splits[rank]["train"], cfg, epoch=0):
                rows[rank].append([f"{d}#{c}" for d, c in zip(b["doc_id"].to_pylist(), b["chunk_index"].to_pylist())])
        except BaseException as e:  # noqa: BLE001 -- raised on the test's own thread below
            failed.append(e)

    threads = [threading.Thread(target=drain, args=(rank,)) for rank in range(len(splits))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    if failed:
        raise failed[0]
    return rows


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_the_ranks_of_a_run_under_2_ray_cpus_and_under_4_read_the_same_batches(ray_session, smoke_corpus, tmp_path,
                                                                             monkeypatch):
    """This session's Ray has 2 CPUs; a Ray of its own with 4 splits the same corpus in a subprocess. Both read with
    Ray Data's first-generation reader (`RAY_DATA_USE_DATASOURCE_V2=0`, where Ray sizes a read from the cluster's
    CPUs): without fixed blocks the ranks then read other rows under 4 CPUs than under 2. The weights follow from the
    batches, the seed and the precision: trained and compared under -m slow (below)."""
    import ray.data

    from alignlab.platform.config import to_dict

    monkeypatch.setenv("RAY_DATA_USE_DATASOURCE_V2", "0")
    monkeypatch.setattr(ray.data.DataContext.get_current(), "use_datasource_v2", False)
    two = _rows_by_rank(str(smoke_corpus), TWO)
    script = _OWN_RAY_ROWS.format(tests=str(Path(__file__).parent), cpus=4, corpus=str(smoke_corpus),
                                  cfg=json.dumps(to_dict(TWO)))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "RAY_ADDRESS": ""})
    assert run.returncode == 0, run.stderr[-3000:]
    four = json.loads(run.stdout.splitlines()[-1])
    # Both ranks read a whole epoch of full batches, as many as each other, and no row twice.
    assert len(two[0]) == len(two[1]) > TWO.max_steps
    assert all(len(b) == TWO.worker_batch_size for rank in two for b in rank)
    assert not {r for b in two[0] for r in b} & {r for b in two[1] for r in b}
    for rank in (0, 1):
        assert len(four[rank]) == len(two[rank]), f"rank {rank} read another number of batches under 4 CPUs"
        for step, (a, b) in enumerate(zip(two[rank], four[rank]), start=1):
            assert a == b, f"rank {rank} read other rows in batch {step} under 4 CPUs"


def _records(out: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (out / f"rank{rank}.jsonl").read_text().splitlines()]


# -m slow (~65 s): the default suite checks the batches each rank reads under 2 and 4 CPUs (above), that a rank
# trains on exactly the rows it reads (test_data_parallel.py), and that the same batches train the same weights
# (test_data_parallel.py's killed rank, test_pretrain.py's reruns).
@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(900)
def test_a_run_under_2_ray_cpus_and_under_4_trains_the_same_batches(ray_session, smoke_corpus, tmp_path, monkeypatch):
    """This session's Ray has 2 CPUs; a Ray of its own with 4 runs the same model in a subprocess. Both read with
    Ray Data's first-generation reader (`RAY_DATA_USE_DATASOURCE_V2=0`, where Ray sizes a read from the cluster's
    CPUs): without fixed blocks the ranks then trained on other rows under 4 CPUs than under 2."""
    import ray.data

    from alignlab.platform.config import to_dict
    from alignlab.platform.pretrain.driver import pretrain

    monkeypatch.setenv("RAY_DATA_USE_DATASOURCE_V2", "0")
    monkeypatch.setattr(ray.data.DataContext.get_current(), "use_datasource_v2", False)
    out2, out4 = tmp_path / "cpus2", tmp_path / "cpus4"
    out2.mkdir(), out4.mkdir()
    two = pretrain(smoke_corpus, TWO, tmp_path / "root2", after_step=registered(Probe(str(out2))))
    script = _OWN_RAY_TRAIN.format(tests=str(Path(__file__).parent), cpus=4, corpus=str(smoke_corpus),
                             cfg=json.dumps(to_dict(TWO)), root=str(tmp_path / "root4"), out=str(out4))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "RAY_ADDRESS": ""})
    assert run.returncode == 0, run.stderr[-3000:]
    for rank in (0, 1):
        a, b = _records(out2, rank), _records(out4, rank)
        assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, TWO.max_steps + 1))
        for x, y in zip(a, b):
            assert x["rows"] == y["rows"], f"rank {rank} trained on other rows at step {x['step']} under 4 CPUs"
            assert x["digest"] == y["digest"], f"the weights differ after step {x['step']}"
    four = tmp_path / "root4" / "models" / two.name / "final" / "model.pt"
    a, b = (torch.load(p, weights_only=True) for p in (two / "final" / "model.pt", four))
    assert all(torch.equal(a[k], b[k]) for k in a)


def _pair(tok, cfg):
    from alignlab.platform.pretrain.pretrain import Pretrainer

    return [Pretrainer(cfg, tok, rank=r, world=2) for r in (0, 1)]


def test_a_checkpoint_gives_each_rank_back_its_own_random_state(tmp_path):
    """Rank 1 of a resumed run draws its dropout masks from its own saved state, not from rank 0's (before issue #56
    every rank restored rank 0's)."""
    from tiny_model import tiny_tokenizer

    from alignlab.platform.pretrain.pretrain import Pretrainer

    tok = tiny_tokenizer(tmp_path / "tok")
    cfg = dataclasses.replace(Preset.named("smoke").pretrain, num_workers=2, precision="fp32")
    ranks = _pair(tok, cfg)
    states = []
    for t in ranks:  # each rank's generator where a checkpoint would find it: seeded per rank, then used
        torch.manual_seed(100 + t.rank)
        torch.rand(7)
        states.append(t.rng_state())
    saved = io.BytesIO()
    torch.save(ranks[0].state_dict(rng_by_rank=states), saved)
    expected = [torch.rand(5, generator=torch.Generator().set_state(s["cpu"])) for s in states]
    for rank in (0, 1):
        saved.seek(0)
        fresh = Pretrainer(cfg, tok, rank=rank, world=2)
        fresh.load_state_dict(torch.load(saved, weights_only=True))
        assert torch.equal(torch.rand(5), expected[rank]), f"rank {rank} resumed with another rank's random state"
    with pytest.raises(AssertionError, match="every rank's random state"):
        ranks[0].state_dict()
    one = Pretrainer(Preset.named("smoke").pretrain, tok)
    with pytest.raises(ValueError, match="random state of 1 ranks; this run has 2"):
        ranks[1].load_state_dict(one.state_dict())


@CUDA
def test_a_run_resumed_on_a_gpu_gets_its_state_on_its_device_and_draws_the_same_dropout_masks(tmp_path):
    """Four steps straight against three, a checkpoint, and the fourth on a fresh trainer whose CUDA generator had
    moved on. The fourth step's loss (its forward: the weights, the batch and the dropout masks) is bitwise the
    same. The weights after its backward are compared to rounding only: on CUDA the gathers of the labelled positions
    (`index_select`) and the embeddings sum their gradients with atomic adds, in no fixed order."""
    from tiny_model import batches, tiny_tokenizer

    from alignlab.platform.pretrain.pretrain import Pretrainer

    tok = tiny_tokenizer(tmp_path / "tok")
    cfg = dataclasses.replace(Preset.named("smoke").pretrain, precision="fp32", max_steps=4)
    assert cfg.model.dropout > 0
    data = [b for _, b in zip(range(4), batches(tok))]
    device = "cuda:0"
    straight = Pretrainer(cfg, tok, device=device)
    losses = []
    saved = io.BytesIO()
    for step, b in enumerate(data):
        if step == 3:
            torch.save(straight.state_dict(), saved)
            rng_at_save = torch.cuda.get_rng_state(device)
        losses.append(straight.train_step(straight.collate(b, step=step))["train/loss"])
    resumed = Pretrainer(cfg, tok, device=device)
    torch.rand(1000, device=device)  # the fresh trainer's generator is elsewhere
    saved.seek(0)
    # Loaded on the CPU, not at the device as the driver loads it: what reaches the device is then the trainer's
    # doing, which the checks below can catch failing (a state loaded at the device would be there whatever it did).
    state = torch.load(saved, map_location="cpu", weights_only=True)
    assert state["model"]["encoder.tok.weight"].device == torch.device("cpu")
    assert any(torch.is_tensor(p) and p.dim() for s in state["optimizer"]["state"].values() for p in s.values())
    resumed.load_state_dict(state)
    # Where the state lands is torch's doing once the trainer's model is on its device (Module.load_state_dict copies
    # into the parameters where they are; Optimizer.load_state_dict moves each state tensor to its parameter's
    # device): these two hold for any trainer that placed its model, whatever its resume did. What torch does not do
    # is the trainer's: restoring the device's generator (checked next), which alone decides the dropout masks.
    assert {p.device for p in resumed.model.parameters()} == {torch.device(device)}
    assert {p.device for s in resumed.optimizer.state.values() for p in s.values() if torch.is_tensor(p) and p.dim()} \
        == {torch.device(device)}
    assert torch.equal(torch.cuda.get_rng_state(device), rng_at_save)
    loss = resumed.train_step(resumed.collate(data[3], step=3))["train/loss"]
    assert loss == losses[3], "the resumed step's forward differs: its dropout masks are not the straight run's"
    for (k, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7), k
    # The same resume without the CUDA generator's state (all torch itself would restore) draws other masks: the
    # check above can fail.
    no_cuda_rng = Pretrainer(cfg, tok, device=device)
    torch.rand(1000, device=device)
    no_cuda_rng.load_state_dict({**state, "rng_by_rank": [{"cpu": state["rng_by_rank"][0]["cpu"]}]})
    assert not torch.equal(torch.cuda.get_rng_state(device), rng_at_save)
    assert no_cuda_rng.train_step(no_cuda_rng.collate(data[3], step=3))["train/loss"] != losses[3]
