"""The pretraining loop: row batches in, optimizer steps, metrics every `log_every` steps, checkpoints.

No Ray here (docs/architecture.md#ray-at-the-edges): `train_loop` takes an iterator of row batches per pass, a
`report` callable and an
`all_finite` collective; the Ray Train driver (`pretrain/driver.py`) and the tests supply them. Batches are collated and
prepared on a background thread `PretrainConfig.prefetch_batches` ahead (`prefetch.Prefetcher`), keyed by step as
on the training thread, and the step waits for the device only when metrics are read.
"""
from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterator

import numpy as np
import torch

from alignlab.platform.pretrain.bucketing import bucketed, window_batches
from alignlab.platform.pretrain.prefetch import Prefetcher
from alignlab.platform.pretrain.pretrain import Pretrainer, RankCollate, TrainState
from alignlab.platform.runtime.throughput import run_throughput


class NonFiniteLossError(ValueError):
    """A pretraining run whose loss went NaN or infinite: it stops, and its model is never exported."""


def train_loop(trainer: Pretrainer, epoch_batches: Callable[[int], Iterator[dict]], *,
               report: Callable[[dict, bool], None], log_every: int = 10,
               all_finite: Callable[[bool], bool] = lambda ok: ok,
               any_rank: Callable[[bool], bool] = lambda flag: flag,
               domain_batches: Callable[[int], Iterator[dict]] | None = None) -> TrainState:
    """Run until `max_steps`. `epoch_batches(epoch)` yields row batches of one pass over the data;
    `report(metrics, checkpoint_now)` is called every `log_every` steps and at every checkpoint step.
    A resumed trainer skips the batches its last checkpoint had consumed (exact data position).
    With a domain phase (`PretrainConfig.domain_fraction`), the steps from `cfg.domain_start_step` on take their
    rows from `domain_batches(epoch)` instead, its passes counted from 0 (`TrainState.phase`).

    `all_finite(ok)`: whether every rank's loss of this step is finite, given this rank's (data-parallel
    workers pass an all-reduce), so that all ranks stop at the same step and none waits in a collective.
    `any_rank(flag)`: whether any rank's flag is set (the same kind of collective): with
    `PretrainConfig.checkpoint_every_minutes`, a checkpoint is taken at a reporting step when any rank's clock says
    it is due, so that all ranks report it together."""
    cfg = trainer.cfg
    if cfg.domain_fraction and domain_batches is None:
        raise ValueError(f"PretrainConfig.domain_sources {'+'.join(cfg.domain_sources)}: train_loop needs "
                         "domain_batches for the domain phase")
    with CollatingProcesses(trainer) as pool:
        return _train(trainer, epoch_batches, report=report, log_every=log_every, all_finite=all_finite,
                      any_rank=any_rank, domain_batches=domain_batches, pool=pool)


def _train(trainer: Pretrainer, epoch_batches, *, report, log_every: int, all_finite, any_rank, domain_batches,
           pool: CollatingProcesses) -> TrainState:
    cfg, st = trainer.cfg, trainer.state
    waited = 0.0
    t_start = time.perf_counter()
    every_s = cfg.checkpoint_every_minutes * 60
    last_checkpoint = t_start
    seconds_before = st.train_seconds  # earlier lives' training time (a resumed run)
    while st.step < cfg.max_steps:
        if st.phase == 0 and st.step >= cfg.domain_start_step:
            st.phase, st.epoch, st.batches_in_epoch = 1, 0, 0
        stop_at, batches = (cfg.domain_start_step, epoch_batches) if st.phase == 0 else (cfg.max_steps, domain_batches)
        consumed = [0]
        feed = _prepared(trainer, iter(batches(st.epoch)), consumed, skip=st.batches_in_epoch, stop_at=stop_at,
                         pool=pool)
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
                st.num_flops += trainer.batch_flops(batch, cfg.seq_len_at(st.step))
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
                if every_s and not ckpt:  # the same steps on every rank: all ask, all agree
                    ckpt = any_rank(time.perf_counter() - last_checkpoint >= every_s)
                wall = time.perf_counter() - t_start
                tp = run_throughput(trainer)
                metrics.update({"step": st.step, "epoch": st.epoch, "phase": st.phase,
                                "data_wait_fraction": waited / max(wall, 1e-9),
                                "throughput/tokens_per_s": tp["tokens_per_s"],
                                "throughput/samples_per_s": tp["samples_per_s"]})
                if tp["mfu"] is not None:
                    metrics["throughput/mfu"] = tp["mfu"]
                report(metrics, ckpt)
                if ckpt:
                    last_checkpoint = time.perf_counter()
        if st.step >= stop_at:
            continue  # this phase's last step is done: the next pass starts the domain phase, or the loop ends
        if consumed[0] == 0:
            what = "the domain phase's rows" if st.phase else "the training shard"
            raise ValueError(f"{what} yielded no batches: the corpus is empty or smaller than one batch")
        st.epoch += 1
        st.batches_in_epoch = 0
    return st


