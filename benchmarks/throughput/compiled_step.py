"""Does `torch.compile` make the mini model's CPU training step faster? (issue #15)

A mini training step on a 2-core CPU is mostly per-operation cost, not arithmetic (docs/journal/round-06.md),
which is what a compiler that fuses operations removes. This benchmark times full training steps of the mini preset's
model with the study's four objectives, eager and under `torch.compile` (Inductor, the engine's forward wrapped as
data-parallel training wraps it), on the same batches, at 64 and 128 tokens (the mini preset's two phases). It
prints the seconds of the first `--warmup` steps (which include compiling) and the median step after them.

    python benchmarks/throughput/compiled_step.py --storage alignlab-storage

Results go to benchmarks/results/compiled_step.json (one entry per command).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from alignlab.platform.bench import bench_args, machine_info
from alignlab.platform.bench.bench_corpus import load_corpus
from alignlab.platform.corpus.corpus_embeddings import for_corpus
from alignlab.platform.encoder.registry import resolve_objectives
from alignlab.platform.presets import Preset
from alignlab.platform.pretrain.pretrain import Pretrainer, with_resolved_precision, to_numpy_rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--storage", type=Path, default=Path("alignlab-storage"))
    p.add_argument("--corpus", type=Path, help="a finished corpus folder (default: the only one under --storage)")
    p.add_argument("--warmup", type=int, default=30, help="untimed steps per length (compiling happens here)")
    p.add_argument("--steps", type=int, default=200, help="timed steps per length")
    bench_args.add_flags(p, threads=2, out="compiled_step.json")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    corpus, tok, train, _ = load_corpus(a.storage, a.corpus)
    command = bench_args.command("throughput/compiled_step.py", argv)
    cfg = with_resolved_precision(dataclasses.replace(Preset.named("mini").pretrain,
                                                objectives=resolve_objectives("mlm,nsp,whp,pad")))
    print(f"# {command}\n# corpus {corpus.name}, {a.threads} threads, torch {torch.__version__}, precision "
          f"{cfg.precision}, objectives {'+'.join(cfg.objective_names)}", flush=True)
    order = np.random.default_rng(0).permutation(train.num_rows)
    bs, rows = cfg.batch_size, []
    print("| step | tokens | first steps, s | median ms/step after them | vs eager |\n|---|---|---|---|---|", flush=True)
    eager_ms = {}
    for mode in ("eager", "compiled"):
        torch.manual_seed(0)
        trainer = Pretrainer(cfg, tok, wrap=torch.compile if mode == "compiled" else None,
                             word_embeddings=for_corpus(corpus, cfg, tok.vocab_size))
        step = 0
        for length in (64, 128):
            times = []
            for i in range(a.warmup + a.steps):
                start = (step * bs) % (len(order) - bs)
                batch = trainer.collate(to_numpy_rows(train.take(order[start:start + bs])), step=step, max_len=length)
                t0 = time.perf_counter()
                trainer.train_step(batch)
                times.append(time.perf_counter() - t0)
                step += 1
            ms = 1000 * statistics.median(times[a.warmup:])
            eager_ms.setdefault(length, ms)
            row = {"step": mode, "tokens": length, "first_steps_s": round(sum(times[:a.warmup]), 1),
                   "median_ms": round(ms, 1), "vs_eager": round(eager_ms[length] / ms, 2)}
            rows.append(row)
            print(f"| {mode} | {length} | {row['first_steps_s']} | {row['median_ms']} | {row['vs_eager']}x |",
                  flush=True)
    print(f"# {command}")
    machine_info.record(a.out, {"command": command, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                "machine": machine_info.machine("torch"), "precision": cfg.precision,
                                "load_average": machine_info.load_average(), "rows": rows})


if __name__ == "__main__":
    main()
