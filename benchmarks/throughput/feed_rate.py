"""feed_rate: the pretraining input path alone, no model: parquet shards -> collated, prepared batches, old vs new.

Per configuration (a preset's global batch and sequence length, the four objectives MLM+NSP+WHP+PAD with the
preset's settings), the same rows go through both paths, interleaved round by round so that a change of machine
load hits both:
- `old`: the collation of main at 95c4c1f (benchmarks/throughput/collate_reference.py: per-row Python lists, a scan of the
  batch per NSP pair, an argsort per MLM draw) on the training thread;
- `new`: `platform/encoder/batching.py`'s `Collator` (array operations over the batch, the same batches: checked here on
  every batch) and `pretrain.prepare_batch` (padding flag, labelled rows, pinned memory when CUDA is available),
  run on the background thread of `prefetch.Prefetcher` at depth 2, as `train_loop` runs it, on rows read in
  length buckets of the preset's `bucket_batches` row batches (`bucketing.py`), as `train_loop` reads them.
Reading is included in both: `pyarrow.parquet.ParquetFile.iter_batches` over the training shards, each record
batch turned into numpy columns for `old` (an object array of per-row id arrays, as Ray Data's numpy batches are)
and into rows by `batching.rows_from_arrow` for `new` (list columns stay flat arrays, as the driver reads Ray Data's
Arrow batches).

Reported per path: real (non-padding) tokens per CPU-second of the process (`time.process_time`, all threads:
with `taskset -c 1` that is one core's rate, and it does not count time the core spent on other processes) over
all rounds, and the median and best round's rate (a shared machine's load moves single rounds), wall-clock
tokens/s, ms per batch, and the padding fraction (padded positions / all positions of the batches).

Run from the repo root, pinned to one core, torch at one thread (the script sets it):
    taskset -c 1 python benchmarks/throughput/feed_rate.py --storage /tmp/feedstore        # the mini corpus built there
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from alignlab.platform.bench import bench_args, machine_info
from alignlab.platform.bench.bench_corpus import only_folder
from collate_reference import ReferenceCollator

from alignlab.platform.encoder.batching import Collator, rows_from_arrow
from alignlab.platform.encoder.registry import objectives_like
from alignlab.platform.encoder.tokenizer import Tokenizer
from alignlab.platform.presets import Preset
from alignlab.platform.pretrain.bucketing import bucketed
from alignlab.platform.pretrain.prefetch import Prefetcher
from alignlab.platform.pretrain.pretrain import build_objectives, prepare_batch

RESULTS = Path(__file__).resolve().parents[1] / "results" / "feed_rate.json"
OBJECTIVES = "mlm,nsp,whp,pad"
CONFIGS = (("mini", 64), ("mini", 128), ("paper", 128))
"""(preset, sequence length): the mini preset trains its first half at 64 tokens, the rest and the paper at 128."""


def record_batches(corpus: Path, batch_size: int):
    """The training shards' rows as Arrow record batches of `batch_size`, for ever (cycling)."""
    manifest = json.loads((corpus / "manifest.json").read_text())
    while True:
        for name in manifest["shards"]["train"]:
            for rb in pq.ParquetFile(corpus / "shards" / name).iter_batches(batch_size=batch_size):
                if rb.num_rows == batch_size:
                    yield rb


def row_batches(corpus: Path, batch_size: int, *, arrow: bool = False):
    """Training rows read from the shards for ever (cycling): numpy columns as Ray Data's numpy batches are (an
    object array of per-row arrays for a list column), or with `arrow` as the pretraining driver turns Ray Data's
    Arrow batches into rows (`batching.rows_from_arrow`: a list column stays one flat array)."""
    for rb in record_batches(corpus, batch_size):
        yield rows_from_arrow(rb) if arrow else \
            {c: rb.column(c).to_numpy(zero_copy_only=False) for c in rb.schema.names}


def run_path(path: str, collators: dict, rows_it, n: int, length: int, first_step: int, labelled_keys, pin: bool,
             check: list, window: int) -> dict:
    """`n` batches of one path; returns its counts and times."""
    real = total = 0

    def made():
        step = first_step
        if path == "old":
            for _ in range(n):
                rows = next(rows_it)
                yield rows, collators["old"](rows, step=step, max_len=length), step
                step += 1
            return
        # The new path collates windows of the preset's bucket_batches row batches and hands out length buckets
        # (bucketing.py), as train_loop does.
        def collate(rows, offset, batches):
            return collators["new"](rows, step=first_step + offset, max_len=length), [""] * len(rows["doc_id"])
        out = bucketed(rows_it, window, skip=0, key=(0, 0, 0), collate=collate)
        for _ in range(n):
            _, batch, _ = next(out)
            yield None, prepare_batch(batch, labelled_keys, pin=pin), step
            step += 1

    cpu0, wall0 = time.process_time(), time.perf_counter()
    if path == "old":
        batches = ((r, b if not pin else {k: v.pin_memory() for k, v in b.items()}, s) for r, b, s in made())
        for rows, b, step in batches:
            m = b["attention_mask"]
            real, total = real + int(m.sum()), total + m.numel()
            check.append((step, rows))
    else:
        with Prefetcher(made(), depth=2) as ready:
            for rows, b, step in ready:
                m = b["attention_mask"]
                real, total = real + int(m.sum()), total + m.numel()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"batches": n, "real_tokens": real, "tokens": total, "cpu_s": cpu, "wall_s": wall}


