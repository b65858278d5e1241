"""The input path of issue #42: the collation as array operations gives exactly the per-row collation's batches, the
prefetching thread changes nothing a run learns, and the training step asks the device nothing."""
from __future__ import annotations

import dataclasses
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "throughput"))
from collate_reference import ReferenceCollator  # noqa: E402
from tiny_model import batches, tiny_tokenizer  # noqa: E402

from alignlab.platform.encoder.batching import IGNORE, Collator, Ragged, rows_from_arrow  # noqa: E402
from alignlab.platform.encoder.draws import OneByOne  # noqa: E402
from alignlab.platform.presets import Preset  # noqa: E402
from alignlab.platform.pretrain.loop import train_loop  # noqa: E402
from alignlab.platform.pretrain.prefetch import Prefetcher  # noqa: E402
from alignlab.platform.pretrain.pretrain import Pretrainer, build_objectives

SMOKE = Preset.named("smoke").pretrain
VARIANTS = {
    "plain": ("mlm,nsp,whp,pad", {}),
    "pad labels and subwords": ("mlm,nsp,whp,pad", {"pad": {"chunk_labels": True, "subword_alpha": 0.2}}),
    "rtd": ("mlm,rtd,nsp", {}),
}


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tok"))


def _objectives(tok, names: str, overrides: dict) -> list:
    cfg = dataclasses.replace(SMOKE, objectives=[{"name": n, **overrides.get(n, {})} for n in names.split(",")])
    return list(build_objectives(cfg, tok).values())


def _as_read_by_the_driver(rows: dict) -> dict:
    """The same rows as the pretraining driver hands them over: from Arrow, list columns as `Ragged`."""
    return rows_from_arrow(pa.table({k: pa.array([x.tolist() if isinstance(x, np.ndarray) else x for x in v])
                                     for k, v in rows.items()}))


def _assert_same_batches(old: ReferenceCollator, new: Collator, row_batches: list[dict], lengths) -> None:
    for length in lengths:
        for step, rows in enumerate(row_batches):
            arrow_rows = _as_read_by_the_driver(rows)
            assert isinstance(arrow_rows["a_ids"], Ragged)
            for epoch in (0, 1):  # PAD draws its pairs afresh after the first pass
                a = old(rows, step=step, max_len=length, epoch=epoch)
                for b in (new(rows, step=step, max_len=length, epoch=epoch),
                          new(arrow_rows, step=step, max_len=length, epoch=epoch)):
                    assert a.keys() == b.keys()
                    for k in a:
                        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), (k, length, step, epoch)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_array_collation_makes_exactly_the_batches_of_the_per_row_collation(tok, variant):
    names, overrides = VARIANTS[variant]
    objs = _objectives(tok, names, overrides)
    kw = dict(max_len=64, layout_fraction=0.5, subword_alpha=0.1 if variant != "plain" else 0.0, seed=3)
    _assert_same_batches(ReferenceCollator(objs, tok, **kw), Collator(objs, tok, **kw), batches(tok), (64, 32, 20))


@pytest.mark.ray
def test_the_array_collation_makes_exactly_the_batches_of_the_per_row_collation_on_the_smoke_corpus(smoke_corpus):
    import json

    import pyarrow.parquet as pq

    from alignlab.platform.encoder.tokenizer import Tokenizer

    corpus_tok = Tokenizer(smoke_corpus / "tokenizer.model")
    names = json.loads((smoke_corpus / "manifest.json").read_text())["shards"]["train"]
    row_batches = []
    for name in names:  # numpy columns, as Ray Data's batches are
        for rb in pq.ParquetFile(smoke_corpus / "shards" / name).iter_batches(batch_size=16):
            row_batches.append({c: rb.column(c).to_numpy(zero_copy_only=False) for c in rb.schema.names})
    objs = _objectives(corpus_tok, "mlm,nsp,whp,pad", {})
    kw = dict(max_len=64, layout_fraction=0.5)
    _assert_same_batches(ReferenceCollator(objs, corpus_tok, **kw), Collator(objs, corpus_tok, **kw), row_batches[:12],
                         (64, 32))


