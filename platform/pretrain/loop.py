"""The pretraining loop: row batches in, optimizer steps, metrics every `log_every` steps, checkpoints.

No Ray here (docs/architecture.md#ray-at-the-edges): `train_loop` takes an iterator of row batches per pass, a
`report` callable and an
`all_finite` collective; the Ray Train driver (`pretrain/driver.py`) and the tests supply them. Batches are collated and
prepared on a background thread `PretrainConfig.prefetch_batches` ahead (`prefetch.Prefetcher`), keyed by step as
on the training thread, and the step waits for the device only when metrics are read.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from alignlab.platform.bucketing import bucketed
from alignlab.platform.pretrain.prefetch import Prefetcher
from alignlab.platform.throughput import run_throughput

if TYPE_CHECKING:
    from alignlab.platform.pretrain.pretrain import Pretrainer, TrainState


class NonFiniteLossError(ValueError):
    """A pretraining run whose loss went NaN or infinite: it stops, and its model is never exported."""


def train_loop(trainer: Pretrainer, epoch_batches: Callable[[int], Iterator[dict]], *,
               report: Callable[[dict, bool], None], log_every: int = 10,
               all_finite: Callable[[bool], bool] = lambda ok: ok,
               domain_batches: Callable[[int], Iterator[dict]] | None = None) -> TrainState:
    """Run until `max_steps`. `epoch_batches(epoch)` yields row batches of one pass over the data;
    `report(metrics, checkpoint_now)` is called every `log_every` steps and at every checkpoint step.
    A resumed trainer skips the batches its last checkpoint had consumed (exact data position).
    With a domain phase (`PretrainConfig.domain_fraction`), the steps from `cfg.domain_start_step` on take their
    rows from `domain_batches(epoch)` instead, its passes counted from 0 (`TrainState.phase`).

    `all_finite(ok)`: whether every rank's loss of this step is finite, given this rank's (data-parallel
    workers pass an all-reduce), so that all ranks stop at the same step and none waits in a collective."""
    cfg, st = trainer.cfg, trainer.state
    if cfg.domain_fraction and domain_batches is None:
        raise ValueError(f"PretrainConfig.domain_sources {'+'.join(cfg.domain_sources)}: train_loop needs "
                         "domain_batches for the domain phase")
    waited = 0.0
    t_start = time.perf_counter()
    seconds_before = st.train_seconds  # earlier lives' training time (a resumed run)
    while st.step < cfg.max_steps:
        if st.phase == 0 and st.step >= cfg.domain_start_step:
            st.phase, st.epoch, st.batches_in_epoch = 1, 0, 0
        stop_at, batches = (cfg.domain_start_step, epoch_batches) if st.phase == 0 else (cfg.max_steps, domain_batches)
        consumed = [0]
        feed = _prepared(trainer, iter(batches(st.epoch)), consumed, skip=st.batches_in_epoch, stop_at=stop_at)
        with Prefetcher(feed, depth=cfg.prefetch_batches) as ready:
            while True:
                t0 = time.perf_counter()
                try:
                    position, batch, trainer.last_row_ids = next(ready)
                except StopIteration:
                    break
                waited += time.perf_counter() - t0
                st.batches_in_epoch = position
                # Counted on the host copy of the batch: no device sync.
                st.num_tokens += int(batch["attention_mask"].sum())
                st.num_samples += len(batch["attention_mask"])
                trainer.step(batch)
                st.train_seconds = seconds_before + time.perf_counter() - t_start
                ckpt = st.step % cfg.checkpoint_every == 0 or st.step == cfg.max_steps
                if not (ckpt or st.step % log_every == 0):
                    continue
                metrics = trainer.read_metrics()
                if not all_finite(math.isfinite(metrics["train/loss"])):
                    # Stop before reporting or checkpointing it: a diverged model must never be exported as
                    # finished. The loss is read every log_every steps: the mean of those steps is non-finite.
                    bad = {k: v for k, v in metrics.items() if k.endswith("/loss") and not math.isfinite(v)}
                    raise NonFiniteLossError(
                        f"the training loss became non-finite at step {st.step} (mean of the steps since the last "
                        f"report: {', '.join(f'{k} = {v}' for k, v in bad.items())}, lr "
                        f"{metrics.get('lr', float('nan')):.3g}); lower the learning rate")
                wall = time.perf_counter() - t_start
                tp = run_throughput(trainer)
                metrics.update({"step": st.step, "epoch": st.epoch, "phase": st.phase,
                                "data_wait_fraction": waited / max(wall, 1e-9),
                                "throughput/tokens_per_s": tp["tokens_per_s"],
                                "throughput/samples_per_s": tp["samples_per_s"]})
                if tp["mfu"] is not None:
                    metrics["throughput/mfu"] = tp["mfu"]
                report(metrics, ckpt)
        if st.step >= stop_at:
            continue  # this phase's last step is done: the next pass starts the domain phase, or the loop ends
        if consumed[0] == 0:
            what = "the domain phase's rows" if st.phase else "the training shard"
            raise ValueError(f"{what} yielded no batches: the corpus is empty or smaller than one batch")
        st.epoch += 1
        st.batches_in_epoch = 0
    return st


def _prepared(trainer: Pretrainer, rows_it: Iterator[dict], consumed: list[int], *, skip: int,
              stop_at: int) -> Iterator[tuple[int, dict, list[str]]]:
    """(data position, prepared batch, row ids) for each step from the trainer's step up to `stop_at`, from the
    data position `skip` a resumed run had reached, in length buckets of `PretrainConfig.bucket_batches` row
    batches (`bucketing.bucketed`); `consumed[0]` counts the row batches read. Reads no trainer state the training
    thread changes: the steps are counted here."""
    cfg, st = trainer.cfg, trainer.state
    start, epoch = st.step, st.epoch

    def collate(rows: dict, offset: int, batches: int):
        return trainer.rank_batch(rows, step=start + offset, epoch=epoch, max_len=cfg.seq_len_at(start + offset),
                                  batches=batches)

    step = start
    for position, batch, ids in bucketed(rows_it, cfg.bucket_batches, skip=skip, key=(cfg.seed, st.phase, epoch),
                                         collate=collate, trim=not cfg.compile, counted=consumed):
        if step >= stop_at:
            return
        yield position, trainer.prepare(batch), ids
        step += 1