def same_batches(collators: dict, check: list, length: int) -> bool:
    """The new collation gives exactly the old batches for the same rows and steps (a sample of them), from numpy
    rows and from the same rows read as the driver reads them (`rows_from_arrow`)."""
    for step, rows in check[:: max(1, len(check) // 8)]:
        arrow_rows = rows_from_arrow(pa.table({k: pa.array(list(v)) for k, v in rows.items()}))
        old = collators["old"](rows, step=step, max_len=length)
        for new in (collators["new"](rows, step=step, max_len=length),
                    collators["new"](arrow_rows, step=step, max_len=length)):
            if old.keys() != new.keys() or not all(torch.equal(old[k], new[k]) for k in old):
                return False
    return True


def bench(corpus: Path, tok: Tokenizer, preset: str, length: int, *, rounds: int, batches: int) -> dict:
    cfg = Preset.named(preset).pretrain
    cfg = dataclasses.replace(cfg, objectives=objectives_like(OBJECTIVES, cfg.objectives))
    objs = list(build_objectives(cfg, tok).values())
    kw = dict(max_len=length, layout_fraction=cfg.layout_fraction, subword_alpha=cfg.subword_regularization_alpha,
              seed=cfg.seed)
    collators = {"old": ReferenceCollator(objs, tok, **kw), "new": Collator(objs, tok, **kw)}
    labelled_keys = tuple(k for o in objs for k in o.labelled_keys)
    pin = torch.cuda.is_available()
    sums = {p: {"batches": 0, "real_tokens": 0, "tokens": 0, "cpu_s": 0.0, "wall_s": 0.0} for p in collators}
    check: list = []
    per_round: dict[str, list[float]] = {p: [] for p in collators}
    for r in range(rounds + 1):  # round 0 warms both paths up and is not counted
        for path in (("old", "new") if r % 2 else ("new", "old")):
            # The same rows and steps for both paths in a round.
            rows_it = row_batches(corpus, cfg.batch_size, arrow=path == "new")
            for _ in range(r * batches):  # each round its own rows, skipped before the clock starts
                next(rows_it)
            got = run_path(path, collators, rows_it, batches, length, r * batches, labelled_keys, pin,
                           check if r else [], cfg.bucket_batches)
            if r:
                for k, v in got.items():
                    sums[path][k] += v
                per_round[path].append(got["real_tokens"] / got["cpu_s"])
    out = {"preset": preset, "seq_len": length, "batch_rows": cfg.batch_size, "objectives": OBJECTIVES,
           "bucket_batches": cfg.bucket_batches,
           "pinned": pin, "same_batches": same_batches(collators, check, length)}
    for path, s in sums.items():
        out[path] = {"real_tokens_per_cpu_s": round(s["real_tokens"] / s["cpu_s"]),
                     "real_tokens_per_cpu_s_median_round": round(float(np.median(per_round[path]))),
                     "real_tokens_per_cpu_s_best_round": round(max(per_round[path])),
                     "real_tokens_per_wall_s": round(s["real_tokens"] / s["wall_s"]),
                     "ms_per_batch_cpu": round(1e3 * s["cpu_s"] / s["batches"], 3),
                     "padding_fraction": round(1 - s["real_tokens"] / s["tokens"], 4), **s}
    out["speedup_cpu"] = round(out["new"]["real_tokens_per_cpu_s"] / out["old"]["real_tokens_per_cpu_s"], 2)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--storage", type=Path, default=Path("alignlab-storage"))
    p.add_argument("--corpus", type=Path, help="a finished corpus folder (default: the only one under --storage)")
    bench_args.add_flags(p, rounds=4)
    p.add_argument("--batches", type=int, default=32, help="batches per path per round (a multiple of the bucket window)")
    p.add_argument("--no-record", action="store_true", help=f"print only; do not add to {RESULTS.name}")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    gc.freeze()  # as the pretraining worker does before its loop (pretrain/driver.py)
    corpus = a.corpus or only_folder(a.storage, "corpus")
    tok = Tokenizer(corpus / "tokenizer.model")
    command = "python " + " ".join(shlex.quote(x) for x in [sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    print(f"$ {command}\n  cores allowed: {affinity}, torch threads {torch.get_num_threads()}, load {machine_info.load_average()}")
    results = []
    for preset, length in CONFIGS:
        r = bench(corpus, tok, preset, length, rounds=a.rounds, batches=a.batches)
        results.append(r)
        print(f"{preset:>5} seq {length:>3} x {r['batch_rows']:>3} rows  same batches: {r['same_batches']}  "
              f"pinned: {r['pinned']}")
        for path in ("old", "new"):
            s = r[path]
            print(f"    {path}: {s['real_tokens_per_cpu_s'] / 1e6:6.2f}M real tokens/CPU-s "
                  f"(rounds: median {s['real_tokens_per_cpu_s_median_round'] / 1e6:.2f}M, "
                  f"best {s['real_tokens_per_cpu_s_best_round'] / 1e6:.2f}M; "
                  f"{s['real_tokens_per_wall_s'] / 1e6:5.2f}M/wall-s), {s['ms_per_batch_cpu']:7.2f} ms/batch, "
                  f"padding {100 * s['padding_fraction']:.1f}%")
        print(f"    new/old: {r['speedup_cpu']}x")
    entry = {"command": command, "machine": machine_info.machine("torch", "numpy", "pyarrow"),
             "cpu_affinity": affinity, "load_average_end": machine_info.load_average(), "corpus": corpus.name,
             "results": results}
    if not a.no_record:
        machine_info.record(RESULTS, entry)
        print(f"recorded in {RESULTS}")


if __name__ == "__main__":
    main()