def test_a_ragged_column_reads_like_the_numpy_column_of_ray_datas_batches():
    arr = pa.array([[1, 2], None, [], [3, 4, 5], [6]], type=pa.list_(pa.int32())).slice(1, 4)
    col = Ragged.from_arrow(arr)
    assert len(col) == 4 and col[0] is None and col[1].tolist() == [] and col[-1].tolist() == [6]
    assert [None if x is None else x.tolist() for x in col] == [None, [], [3, 4, 5], [6]]
    assert col.lengths().tolist() == [0, 0, 3, 1]
    assert [x.tolist() for x in col[2:]] == [[3, 4, 5], [6]]
    as_numpy = np.asarray(col)
    assert as_numpy.dtype == object and as_numpy[0] is None and as_numpy[2].tolist() == [3, 4, 5]
    joined = Ragged.concat([col, Ragged.from_arrow(pa.array([[7, 8]], type=pa.list_(pa.int32())))])
    assert [None if x is None else x.tolist() for x in joined] == [None, [], [3, 4, 5], [6], [7, 8]]
    with pytest.raises(IndexError):
        col[4]


def test_draws_computed_one_by_one_are_the_generators_own_and_leave_it_where_its_calls_would():
    for seed in range(20):
        calls, computed = np.random.default_rng([seed, 1]), np.random.default_rng([seed, 1])
        if seed % 2:  # a generator holding half a word from an earlier bounded draw
            calls.integers(5), computed.integers(5)
        one = OneByOne.of(computed)
        plan = np.random.default_rng(seed)
        for _ in range(1500):
            if plan.random() < 0.5:
                assert calls.random() == one.random()
            else:  # 1 draws nothing; the large ranges make Lemire's method reject and draw again
                m = int(plan.choice([1, 2, 3, 4095, 2**31 + 12345, 3_000_000_000, int(plan.integers(1, 5000))]))
                assert int(calls.integers(m)) == one.integers(m), (seed, m)
        one.close()
        assert calls.bit_generator.state == computed.bit_generator.state
        assert calls.gumbel(size=4).tolist() == computed.gumbel(size=4).tolist()


class _EditsInPlace:
    """An objective that edits the chunk lists it is handed in place, as a plugin may."""
    name, example_format, labelled_keys = "edits", "pair", ()

    def load(self, ex, rows):
        pass

    def corrupt(self, ex, rng):
        for i in range(0, len(ex.a), 2):
            ex.a[i][0] = 7
            if ex.b[i]:
                ex.b[i][-1] = 9

    def add_labels(self, batch, ex, rng):
        pass


def test_a_chunk_an_objective_edited_in_place_is_collated_with_its_edit(tok):
    objs = [*_objectives(tok, "nsp,whp", {}), _EditsInPlace()]
    rows = batches(tok)[0]
    from_numpy = Collator(objs, tok, max_len=64)(rows, step=1)
    from_arrow = Collator(objs, tok, max_len=64)(_as_read_by_the_driver(rows), step=1)
    for k in from_numpy:
        assert torch.equal(from_numpy[k], from_arrow[k]), k
    assert (from_arrow["input_ids"][::2, 1] == 7).all()


def test_padding_to_the_full_length_changes_only_the_padding_masks_and_labels_included(tok):
    # The objectives draw their labels at the batch's own width, then it is widened (`batching.widen`): a compiled
    # run trains on the eager run's masks.
    objs = _objectives(tok, "mlm,nsp,whp,pad", {})
    rows = batches(tok)[0]
    short = Collator(objs, tok, max_len=64)(rows, step=2)
    full = Collator(objs, tok, max_len=64, pad_to_max_len=True)(rows, step=2)
    T = short["input_ids"].shape[1]
    assert full["input_ids"].shape[1] == 64 > T
    for k, v in short.items():
        if v.dim() == 2:
            assert torch.equal(full[k][:, :T], v) and not full["attention_mask"][:, T:].any()
            if k in ("mlm", "whp"):
                assert (full[k][:, T:] == IGNORE).all(), k
        else:
            assert torch.equal(full[k], v)


