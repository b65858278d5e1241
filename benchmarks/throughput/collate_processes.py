"""collate_processes: does collating in other processes free the training thread? Thread against processes, one run.

On a GPU the training thread spends its step launching kernels, which needs the interpreter lock; a collation thread
in the same process holds that lock while it works, so the two take turns (benchmarks/results/gpu_pretrain_h100.log:
the 128x2 run waited for data 48% of its wall time). This stands in for that step with `--step-ms` of pure-Python
work per batch (it holds the lock, as launching kernels does) and feeds it the paper preset's batches (the four
objectives, 256 rows x 128 tokens, windows of 16) from the mini corpus, as `train_loop` would:
- `thread`: collated on the prefetch thread (`PretrainConfig.collate_workers` 0, the default);
- `processes N`: collated, cut and prepared in N spawned processes (`loop.CollatingProcesses`), read and received on
  the prefetch thread.
Printed per mode: steps/s, the fraction of wall time the step waited for its batch, and the training process's own
CPU-seconds per batch (the work left on the process whose lock the step needs). Needs 1 + N free cores to mean
anything; on a 2-core machine compare thread with processes 1.

    python benchmarks/throughput/collate_processes.py --storage /tmp/feedstore [--step-ms 5] [--processes 1]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from alignlab.platform.bench import machine_info
from alignlab.platform.bench.bench_corpus import only_folder
from feed_rate import OBJECTIVES, record_batches

from alignlab.platform.encoder.batching import Collator
from alignlab.platform.encoder.registry import objectives_like
from alignlab.platform.encoder.tokenizer import Tokenizer
from alignlab.platform.presets import Preset
from alignlab.platform.pretrain.bucketing import bucketed
from alignlab.platform.pretrain.loop import CollatingProcesses, _collate_at
from alignlab.platform.pretrain.prefetch import Prefetcher
from alignlab.platform.pretrain.pretrain import RankCollate, build_objectives


def busy(ms: float) -> None:
    """Pure-Python work for `ms` milliseconds: holds the interpreter lock, as a step launching kernels does."""
    end = time.perf_counter() + ms / 1e3
    x = 0
    while time.perf_counter() < end:
        x += 1


def run(mode: str, workers: int, rc: RankCollate, corpus: Path, *, steps: int, step_ms: float) -> dict:
    cfg = dataclasses.replace(rc.cfg, collate_workers=workers)
    trainer = SimpleNamespace(cfg=cfg, device=torch.device("cpu"), rank_collate=rc)
    with CollatingProcesses(trainer) as pool:
        key = (cfg.seed, 0, 0)
        elsewhere = pool.windows(start=0, epoch=0, key=key, width="longest") if pool.active else None
        feed = bucketed(record_batches(corpus, cfg.batch_size), cfg.bucket_batches, skip=0, key=key,
                        collate=lambda rows, off, n: _collate_at(rc, rows, off, n, start=0, epoch=0), width="longest",
                        elsewhere=elsewhere)
        ready_batches = ((pool.receive(b) if elsewhere else rc.prepare(b, pin=False))
                         for _, b, _ in feed)
        with Prefetcher(ready_batches, depth=2) as ready:
            for _ in range(2 * cfg.bucket_batches):  # warm-up: processes started, first windows made
                next(ready)
            waited, cpu0, wall0 = 0.0, time.process_time(), time.perf_counter()
            for _ in range(steps):
                t = time.perf_counter()
                next(ready)
                waited += time.perf_counter() - t
                busy(step_ms)
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    # The step's own CPU (busy) is not the input path's: left out of the training process's share.
    return {"mode": mode, "workers": workers, "steps": steps, "steps_per_s": round(steps / wall, 2),
            "data_wait_fraction": round(waited / wall, 3),
            "input_cpu_ms_per_batch_in_training_process": round(1e3 * max(0.0, cpu - steps * step_ms / 1e3) / steps, 2)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--storage", type=Path, default=Path("alignlab-storage"))
    p.add_argument("--corpus", type=Path, help="a finished corpus folder (default: the only one under --storage)")
    p.add_argument("--step-ms", type=float, default=5.0, help="pure-Python work per step, standing in for the step")
    p.add_argument("--processes", type=int, default=1, help="collating processes of the second mode")
    p.add_argument("--steps", type=int, default=192)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    corpus = a.corpus or only_folder(a.storage, "corpus")
    tok = Tokenizer(corpus / "tokenizer.model")
    cfg = Preset.named("paper").pretrain
    cfg = dataclasses.replace(cfg, objectives=objectives_like(OBJECTIVES, cfg.objectives), seq_len=128)
    objs = list(build_objectives(cfg, tok).values())
    collator = Collator(objs, tok, max_len=128, layout_fraction=cfg.layout_fraction,
                        subword_alpha=cfg.subword_regularization_alpha, seed=cfg.seed)
    rc = RankCollate(cfg, collator, None, 0, 1, tuple(k for o in objs for k in o.labelled_keys))
    command = "python " + " ".join(shlex.quote(x) for x in [sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    print(f"$ {command}\n  cores allowed: {sorted(os.sched_getaffinity(0))}, load {machine_info.load_average()}; "
          f"paper preset batches (256 x 128, {OBJECTIVES}), a {a.step_ms:g} ms pure-Python step")
    for mode, workers in (("thread", 0), (f"processes {a.processes}", a.processes),
                          ("thread", 0), (f"processes {a.processes}", a.processes)):
        r = run(mode, workers, rc, corpus, steps=a.steps, step_ms=a.step_ms)
        print(f"  {mode:>12}: {r['steps_per_s']:6.1f} steps/s, data wait {100 * r['data_wait_fraction']:5.1f}% of "
              f"wall time, input path in the training process {r['input_cpu_ms_per_batch_in_training_process']:5.2f} "
              "CPU-ms per batch")


if __name__ == "__main__":
    main()