def _prepared(trainer: Pretrainer, rows_it: Iterator[dict], consumed: list[int], *, skip: int,
              stop_at: int, pool: CollatingProcesses) -> Iterator[tuple[int, dict, list[str]]]:
    """(data position, prepared batch, row ids) for each step from the trainer's step up to `stop_at`, from the
    data position `skip` a resumed run had reached, in length buckets of `PretrainConfig.bucket_batches` row
    batches (`bucketing.bucketed`); `consumed[0]` counts the row batches read. Reads no trainer state the training
    thread changes: the steps are counted here. With collating processes, they make and prepare the batches, and
    this thread only reads rows and pins what they made."""
    cfg, st = trainer.cfg, trainer.state
    start, epoch = st.step, st.epoch
    # Under torch.compile each batch is cut to one of a few static widths, so that the compiled step meets few shapes.
    key, width = (cfg.seed, st.phase, epoch), "static" if cfg.compile else "longest"
    collate = functools.partial(_collate_at, trainer.rank_collate, start=start, epoch=epoch)
    elsewhere = pool.windows(start=start, epoch=epoch, key=key, width=width) if pool.active else None
    step = start
    for position, batch, ids in bucketed(rows_it, cfg.bucket_batches, skip=skip, key=key, collate=collate,
                                         width=width, counted=consumed, elsewhere=elsewhere):
        if step >= stop_at:
            return
        yield position, (pool.receive(batch) if elsewhere else trainer.prepare(batch)), ids
        step += 1


def _collate_at(rc: RankCollate, rows: dict, offset: int, batches: int, *, start: int, epoch: int):
    step = start + offset
    return rc(rows, step=step, epoch=epoch, max_len=rc.cfg.seq_len_at(step), batches=batches)


class CollatingProcesses:
    """`PretrainConfig.collate_workers` processes that collate, cut and prepare windows of rows beside the training
    process, so that the batches are made outside its interpreter lock (on a GPU the training thread needs it to
    launch kernels, and the collation thread held it half of the time). Each process gets the trainer's
    `RankCollate` once (by cloudpickle, so plugin objectives travel too) and makes exactly the batches the
    trainer's own thread would: the randomness is keyed by step. The batches come back as numpy arrays (pickled;
    one copy) and are pinned here for a GPU. With 0 workers, nothing starts and the loop collates on its thread."""

    def __init__(self, trainer: Pretrainer):
        self.workers = trainer.cfg.collate_workers
        self.window = trainer.cfg.bucket_batches
        self.pin = trainer.device.type == "cuda"
        self._trainer = trainer
        self._pool = None

    @property
    def active(self) -> bool:
        return self._pool is not None

    def __enter__(self) -> "CollatingProcesses":
        if self.workers:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            import cloudpickle

            # spawn, not fork: the training process runs threads (Ray's, the prefetcher), which a fork would copy
            # mid-flight.
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_start_collating,
                                             initargs=(cloudpickle.dumps(self._trainer.rank_collate),))
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def windows(self, *, start: int, epoch: int, key: tuple, width: str):
        """`bucketing.bucketed`'s `elsewhere`: a window goes to the next free process; one more than the processes
        is kept in flight, so that a made window waits whenever the training step comes for it."""
        def submit(job):
            batches, w, skip_w, offset = job
            return self._pool.submit(_collate_window, batches, w, self.window, skip_w, offset, key, width, start, epoch)

        return submit, self.workers + 1

    def receive(self, batch: dict) -> dict:
        out = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}
        if self.pin:
            out = {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in out.items()}
        return out


_COLLATE: RankCollate | None = None
"""In a collating process: the trainer's `RankCollate` (`_start_collating`)."""


def _start_collating(payload: bytes) -> None:
    global _COLLATE
    import cloudpickle

    torch.set_num_threads(1)
    _COLLATE = cloudpickle.loads(payload)


def _collate_window(batches: list[dict], w: int, window: int, skip: int, offset: int, key: tuple, width: str,
                    start: int, epoch: int) -> list[tuple[int, dict, list[str]]]:
    """In a collating process: window `w`'s batches, prepared (host-side, not pinned) and as numpy arrays."""
    rc = _COLLATE
    collate = functools.partial(_collate_at, rc, start=start, epoch=epoch)
    out = []
    for position, batch, ids in window_batches(batches, w, window, skip, offset, key, collate, width):
        ready = rc.prepare(batch, pin=False)
        out.append((position, {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in ready.items()}, ids))
    return out