def test_the_prefetcher_keeps_order_raises_a_sources_error_at_its_item_and_stops_its_thread():
    assert list(Prefetcher(iter(range(50)), depth=3)) == list(range(50))
    assert list(Prefetcher(iter(range(5)), depth=0)) == list(range(5))

    def failing():
        yield 1
        yield 2
        raise ValueError("record 3 is bad")

    got = []
    with pytest.raises(ValueError, match="record 3 is bad"):
        for x in Prefetcher(failing(), depth=2):
            got.append(x)
    assert got == [1, 2]
    with Prefetcher(iter(range(10**9)), depth=2) as p:  # left early: closing stops the thread
        next(p)
        thread = p._thread
    assert thread is not None and not thread.is_alive()
    assert not any(t.name == "alignlab-prefetch" and t.is_alive() for t in threading.enumerate())



def _threads_named_like(tid: int) -> set[int]:
    """The process's threads that carry thread `tid`'s name: the threads it started and named nothing else, as
    OpenMP's workers are (Ray's and torch's own threads have names of their own)."""
    def name(t):
        return Path(f"/proc/self/task/{t}/comm").read_text()

    mine = name(tid)
    return {int(t) for t in Path("/proc/self/task").iterdir() for t in [t.name] if name(t) == mine}


@pytest.mark.skipif(not Path("/proc/self/task").is_dir() or "OpenMP" not in torch.__config__.parallel_info(),
                    reason="counts OpenMP's threads through Linux's /proc")
def test_a_prefetch_thread_runs_its_torch_operations_without_a_team_of_threads_of_its_own():
    """A second OpenMP team beside the training thread's made every CPU step slower (prefetch.py)."""
    kept = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        big = torch.ones(1 << 22)
        big.sum()  # the training thread's team exists

        def source():
            before = _threads_named_like(threading.get_native_id())
            (big * 2).sum()  # large enough to split across threads
            yield torch.get_num_threads(), _threads_named_like(threading.get_native_id()) - before

        [(threads, started)] = list(Prefetcher(source(), depth=1))
        assert threads == 1 and started == set()
        assert torch.get_num_threads() == 2  # the training thread keeps its own
    finally:
        torch.set_num_threads(kept)

def _run(tok, cfg, *, steps_from: dict | None = None):
    trainer = Pretrainer(cfg, tok)
    if steps_from is not None:
        trainer.load_state_dict(steps_from)
    reported, rows_seen = [], []

    def report(m, ckpt):
        reported.append(m)
        rows_seen.append(list(trainer.last_row_ids))

    train_loop(trainer, lambda epoch: iter(batches(tok, num=3)), report=report, log_every=1)
    return trainer, reported, rows_seen


def test_collating_on_a_prefetch_thread_trains_the_same_weights_on_the_same_rows_and_resumes_exactly(tok):
    cfg = dataclasses.replace(SMOKE, objectives="mlm,nsp,whp,pad", max_steps=7, checkpoint_every=3, precision="fp32",
                              prefetch_batches=0)
    plain, plain_metrics, plain_rows = _run(tok, cfg)
    ahead, ahead_metrics, ahead_rows = _run(tok, dataclasses.replace(cfg, prefetch_batches=3))
    assert ahead_rows == plain_rows and len(plain_rows) == 7
    def timeless(m):  # wall-clock figures differ between any two runs
        return {k: v for k, v in m.items() if k != "data_wait_fraction" and not k.startswith("throughput/")}
    assert [timeless(m) for m in ahead_metrics] == [timeless(m) for m in plain_metrics]
    for k, v in plain.model.state_dict().items():
        assert torch.equal(v, ahead.model.state_dict()[k]), k
    # Stopped at step 4 (the second pass's first batch), then resumed on the prefetch thread: the same weights.
    first = Pretrainer(dataclasses.replace(cfg, max_steps=7), tok)
    part = dataclasses.replace(cfg, max_steps=4, prefetch_batches=2)
    stopped = Pretrainer(part, tok)
    train_loop(stopped, lambda epoch: iter(batches(tok, num=3)), report=lambda m, c: None, log_every=1)
    assert (stopped.state.step, stopped.state.epoch, stopped.state.batches_in_epoch) == (4, 1, 1)
    del first
    resumed, _, resumed_rows = _run(tok, dataclasses.replace(cfg, prefetch_batches=2),
                                    steps_from=stopped.state_dict())
    assert resumed_rows == plain_rows[4:]
    for k, v in plain.model.state_dict().items():
        assert torch.equal(v, resumed.model.state_dict()[k]), k


