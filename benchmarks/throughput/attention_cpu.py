"""Training-step time of the mini model on CPU with SDPA's attention and with the written-out attention (issue #15).

A profile of one mini training step (bf16, 128 tokens, 2 threads) put SDPA's CPU flash kernel at about a third of
the step, almost all of it in its backward. `EncoderLayer.attend` therefore writes the attention out (two matmuls
and an fp32 softmax) when it trains in bf16 on CPU. This benchmark times full training steps of the mini preset's
model (all four objectives, the same batches) with each path, interleaved in rounds so that load on the machine
hits both alike, at 64 and 128 tokens, in bf16 and in fp32 (where SDPA stays the engine's path).

    python benchmarks/throughput/attention_cpu.py --storage alignlab-storage

Results go to benchmarks/results/attention_cpu.json (one entry per command).
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
from alignlab.platform.encoder.model import EncoderLayer
from alignlab.platform.presets import Preset
from alignlab.platform.pretrain.pretrain import Pretrainer, with_resolved_precision, to_numpy_rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--storage", type=Path, default=Path("alignlab-storage"))
    p.add_argument("--corpus", type=Path, help="a finished corpus folder (default: the only one under --storage)")
    p.add_argument("--steps", type=int, default=30, help="timed steps per path, precision and length, per round")
    bench_args.add_flags(p, rounds=3, threads=2, out="attention_cpu.json")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    corpus, tok, train, _ = load_corpus(a.storage, a.corpus)
    command = bench_args.command("throughput/attention_cpu.py", argv)
    mini = Preset.named("mini").pretrain
    auto = with_resolved_precision(mini).precision
    precisions = sorted({auto, "fp32"}, key=lambda x: x != auto)
    print(f"# {command}\n# corpus {corpus.name}, {a.threads} threads, torch {torch.__version__}, "
          f"precision auto -> {auto} here; timing {', '.join(precisions)}", flush=True)
    order = np.random.default_rng(0).permutation(train.num_rows)
    bs = mini.batch_size
    trainers, batches = {}, {}
    for prec in precisions:
        for written_out in (False, True):
            torch.manual_seed(0)
            c = dataclasses.replace(mini, precision=prec)
            trainers[prec, written_out] = Pretrainer(c, tok, word_embeddings=for_corpus(corpus, c, tok.vocab_size))
    for length in (64, 128):
        col = trainers[precisions[0], False].collate
        batches[length] = [col(to_numpy_rows(train.take(order[i * bs:(i + 1) * bs])), step=i, max_len=length)
                           for i in range(a.steps)]
    times: dict[tuple, list[float]] = {}
    for _ in range(a.rounds):
        for prec in precisions:
            for length in (64, 128):
                for written_out in (False, True):
                    EncoderLayer.cpu_training_attention = "written_out" if written_out else "sdpa"
                    trainer = trainers[prec, written_out]
                    trainer.train_step(batches[length][0])  # warm
                    t0 = time.perf_counter()
                    for b in batches[length]:
                        trainer.train_step(b)
                    times.setdefault((prec, length, written_out), []).append(
                        1000 * (time.perf_counter() - t0) / len(batches[length]))
    EncoderLayer.cpu_training_attention = "auto"
    rows = []
    print("| precision | tokens | SDPA ms/step | written out ms/step | speed-up |\n|---|---|---|---|---|")
    for prec in precisions:
        for length in (64, 128):
            sdpa = statistics.median(times[prec, length, False])
            mine = statistics.median(times[prec, length, True])
            engine = "written out" if prec == "bf16" else "SDPA"
            rows.append({"precision": prec, "tokens": length, "sdpa_ms": round(sdpa, 1), "written_out_ms": round(mine, 1),
                         "engine_path": engine})
            print(f"| {prec} | {length} | {sdpa:.1f} | {mine:.1f} | {sdpa / mine:.2f}x |", flush=True)
    print("(median over rounds of the mean step; the engine's path, `cpu_training_attention` \"auto\": written out "
          "in bf16 training, SDPA in fp32)")
    print(f"# {command}")
    machine_info.record(a.out, {"command": command, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                "machine": machine_info.machine("torch"), "load_average": machine_info.load_average(),
                                "threads": a.threads, "steps": a.steps, "rounds": a.rounds, "rows": rows})


if __name__ == "__main__":
    main()
