"""Mini pretraining steps on CPU with each head's labelled rows as they come and padded to a multiple of 32.

MLM's and WHP's heads run on the positions a batch labels (sparse prediction), a count that changes every step.
On CPU, oneDNN builds a kernel for each matmul shape it meets and keeps 1,024 of them; a mini run meets more, and
then keeps rebuilding them. `registry.labelled_rows` pads the rows to a multiple of `LABELLED_ROW_MULTIPLE` (the
padding is labelled IGNORE and counts nowhere). This benchmark trains the mini preset (all four objectives, its
schedule: 64 tokens for the first half) for `--steps` steps from the same start on the same batches, once with
the reference (multiple 1: the rows as they come, the engine before the change) and once padded (the engine's 32),
each in a fresh process because the kernel cache is per process, alternating in rounds so that load on the
machine hits both alike. Printed: ms per step (data included, as in a study's worker) and the process's peak
memory.

    python benchmarks/throughput/labelled_rows_cpu.py --storage alignlab-storage

Results go to benchmarks/results/labelled_rows_cpu.json (one entry per command).
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from alignlab.platform.bench import bench_args, machine_info



def child(a) -> None:
    """One timed run in this process: `a.multiple` rows per head multiple, `a.steps` steps of the mini preset."""
    import dataclasses

    import numpy as np
    import torch

    from bench_corpus import load_corpus
    from alignlab.platform.corpus.corpus_embeddings import for_corpus
    from alignlab.platform.encoder import registry
    from alignlab.platform.presets import Preset
    from alignlab.platform.pretrain.pretrain import Pretrainer, with_resolved_precision, to_numpy_rows

    torch.set_num_threads(a.threads)
    registry.LABELLED_ROW_MULTIPLE = a.multiple
    corpus, tok, train, _ = load_corpus(a.storage, a.corpus)
    torch.manual_seed(0)
    cfg = with_resolved_precision(dataclasses.replace(Preset.named("mini").pretrain, max_steps=a.steps))
    trainer = Pretrainer(cfg, tok, word_embeddings=for_corpus(corpus, cfg, tok.vocab_size))
    order = np.random.default_rng(0).permutation(train.num_rows)
    bs, t0 = cfg.batch_size, time.perf_counter()
    for step in range(cfg.max_steps):
        start = (step * bs) % (len(order) - bs)
        rows = to_numpy_rows(train.take(order[start:start + bs]))
        m = trainer.train_step(trainer.collator_at(step)(rows, step=step, max_len=cfg.seq_len_at(step)))
    ms = 1000 * (time.perf_counter() - t0) / cfg.max_steps
    print(json.dumps({"multiple": a.multiple, "ms_per_step": round(ms, 2), "precision": cfg.precision,
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                      "last_loss": round(float(m["train/loss"]), 4)}))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--storage", type=Path, default=Path("alignlab-storage"))
    p.add_argument("--corpus", type=Path, help="a finished corpus folder (default: the only one under --storage)")
    p.add_argument("--steps", type=int, default=1000, help="training steps per run (the first half at 64 tokens)")
    bench_args.add_flags(p, rounds=2, threads=2)
    p.add_argument("--multiple", type=int, default=32, help="the padded run's multiple (the engine's: 32)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    bench_args.add_flags(p, out="labelled_rows_cpu.json")
    a = p.parse_args(argv)
    if a.child:
        return child(a)
    command = bench_args.command("throughput/labelled_rows_cpu.py", argv)
    print(f"# {command}\n# {a.steps} mini steps per run, {a.threads} threads, each run its own process", flush=True)
    runs: dict[int, list[dict]] = {}
    for _ in range(a.rounds):
        for multiple in (1, a.multiple):
            cmd = [sys.executable, __file__, "--child", "--storage", str(a.storage), "--steps", str(a.steps),
                   "--threads", str(a.threads), "--multiple", str(multiple)]
            if a.corpus:
                cmd += ["--corpus", str(a.corpus)]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"labelled_rows_cpu: the run with multiple {multiple} failed:\n{out.stderr[-2000:]}")
            res = json.loads(out.stdout.strip().splitlines()[-1])
            print(json.dumps(res), flush=True)
            runs.setdefault(multiple, []).append(res)
    rows = []
    print("| labelled rows | ms/step (median) | peak memory MB | precision |\n|---|---|---|---|")
    for multiple, label in ((1, "as they come (reference)"), (a.multiple, f"padded to a multiple of {a.multiple}")):
        ms = statistics.median(r["ms_per_step"] for r in runs[multiple])
        rss = max(r["peak_rss_mb"] for r in runs[multiple])
        rows.append({"multiple": multiple, "ms_per_step": round(ms, 2), "peak_rss_mb": rss,
                     "precision": runs[multiple][0]["precision"], "runs": runs[multiple]})
        print(f"| {label} | {ms:.1f} | {rss} | {runs[multiple][0]['precision']} |")
    print(f"speed-up {rows[0]['ms_per_step'] / rows[1]['ms_per_step']:.2f}x\n# {command}")
    machine_info.record(a.out, {"command": command, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                "machine": machine_info.machine("torch"), "load_average": machine_info.load_average(),
                                "threads": a.threads, "steps": a.steps, "rows": rows})


if __name__ == "__main__":
    main()