def test_collating_processes_train_the_same_weights_on_the_same_rows_and_resume_exactly(tok):
    # Windows of 2 row batches over passes of 3: whole and partial windows, and a resume inside a window.
    cfg = dataclasses.replace(SMOKE, objectives="mlm,nsp,whp,pad", max_steps=7, checkpoint_every=3, precision="fp32",
                              prefetch_batches=0, bucket_batches=2)
    plain, plain_metrics, plain_rows = _run(tok, cfg)
    apart, apart_metrics, apart_rows = _run(tok, dataclasses.replace(cfg, collate_workers=2, prefetch_batches=2))
    assert apart_rows == plain_rows and len(plain_rows) == 7

    def timeless(m):
        return {k: v for k, v in m.items() if k != "data_wait_fraction" and not k.startswith("throughput/")}
    assert [timeless(m) for m in apart_metrics] == [timeless(m) for m in plain_metrics]
    for k, v in plain.model.state_dict().items():
        assert torch.equal(v, apart.model.state_dict()[k]), k
    stopped = Pretrainer(dataclasses.replace(cfg, max_steps=4, collate_workers=1), tok)
    train_loop(stopped, lambda epoch: iter(batches(tok, num=3)), report=lambda m, c: None, log_every=1)
    assert (stopped.state.step, stopped.state.epoch, stopped.state.batches_in_epoch) == (4, 1, 1)
    resumed, _, resumed_rows = _run(tok, dataclasses.replace(cfg, collate_workers=1),
                                    steps_from=stopped.state_dict())
    assert resumed_rows == plain_rows[4:]
    for k, v in plain.model.state_dict().items():
        assert torch.equal(v, resumed.model.state_dict()[k]), k


def test_an_error_in_a_collating_process_stops_the_loop_with_that_error(tok):
    cfg = dataclasses.replace(SMOKE, objectives="mlm,nsp", max_steps=3, collate_workers=1)
    broken = [{k: v for k, v in rows.items() if k != "has_next"} for rows in batches(tok, num=3)]
    with pytest.raises(KeyError, match="has_next"):
        train_loop(Pretrainer(cfg, tok), lambda epoch: iter(broken), report=lambda m, c: None)


def test_metrics_read_every_few_steps_are_the_means_of_the_steps_read_one_by_one(tok):
    cfg = dataclasses.replace(SMOKE, objectives="mlm,nsp", precision="fp32", model=dataclasses.replace(
        SMOKE.model, dropout=0.0))
    rows = batches(tok, num=3)
    one, three = Pretrainer(cfg, tok), Pretrainer(cfg, tok)
    each = [one.train_step(one.collate(r, step=i)) for i, r in enumerate(rows)]
    for i, r in enumerate(rows):
        three.step(three.collate(r, step=i))
    mean = three.read_metrics()
    assert mean["train/loss"] == pytest.approx(np.mean([m["train/loss"] for m in each]), rel=1e-6)
    assert mean["train/nsp/loss"] == pytest.approx(np.mean([m["train/nsp/loss"] for m in each]), rel=1e-6)
    assert 0.0 <= mean["train/mlm/accuracy"] <= 1.0 and mean["lr"] == each[-1]["lr"]
    with pytest.raises(ValueError, match="before any step"):
        three.read_metrics()


class _NoDeviceReads:
    """Fails on every way a tensor's value reaches Python, and on `nonzero` (whose output size is a value)."""

    METHODS = ("__bool__", "__float__", "__int__", "item", "tolist", "nonzero")

    def __init__(self, monkeypatch):
        self.mp = monkeypatch

    def __enter__(self):
        for name in self.METHODS:
            def refuse(*a, _name=name, **k):
                raise AssertionError(f"the step read a tensor's value ({_name})")
            self.mp.setattr(torch.Tensor, name, refuse)
        self.mp.setattr(torch, "nonzero", lambda *a, **k: (_ for _ in ()).throw(AssertionError("torch.nonzero")))
        return self

    def __exit__(self, *exc):
        self.mp.undo()


