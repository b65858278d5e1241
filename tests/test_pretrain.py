"""Pretraining: the plain loop (overfit, checkpoint, exact resume) and the real Ray Train runs
(a killed worker and a rerun both continue at the exact step and end with the uninterrupted weights)."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from fault_hooks import Probe, assert_ctrl_c_raises_keyboard_interrupt, crash_once_at, probed_steps, registered

from alignlab.platform.encoder.tokenizer import Tokenizer
from alignlab.platform.presets import Preset
from alignlab.platform.pretrain.loop import train_loop
from alignlab.platform.pretrain.pretrain import Pretrainer
from alignlab.platform.runtime.progress import ProgressLine

SMOKE = dataclasses.replace(Preset.named("smoke").pretrain, objectives="mlm,nsp,whp,pad", log_every=1)


def _row_batches(corpus, batch_size):
    t = pq.read_table(sorted((corpus / "shards" / "train").glob("*.parquet"))[0])
    cols = {k: np.asarray(v, dtype=object) for k, v in t.to_pydict().items()}
    n = t.num_rows // batch_size
    return [{k: v[i * batch_size:(i + 1) * batch_size] for k, v in cols.items()} for i in range(n)]


@pytest.fixture(scope="module")
def corpus_and_tok(smoke_corpus):
    return smoke_corpus, Tokenizer(smoke_corpus / "tokenizer.model")


@pytest.mark.ray
def test_the_progress_line_is_throttled_always_ends_and_counts_only_this_runs_steps():
    now = [100.0]
    line = ProgressLine("m", max_steps=1000, start_step=400, every_s=30, clock=lambda: now[0])
    now[0] = 110.0
    assert line.update(450, 5.0) is None  # 10 s since the start: too soon
    now[0] = 130.0
    out = line.update(500, 4.25)  # 100 steps in 30 s since the resume, 500 to go: 150 s
    assert out == "[pretrain m] step 500/1000 (50%), loss 4.250, 3.33 steps/s, ETA 2m30s"
    now[0] = 131.0
    assert line.update(1000, 3.0).startswith("[pretrain m] step 1000/1000 (100%)")  # the last step always prints


@pytest.mark.ray
def test_the_tiny_model_overfits_one_batch(corpus_and_tok):
    corpus, tok = corpus_and_tok
    cfg = dataclasses.replace(SMOKE, objectives="mlm,nsp,whp,pad", lr=1e-2, model=dataclasses.replace(SMOKE.model, dropout=0.0))
    tr = Pretrainer(cfg, tok)
    rows = _row_batches(corpus, 16)[0]
    first = tr.train_step(tr.collate(rows, step=0))["train/loss"]
    for _ in range(60):
        last = tr.train_step(tr.collate(rows, step=0))["train/loss"]
    assert last < 0.3 * first


@pytest.mark.ray
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_checkpoint_round_trip_gives_equal_weights_and_the_exact_next_steps(corpus_and_tok, tmp_path, precision):
    corpus, tok = corpus_and_tok
    batches = _row_batches(corpus, SMOKE.batch_size)
    cfg = dataclasses.replace(SMOKE, max_steps=8, precision=precision)

    def run(trainer, upto):
        trainer.cfg = dataclasses.replace(cfg, max_steps=upto)
        train_loop(trainer, lambda epoch: iter(batches), report=lambda m, c: None)

    straight = Pretrainer(cfg, tok)
    run(straight, 8)
    first = Pretrainer(cfg, tok)
    run(first, 4)
    torch.save(first.state_dict(), tmp_path / "state.pt")
    resumed = Pretrainer(cfg, tok)
    resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=False))
    assert resumed.state.step == 4 and resumed.state.batches_in_epoch == 4
    assert all(torch.equal(a, b) for a, b in zip(first.model.state_dict().values(), resumed.model.state_dict().values()))
    run(resumed, 8)
    for (k, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), f"{k} differs after resume"


def _weights(mdir):
    return torch.load(mdir / "final" / "model.pt", weights_only=True)


def _steps_logged(mdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps = []
    for f in sorted((mdir / "tensorboard").glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(f))
        acc.Reload()
        if "train/loss" in acc.Tags()["scalars"]:
            steps += [e.step for e in acc.Scalars("train/loss")]
    return sorted(steps)


@pytest.fixture
def uninterrupted(smoke_model):
    """SMOKE, trained straight through at a root of its own: the session's `smoke_model` (conftest.py, the same
    config)."""
    return smoke_model


@pytest.mark.ray
def test_pretraining_writes_a_registered_model_with_eval_metrics_and_tensorboard(uninterrupted, smoke_corpus):
    from alignlab.platform.pretrain.driver import pretrain
    from alignlab.platform.pretrain.models import list_models

    ev = json.loads((uninterrupted / "final" / "eval.json").read_text())
    assert ev["step"] == SMOKE.max_steps
    for name in ("mlm", "nsp", "whp", "pad"):
        assert 0 <= ev[f"eval/{name}/accuracy"] <= 1 and ev[f"eval/{name}/perplexity"] >= 1
    assert _steps_logged(uninterrupted) == list(range(1, SMOKE.max_steps + 1))
    (row,) = list_models(uninterrupted.parent.parent)
    assert row["finished"] and row["objectives"] == "mlm+nsp+whp+pad"
    # A second request for the same config reuses the finished model without training.
    before = (uninterrupted / "final" / "model.pt").stat().st_mtime_ns
    assert pretrain(smoke_corpus, SMOKE, uninterrupted.parent.parent) == uninterrupted
    assert (uninterrupted / "final" / "model.pt").stat().st_mtime_ns == before


# One short run shows three things, each of which needs a pretraining that really runs.
@pytest.mark.ray
def test_a_run_given_a_relative_corpus_folder_prints_and_records_its_precision_and_a_ctrl_c_after_it_stops_the_driver(
        smoke_corpus, tmp_path, capsys, monkeypatch, interactive_sigint):
    """The corpus folder may be named relative to the working directory (the Train workers start in folders of
    their own); the precision `auto` resolved to is printed and recorded everywhere; and a Ctrl-C after `pretrain`
    returns stops the driver with KeyboardInterrupt, not swallowed by a handler Ray Train left behind."""
    import os

    from alignlab.platform.corpus.corpus import load_manifest
    from alignlab.platform.pretrain.driver import pretrain
    from alignlab.platform.pretrain.models import list_models, model_id
    from alignlab.platform.pretrain.pretrain import with_resolved_precision

    monkeypatch.chdir(smoke_corpus.parent)
    relative = os.path.relpath(smoke_corpus)
    assert not os.path.isabs(relative)
    cfg = dataclasses.replace(SMOKE, precision="auto", max_steps=2, checkpoint_every=2)
    used = with_resolved_precision(cfg).precision  # bf16 on a CPU where it trains faster, fp32 elsewhere
    mdir = pretrain(relative, cfg, tmp_path)
    assert (mdir / "final" / "model.pt").is_file()
    assert_ctrl_c_raises_keyboard_interrupt()
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"[pretrain {mdir.name}] precision {used} (auto: bf16 ")
    info = json.loads((mdir / "config.json").read_text())
    assert (info["precision"], info["requested_precision"], info["global_batch_size"]) == (used, "auto", cfg.batch_size)
    assert json.loads((mdir / "final" / "eval.json").read_text())["precision"] == used
    assert json.loads((mdir / "final" / "model_config.json").read_text())["pretrain"]["precision"] == used
    (row,) = list_models(tmp_path)
    assert row["precision"] == used
    # The model is the one an explicit request for that precision names.
    explicit = dataclasses.replace(cfg, precision=used)
    assert mdir.name == model_id(load_manifest(smoke_corpus)["corpus_id"], explicit)
    assert pretrain(smoke_corpus, explicit, tmp_path) == mdir


# -m slow (~28 s): the default suite kills a Train worker mid-run and checks the resumed run's steps and final weights
# against an uninterrupted run twice, in harder settings: one worker resuming from a checkpoint taken by the minute
# and uploaded in the background (test_checkpoints.py), and one of two data-parallel ranks with dropout on
# (test_data_parallel.py).
@pytest.mark.slow
@pytest.mark.ray
def test_a_killed_worker_resumes_from_the_last_checkpoint_with_no_step_repeated_or_skipped(
        uninterrupted, smoke_corpus, tmp_path):
    from alignlab.platform.pretrain.driver import pretrain

    # Checkpoints at steps 5 and 10: rank 0 exits hard after step 6, before reporting it; Ray Train restarts
    # the worker group, which must continue at step 6 from the step-5 checkpoint.
    mdir = pretrain(smoke_corpus, SMOKE, tmp_path, max_failures=2, after_step=crash_once_at(6))
    assert (mdir / ".crashed-once").exists()
    assert _steps_logged(mdir) == list(range(1, SMOKE.max_steps + 1))
    for (k, a), b in zip(_weights(uninterrupted).items(), _weights(mdir).values()):
        assert torch.equal(a, b), f"{k} differs from the uninterrupted run"


# One run of the session's smoke model's config shows three things, each of which needs a pretraining that really
# runs (the first two are also tested in-process, without Ray: tests/test_input_path.py).
@pytest.mark.ray
def test_a_worker_collating_in_processes_and_reading_on_its_training_thread_after_a_plain_ray_init_trains_the_same_weights(
        uninterrupted, smoke_corpus, tmp_path):
    """Other ways to the same rows in the same order, in one run, than the session's `smoke_model` took (batches
    collated on the worker's thread, rows read ahead on a prefetch thread):
    - `collate_workers=1` collates the batches in a process of the Train worker's own (spawned inside the worker);
    - `prefetch_batches=0` fetches Ray Data's rows on the training thread, nothing ahead;
    - a script that calls `ray.init()` itself never ran alignlab's DataContext setup (row order left to chance):
      before the fix two runs of one mini model id from such scripts trained on different rows
      (docs/journal/round-12.md), so `pretrain()` sets the order itself."""
    import ray.data

    from alignlab.platform.pretrain.driver import pretrain

    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = False  # what a process that only called ray.init() has
    try:
        mdir = pretrain(smoke_corpus, dataclasses.replace(SMOKE, collate_workers=1, prefetch_batches=0), tmp_path)
        assert ctx.execution_options.preserve_order, "pretrain() left the row order to chance"
    finally:
        ctx.execution_options.preserve_order = True
    # Where batches are collated and how far ahead rows are read are not part of what the model learns.
    assert mdir.name == uninterrupted.name
    for (k, a), b in zip(_weights(uninterrupted).items(), _weights(mdir).values()):
        assert torch.equal(a, b), (f"{k} differs from the run that collated on the worker's thread and prefetched on a "
                                   "thread in the deterministic order")


@pytest.mark.ray
def test_rerunning_after_a_failed_run_continues_at_the_exact_step(uninterrupted, smoke_corpus, tmp_path):
    from alignlab.platform.pretrain.driver import pretrain
    from alignlab.platform.pretrain.models import is_finished

    from ray.train import TrainingFailedError

    with pytest.raises(TrainingFailedError):
        pretrain(smoke_corpus, SMOKE, tmp_path, max_failures=0, after_step=crash_once_at(11))
    mdir = next((tmp_path / "models").iterdir())
    assert (mdir / ".crashed-once").exists(), "the run failed, but not by the injected crash after step 11"
    assert not is_finished(mdir), "an unfinished run must not be registered as finished"
    probe = tmp_path / "probe"
    probe.mkdir()
    mdir2 = pretrain(smoke_corpus, SMOKE, tmp_path, max_failures=0, after_step=registered(Probe(str(probe))))
    assert mdir2 == mdir
    # Checkpoints at steps 5 and 10: the rerun trains steps 11 and 12 only, not 1 to 12 again.
    assert SMOKE.checkpoint_every == 5
    assert [r["step"] for r in probed_steps(probe, 0)] == [11, 12]
    assert _steps_logged(mdir) == list(range(1, SMOKE.max_steps + 1))
    for (k, a), b in zip(_weights(uninterrupted).items(), _weights(mdir).values()):
        assert torch.equal(a, b), f"{k} differs from the uninterrupted run"


@pytest.mark.ray
def test_rank_0_reads_the_held_out_rows_in_the_batches_ray_data_gives_over_the_same_shards(smoke_corpus):
    """Rank 0 reads the held-out rows with pyarrow (`driver.eval_batches`); they were a Ray dataset before, and the
    eval metrics of every model id stay what that dataset's batches gave. The train split has several files, so
    batches that span two of them are checked too, and 5 rows leave a shorter last batch."""
    batch_size = 5
    from alignlab.platform.pretrain.driver import eval_batches, read_shards

    for split in ("eval", "train"):
        paths = sorted(str(p) for p in (smoke_corpus / "shards" / split).glob("*.parquet"))
        ours = list(eval_batches(paths, None, batch_size))
        theirs = list(read_shards(paths, None).iter_batches(batch_size=batch_size, batch_format="pyarrow"))
        assert [t.num_rows for t in ours] == [t.num_rows for t in theirs], split
        for a, b in zip(ours, theirs):
            assert a.schema == b.schema and a.combine_chunks().equals(b.combine_chunks()), split


@pytest.mark.ray
def test_bad_pretraining_requests_get_clear_errors(smoke_corpus, tmp_path):
    from alignlab.platform.pretrain.driver import pretrain

    with pytest.raises(ValueError, match="not a finished corpus"):
        pretrain(tmp_path, SMOKE, tmp_path)
    with pytest.raises(ValueError, match="unknown objective 'xyz'"):
        dataclasses.replace(SMOKE, objectives="mlm,xyz")


@pytest.mark.ray
def test_whp_on_a_web_only_corpus_is_refused_before_training(ray_session, tmp_path):
    from alignlab.platform.corpus.corpus import build_corpus
    from alignlab.platform.presets import Preset
    from alignlab.platform.pretrain.driver import pretrain

    f = tmp_path / "web.txt"
    f.write_text("\n\n".join(" ".join(["plain web text about models and data"] * 10) for _ in range(30)))
    cfg = dataclasses.replace(Preset.named("smoke").corpus, source="web", paths=(str(f),), vocab_size=100,
                              allow_smaller_vocab=True)
    cdir = build_corpus(cfg, tmp_path / "root", progress=False)
    with pytest.raises(ValueError, match="'whp' needs linked .*web-only"):
        pretrain(cdir, dataclasses.replace(SMOKE, objectives="mlm,whp"), tmp_path / "root")
    assert not list((tmp_path / "root").glob("models/*"))


