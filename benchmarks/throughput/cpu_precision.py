"""Does bf16 train faster than fp32 on this CPU? The mini training step in each precision, side by side.

`precision="auto"` picks bf16 on a CPU only where it measured faster (`precision.bf16_is_faster`): AMX, or
AVX512-BF16 on AMD. An Intel CPU that shows AVX512-BF16 without AMX multiplies bf16 no faster than fp32, and
autocast's casts then make the step slower. This benchmark times full training steps of the mini preset's model
(all four objectives, the same batches; each precision on the engine's own attention path) interleaved in rounds, at
64 and 128 tokens, plus one large matmul in each precision, and says whether `auto`'s pick was the faster one here.

    python benchmarks/throughput/cpu_precision.py --storage alignlab-storage

Results go to benchmarks/results/cpu_precision.json (one entry per command).
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
from alignlab.platform.presets import Preset
from alignlab.platform.pretrain.pretrain import Pretrainer, to_numpy_rows, with_resolved_precision
from alignlab.platform.runtime.precision import cpu_vendor_and_flags

PRECISIONS = ("fp32", "bf16")


def matmul_gflops(dtype: torch.dtype, n: int = 2048, reps: int = 10) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e9


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--storage", type=Path, default=Path("alignlab-storage"))
    p.add_argument("--corpus", type=Path, help="a finished corpus folder (default: the only one under --storage)")
    p.add_argument("--steps", type=int, default=30, help="timed steps per precision and length, per round")
    bench_args.add_flags(p, rounds=3, threads=2, out="cpu_precision.json")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    corpus, tok, train, _ = load_corpus(a.storage, a.corpus)
    command = bench_args.command("throughput/cpu_precision.py", argv)
    mini = Preset.named("mini").pretrain
    auto = with_resolved_precision(mini).precision
    vendor, flags = cpu_vendor_and_flags()
    shown = sorted(f for f in flags if "bf16" in f or f.startswith("amx"))
    print(f"# {command}\n# {machine_info.cpu_model()} ({vendor}; {' '.join(shown) or 'no bf16 or AMX flags'}), "
          f"{a.threads} threads, torch {torch.__version__}, corpus {corpus.name}; precision auto -> {auto} here",
          flush=True)
    order = np.random.default_rng(0).permutation(train.num_rows)
    bs = mini.batch_size
    trainers = {}
    for prec in PRECISIONS:
        torch.manual_seed(0)
        c = dataclasses.replace(mini, precision=prec)
        trainers[prec] = Pretrainer(c, tok, word_embeddings=for_corpus(corpus, c, tok.vocab_size))
    batches = {length: [trainers["fp32"].collate(to_numpy_rows(train.take(order[i * bs:(i + 1) * bs])), step=i,
                                                 max_len=length) for i in range(a.steps)] for length in (64, 128)}
    times: dict[tuple, list[float]] = {}
    gflops: dict[str, list[float]] = {}
    for _ in range(a.rounds):
        for prec in PRECISIONS:
            gflops.setdefault(prec, []).append(matmul_gflops(torch.float32 if prec == "fp32" else torch.bfloat16))
            for length in (64, 128):
                trainer = trainers[prec]
                trainer.train_step(batches[length][0])  # warm
                t0 = time.perf_counter()
                for b in batches[length]:
                    trainer.train_step(b)
                times.setdefault((prec, length), []).append(1000 * (time.perf_counter() - t0) / len(batches[length]))
    rows = []
    print("| tokens | fp32 ms/step | bf16 ms/step | bf16 speed-up |\n|---|---|---|---|")
    for length in (64, 128):
        fp32, bf16 = (statistics.median(times[prec, length]) for prec in PRECISIONS)
        rows.append({"tokens": length, "fp32_ms": round(fp32, 1), "bf16_ms": round(bf16, 1)})
        print(f"| {length} | {fp32:.1f} | {bf16:.1f} | {fp32 / bf16:.2f}x |", flush=True)
    mm = {prec: round(statistics.median(v)) for prec, v in gflops.items()}
    faster = "bf16" if sum(r["bf16_ms"] for r in rows) < sum(r["fp32_ms"] for r in rows) else "fp32"
    print(f"2048x2048 matmul: fp32 {mm['fp32']} GFLOP/s, bf16 {mm['bf16']} GFLOP/s")
    print(f"(median over {a.rounds} rounds of the mean step of {a.steps}.) The step is faster in {faster}; "
          f"`auto` picks {auto} here: {'the faster one' if faster == auto else 'NOT the faster one'}.")
    print(f"# {command}")
    machine_info.record(a.out, {"command": command, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                "machine": {**machine_info.machine("torch"), "vendor": vendor, "bf16_flags": shown},
                                "load_average": machine_info.load_average(), "threads": a.threads, "steps": a.steps,
                                "rounds": a.rounds, "auto": auto, "faster": faster, "matmul_gflops": mm,
                                "rows": rows})


if __name__ == "__main__":
    main()