@pytest.mark.parametrize("alibi", [0.0, 4.0])
def test_the_forward_and_loss_of_a_prepared_unpadded_batch_read_no_tensor_value(tok, monkeypatch, alibi):
    cfg = dataclasses.replace(SMOKE, objectives="mlm,nsp,whp,pad", precision="fp32",
                              model=dataclasses.replace(SMOKE.model, alibi=alibi, dropout=0.0))
    trainer = Pretrainer(cfg, tok)
    col = Collator(list(trainer.objectives.values()), tok, max_len=64, pad_to_max_len=True, layout_fraction=0.5)
    rows = batches(tok)[0]
    batch = col(rows, step=0)
    batch["attention_mask"][:] = True  # every row as long as the batch (as a packed batch would be)
    prepared = trainer.prepare(batch)
    assert prepared["has_padding"] is False
    expected = trainer.forward(trainer.to_device(dict(prepared, has_padding=True)))
    with _NoDeviceReads(monkeypatch):
        out = trainer.forward(trainer.to_device(prepared))
        total = sum(loss for loss, _ in out.values())
        total.backward()
    for name, (loss, sums) in out.items():  # no mask gives the all-ones mask's numbers (alibi's bias kept)
        assert torch.allclose(loss, expected[name][0], rtol=1e-5, atol=1e-6), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_training_step_never_synchronizes_with_the_host(tok):
    cfg = dataclasses.replace(SMOKE, objectives="mlm,nsp,whp,pad", use_gpu=True)
    trainer = Pretrainer(cfg, tok, device="cuda")
    batch = trainer.prepare(trainer.collate(batches(tok)[0], step=0))
    trainer.step(batch)  # warm: lazy initialisation may synchronize once
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        trainer.step(trainer.prepare(trainer.collate(batches(tok)[1], step=1)))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert np.isfinite(trainer.read_metrics()["train/loss"])


@pytest.mark.slow
def test_a_compiled_smoke_step_matches_the_eager_step(tok):
    """`PretrainConfig.compile`: the whole step compiled (static labelled rows, the chunked MLM loss) gives the eager
    step's losses and weights on the same batch within float tolerance. Slow: inductor compiles C++ kernels on CPU (over a minute here)."""
    cfg = dataclasses.replace(SMOKE, objectives="mlm,nsp,whp", precision="fp32",
                              model=dataclasses.replace(SMOKE.model, dropout=0.0))
    eager = Pretrainer(cfg, tok)
    compiled = Pretrainer(dataclasses.replace(cfg, compile=True, loss_chunk_rows=8), tok)
    assert compiled.collate.pad_to_max_len and not eager.collate.pad_to_max_len
    assert compiled.objectives["mlm"].output_chunk_rows == 8 and eager.objectives["mlm"].output_chunk_rows == 0
    for step, rows in enumerate(batches(tok, num=2)):
        batch = compiled.collate(rows, step=step)
        # The compiled step pads MLM's and WHP's labelled rows to their bound: one shape per width.
        ready = compiled.prepare(batch)
        assert ready["mlm.rows"].numel() == compiled.objectives["mlm"].max_labelled("mlm", *batch["mlm"].shape)
        a, b = eager.train_step(batch), compiled.train_step(ready)
        for k in ("train/loss", "train/mlm/loss", "train/nsp/loss", "train/whp/loss"):
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-5), k
    for k, v in eager.model.state_dict().items():
        assert torch.allclose(v, compiled.model.state_dict()[k], rtol=1e-4, atol=1e-5), k


