"""The mini training loop on a 2-core CPU with its batches collated ahead on a prefetch thread, and on the training thread.

On a GPU the prefetch thread hides the collation behind the device's step. On a CPU whose cores all run torch's
threads it has no core of its own: each slice of its work delays one of torch's threads, and the other waits for
it at the end of every parallel region. This benchmark runs the real loop (`train_loop`, the mini preset's model,
all four objectives, length bucketing) on in-memory rows with `prefetch_batches` 2 and 0, interleaved in rounds, at 64
and 128 tokens, and times the loop's wall time per step and the time inside `Pretrainer.step`; then replays the
batches the loop trained on, with no loop at all. The batches are the same for both depths (tests/test_input_path.py).

    python benchmarks/throughput/prefetch_cpu.py --storage alignlab-storage

Results go to benchmarks/results/prefetch_cpu.json (one entry per command).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import torch

from alignlab.platform.bench import bench_args, machine_info
from alignlab.platform.bench.bench_corpus import load_corpus
from alignlab.platform.corpus.corpus_embeddings import for_corpus
from alignlab.platform.presets import Preset
from alignlab.platform.pretrain.loop import train_loop
from alignlab.platform.pretrain.pretrain import Pretrainer, with_resolved_precision, to_numpy_rows

DEPTHS = (2, 0)


def timed_loop(cfg, tok, word_embeddings, rows: list[dict]) -> tuple[float, float, list[dict]]:
    """(wall ms per step, ms per step inside `step`, the batches trained on) of one run of `train_loop`."""
    trainer = Pretrainer(cfg, tok, word_embeddings=word_embeddings)
    inner, inside, seen = trainer.step, [0.0], []

    def step(batch: dict) -> None:
        t0 = time.perf_counter()
        inner(batch)
        inside[0] += time.perf_counter() - t0
        seen.append(batch)

    trainer.step = step
    t0 = time.perf_counter()
    train_loop(trainer, lambda epoch: iter(rows), report=lambda metrics, checkpoint_now: None)
    n = len(seen)
    return 1000 * (time.perf_counter() - t0) / n, 1000 * inside[0] / n, seen


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--storage", type=Path, default=Path("alignlab-storage"))
    p.add_argument("--corpus", type=Path, help="a finished corpus folder (default: the only one under --storage)")
    p.add_argument("--steps", type=int, default=150, help="steps per loop")
    bench_args.add_flags(p, rounds=3, threads=2, out="prefetch_cpu.json")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    corpus, tok, train, _ = load_corpus(a.storage, a.corpus)
    command = bench_args.command("throughput/prefetch_cpu.py", argv)
    mini = with_resolved_precision(Preset.named("mini").pretrain)
    print(f"# {command}\n# {machine_info.cpu_model()}, {a.threads} threads, torch {torch.__version__}, "
          f"corpus {corpus.name}, precision {mini.precision} (auto)", flush=True)
    bs = mini.batch_size
    rows = [to_numpy_rows(train.slice(i, bs)) for i in range(0, train.num_rows - bs + 1, bs)]
    base = dataclasses.replace(mini, max_steps=a.steps, short_seq_len=0, short_seq_fraction=0.0, eval_batches=0,
                               checkpoint_every=10**9)
    emb = for_corpus(corpus, base, tok.vocab_size)
    wall: dict[tuple, list[float]] = {}
    inside: dict[tuple, list[float]] = {}
    bare: dict[int, list[float]] = {}
    for _ in range(a.rounds):
        for length in (64, 128):
            for depth in DEPTHS:
                cfg = dataclasses.replace(base, seq_len=length, prefetch_batches=depth)
                w, s, seen = timed_loop(cfg, tok, emb, rows)
                wall.setdefault((length, depth), []).append(w)
                inside.setdefault((length, depth), []).append(s)
            replay = Pretrainer(cfg, tok, word_embeddings=emb)
            t0 = time.perf_counter()
            for batch in seen:
                replay.step(batch)
            replay.read_metrics()
            bare.setdefault(length, []).append(1000 * (time.perf_counter() - t0) / len(seen))
    out = []
    print("| tokens | prefetch_batches | loop ms/step | of it in the step | the same batches, no loop |\n"
          "|---|---|---|---|---|")
    for length in (64, 128):
        for depth in DEPTHS:
            w, s = statistics.median(wall[length, depth]), statistics.median(inside[length, depth])
            b = statistics.median(bare[length])
            out.append({"tokens": length, "prefetch_batches": depth, "loop_ms": round(w, 1), "step_ms": round(s, 1),
                        "replayed_ms": round(b, 1)})
            print(f"| {length} | {depth} | {w:.1f} | {s:.1f} | {b:.1f} |", flush=True)
    print(f"(median over {a.rounds} rounds of {a.steps}-step loops; `seq_len` fixed, so each row is cut at that length)")
    print(f"# {command}")
    machine_info.record(a.out, {"command": command, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                "machine": machine_info.machine("torch"), "load_average": machine_info.load_average(),
                                "threads": a.threads, "precision": mini.precision, "steps": a.steps,
                                "rounds": a.rounds, "rows": out})


if __name__ == "__main__":
    main()