def test_the_compiled_step_traced_whole_without_inductor_trains_the_eager_steps_losses_and_weights(tok):
    """The default run's form of the test above: the same compiled step, captured by TorchDynamo and differentiated
    by AOTAutograd as under inductor, but run by the `aot_eager` backend (no kernels generated: seconds, not over a
    minute). Each compiled function must be captured whole, with no graph break (a break would run part of the step
    eagerly, and a GPU would launch it kernel by kernel), and train to the eager step's losses and weights."""
    from torch._dynamo.utils import counters

    cfg = dataclasses.replace(SMOKE, objectives="mlm,nsp,whp", precision="fp32",
                              model=dataclasses.replace(SMOKE.model, dropout=0.0))
    torch._dynamo.reset()
    counters.clear()
    eager = Pretrainer(cfg, tok)
    compiled = Pretrainer(dataclasses.replace(cfg, compile=True, loss_chunk_rows=8), tok, compile_backend="aot_eager")
    for step, rows in enumerate(batches(tok, num=2)):
        batch = compiled.collate(rows, step=step)
        a, b = eager.train_step(batch), compiled.train_step(compiled.prepare(batch))
        for k in ("train/loss", "train/mlm/loss", "train/nsp/loss", "train/whp/loss"):
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-5), (step, k)
    assert not counters["graph_break"], f"the compiled step broke its graph: {dict(counters['graph_break'])}"
    assert counters["stats"]["unique_graphs"] >= 2  # the forward with its losses, and the clipping
    for k, v in eager.model.state_dict().items():
        assert torch.allclose(v, compiled.model.state_dict()[k], rtol=1e-4, atol=1e-5), k


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_compiled_cuda_step_replayed_as_cuda_graphs_trains_the_compiled_steps_losses_and_weights(tok):
    """`PretrainConfig.cuda_graphs`: the same compiled kernels replayed as graphs, so the same losses and weights
    (dropout off), and the metrics of every step kept although each replay writes into the same memory."""
    cfg = dataclasses.replace(SMOKE, objectives="mlm,nsp,whp,pad", precision="bf16", use_gpu=True, compile=True,
                              model=dataclasses.replace(SMOKE.model, dropout=0.0))
    plain, graphs = Pretrainer(cfg, tok, device="cuda"), Pretrainer(dataclasses.replace(cfg, cuda_graphs=True), tok,
                                                                    device="cuda")
    assert graphs._graphs and not plain._graphs
    for step, rows in enumerate(batches(tok, num=4)):
        batch = plain.collate(rows, step=step)
        a, b = plain.train_step(batch), graphs.train_step(graphs.collate(rows, step=step))
        for k in ("train/loss", "train/mlm/loss", "train/nsp/loss"):
            assert b[k] == pytest.approx(a[k], rel=1e-3, abs=1e-4), (step, k)
    for k, v in plain.model.state_dict().items():
        assert torch.allclose(v, graphs.model.state_dict()[k], rtol=1e-3, atol=1e-4), k


def test_cuda_graphs_are_refused_without_compile_or_with_several_workers_and_never_name_another_model(tok):
    from alignlab.platform.pretrain.models import model_id

    with pytest.raises(ValueError, match="cuda_graphs .* needs compile=True and one worker"):
        dataclasses.replace(SMOKE, cuda_graphs=True)
    with pytest.raises(ValueError, match="num_workers=2"):
        dataclasses.replace(SMOKE, compile=True, num_workers=2, cuda_graphs=True)
    compiled = dataclasses.replace(SMOKE, compile=True, use_gpu=True)
    assert model_id("bundled-x", dataclasses.replace(compiled, cuda_graphs=True)) == model_id("bundled-x", compiled)
    cpu = Pretrainer(dataclasses.replace(SMOKE, compile=True, cuda_graphs=True), tok)
    assert not cpu._graphs  # a CPU has no CUDA graphs: the compiled step as it is


def test_a_compiled_step_attends_without_a_mask_where_its_batch_has_no_padding_and_trains_on_both(tok):
    """Under compile too an unpadded batch passes no mask, so that SDPA may choose its fused kernel on a GPU; a
    padded batch of the same width keeps it. The eager backend: the same graph capture, no kernels compiled."""
    cfg = dataclasses.replace(SMOKE, objectives="mlm,nsp,whp,pad", precision="fp32", compile=True,
                              model=dataclasses.replace(SMOKE.model, dropout=0.0))
    trainer = Pretrainer(cfg, tok, compile_backend="eager")
    col = Collator(list(trainer.objectives.values()), tok, max_len=64, pad_to_max_len=True, layout_fraction=0.5)
    padded = col(batches(tok)[0], step=0)
    full = {k: v.clone() for k, v in padded.items()}
    full["attention_mask"][:] = True
    assert not bool(padded["attention_mask"].all())
    assert trainer.prepare(full)["has_padding"] is False and trainer.prepare(padded)["has_padding"] is True
    for batch in (full, padded, full):
        metrics = trainer.train_step(trainer.prepare(batch))
        assert np.isfinite(metrics["train/loss"]), metrics
    assert torch._dynamo.config.recompile_limit >= 32
