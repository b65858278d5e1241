"""Pretraining on one GPU: alignlab's step against Hugging Face `BertForPreTraining`, and the whole run under Ray Train.

Three measurements on synthetic rows, side by side in one process (written to `--out`, default
`benchmarks/results/gpu_pretrain.json`), and a fourth on real rows, run alone (`--real-rows`):

1. **Model step** (`models`): one optimizer step (forward, backward, grad clipping at 1.0, the same optimizer
   class and settings) at sequence length 128, a global batch of 256 rows on the one GPU, bf16 autocast, for
   each size: alignlab's `Pretrainer.step` (MLM on the masked positions + NSP) against `BertForPreTraining`
   at the same config and vocabulary, fed the same collated batches already on the device (HF's labels are the
   same masked positions over a [B, T] tensor, as HF expects). The two alternate in rounds, so a change of clock
   hits both. Step time is wall time over `--steps` steps between two `torch.cuda.synchronize()`.
2. **Compiled** (`--compile`): alignlab's step with `PretrainConfig.compile` (static shapes), the same batches.
3. **Ray Train, end to end** (`ray`): `pretrain.driver.pretrain` itself -- Ray Data reading parquet shards, the
   rank's rows collated and length-bucketed on the prefetch thread (or `--ray-collate-workers` processes) into
   pinned memory, one GPU Train worker -- for each size. With `--ray-corpus PRESET` it trains as a real run does:
   all four objectives (mlm,nsp,whp,pad, the paper preset's settings) on the real rows of that preset's bundled
   corpus, built here (`--corpus-vocab` pieces; the step parts then use its tokenizer), every step inside the
   corpus's first epoch (more steps than an epoch holds are refused); without it, MLM + NSP on a synthetic corpus
   of full rows. The steady figures come from the loop's TensorBoard reports, interval by interval
   (`steady_intervals`): seconds per step, real tokens/s, the share of wall time spent waiting for data; the first
   interval and those where the step compiled a new width are left out (and counted). MFU is the steady real
   tokens/s times the run's own FLOPs per real token from its `final/eval.json` ("throughput", what every run
   records, also kept whole).
4. **Real rows** (`--real-rows PRESET`, `real_rows` in `--out`, default
   `benchmarks/results/gpu_pretrain_real_rows.json`): the step as a real run trains it, which parts 1-2 do not
   show -- all four objectives (mlm,nsp,whp,pad, the paper preset's settings) on rows of varying length with WHP
   and PAD labels, length-bucketed. The bundled corpus of the corpus preset PRESET (`mini`; `smoke` for a dry
   run) is built by the platform's `build_corpus` (Ray is shut down before any step), and the vocabulary is its
   own tokenizer's (printed). `--real-windows` bucketing windows of the preset's 16 row batches are read from its
   train shards, spread over the split, and made into batches by the training loop's own code
   (`pretrain.loop._prepared`: `bucketing.bucketed`, collated at each window's step, cut to the longest example,
   or with `--compile` to a static width, then prepared); those batches are put on the device before the clock,
   as in part 1. Each size is timed eager and (with `--compile`) compiled, on the same rows and labels: each
   round is one pass over all the batches, after one untimed pass that meets every width (so a compiled step has
   made all its graphs). Printed per size and mode: ms/step, real tokens/s (padding not counted), the padding
   fraction of the batches as cut, MFU by the same FLOP count as the loop's (`Pretrainer.batch_flops` on each
   batch), and the peak device memory on CUDA. No HF beside it: HF has no WHP or PAD head. The synthetic parts
   are not run.

MFU everywhere is the one FLOP count of `throughput.batch_flops` (6 N + 12 L d T per real token, plus the heads on
what they score: MLM's 6 (d^2 + d V) per predicted position, NSP's pooler per row; the same count for HF, which
decodes every position but is credited with the useful work only) per second, over the
datasheet bf16 peak of the device in `throughput.PEAK_TFLOPS`; the measured peak of a large bf16 matmul is
printed beside it. In parts 1-3 every row is 128 real tokens (`[CLS] 63 [SEP] 62 [SEP]`, ids drawn uniformly from a
real sentencepiece vocabulary of `--vocab` pieces, 32,000 by default), so tokens and real tokens are the same there.

Run from the repo root on a machine with a CUDA GPU (see benchmarks/README.md):
    python benchmarks/throughput/gpu_pretrain.py --compile
    python benchmarks/throughput/gpu_pretrain.py --sizes 768x3 --steps 5 --rounds 1 --warmup 2 --ray-steps 300 --ray-compile \
        --ray-corpus mini --corpus-vocab 32000 --ray-cpus 12 --cpus-per-worker 8 --ray-collate-workers 3
    python benchmarks/throughput/gpu_pretrain.py --real-rows mini --corpus-vocab 32000 --sizes 768x3 --batch 256 \
        --real-windows 4 --rounds 3 --compile
A CPU dry run of the code paths (no figures worth keeping):
    python benchmarks/throughput/gpu_pretrain.py --device cpu --sizes 128x2 --batch 16 --steps 2 --rounds 1 --ray-steps 20
    python benchmarks/throughput/gpu_pretrain.py --device cpu --sizes 128x2 --batch 8 --steps 1 --rounds 1 --ray-steps 12 \
        --ray-cpus 2 --cpus-per-worker 1 --ray-corpus smoke
    python benchmarks/throughput/gpu_pretrain.py --device cpu --real-rows smoke --sizes tiny --batch 8 --real-windows 1 --rounds 1
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime as dt
import gc
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from pretrain_throughput import HFStep, make_tokenizer, synthetic_rows, write_corpus
from alignlab.platform.bench import bench_args, machine_info
from alignlab.objectives.masked_lm import MaskedLMConfig
from alignlab.objectives.next_sentence import NextSentenceConfig
from alignlab.platform.config import MODEL_SIZES, PretrainConfig
from alignlab.platform.pretrain.pretrain import Pretrainer, to_numpy_rows
from alignlab.platform.runtime.throughput import peak_flops

SEQ = 128
RESULTS = Path(__file__).resolve().parents[1] / "results" / "gpu_pretrain.json"
REAL_RESULTS = Path(__file__).resolve().parents[1] / "results" / "gpu_pretrain_real_rows.json"
REAL_OBJECTIVES = "mlm,nsp,whp,pad"


LOSS_CHUNK_ROWS = [-1]  # --loss-chunk-rows: PretrainConfig.loss_chunk_rows of every model measured here


def config(size: str, batch: int, device: str, **kw) -> PretrainConfig:
    kw.setdefault("loss_chunk_rows", LOSS_CHUNK_ROWS[0])
    return PretrainConfig(model=MODEL_SIZES[size], objectives=(MaskedLMConfig(), NextSentenceConfig()),
                          batch_size=batch, lr=1e-4, grad_clip=1.0, precision="bf16", use_gpu=device == "cuda", **kw)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def device_label(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else machine_info.cpu_model()


def matmul_peak(device: str, n: int = 8192, reps: int = 10) -> float:
    """Best TFLOP/s of an n^3 bf16 matmul on the device (context for the datasheet peak)."""
    if device != "cuda":
        n = 1024
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(reps):
        sync(device)
        t = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e12


def timed(fn, steps: int, device: str) -> float:
    """Seconds per call of fn(i), over `steps` calls between two device synchronisations."""
    sync(device)
    t = time.perf_counter()
    for i in range(steps):
        fn(i)
    sync(device)
    return (time.perf_counter() - t) / steps


def bench_models(sizes, tok, table, *, batch: int, steps: int, rounds: int, warmup: int, device: str,
                 compile_model: bool, with_hf: bool, cuda_graphs: bool = False) -> dict:
    out = {}
    peak = peak_flops(device_label(device), "bf16")
    rows = to_numpy_rows(table.slice(0, 4 * batch))
    for size in sizes:
        m = MODEL_SIZES[size]
        cfg = config(size, batch, device, compile=compile_model, cuda_graphs=cuda_graphs)
        label = " compiled+graphs" if cuda_graphs else " compiled" if compile_model else ""
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()  # this model's peak alone
        t0 = time.perf_counter()
        al = Pretrainer(cfg, tok, device=device)
        collated = [al.collate({k: v[i * batch:(i + 1) * batch] for k, v in rows.items()}, step=i) for i in range(4)]
        assert bool(collated[0]["attention_mask"].all()), "benchmark batches must carry no padding"
        on_device = [al.to_device(al.prepare(b)) for b in collated]
        tokens = collated[0]["input_ids"].numel()
        fpt = sum(al.batch_flops(b, SEQ) for b in collated) / (len(collated) * tokens)  # heads included
        hf = HFStep(size, tok.vocab_size, al.optimizer, bf16=True, device=device) if with_hf else None
        hf_inputs = [{k: v.to(device) for k, v in HFStep.inputs(b).items()} for b in collated] if with_hf else None
        for i in range(warmup):
            al.step(on_device[i % 4])
        sync(device)
        warm_al = time.perf_counter() - t0
        for i in range(warmup if with_hf else 0):
            hf.step(hf_inputs[i % 4])
        times = {"alignlab": [], "hf": []}
        for r in range(rounds):
            for who in (("alignlab", "hf") if r % 2 == 0 else ("hf", "alignlab")):
                if who == "alignlab":
                    times[who].append(timed(lambda i: al.step(on_device[i % 4]), steps, device))
                    al.read_metrics()
                elif with_hf:
                    times[who].append(timed(lambda i: hf.step(hf_inputs[i % 4]), steps, device))
        row = {"size": size, "batch": batch, "seq_len": SEQ, "tokens_per_step": tokens, "flops_per_token": fpt,
               "compiled": compile_model, "cuda_graphs": cuda_graphs, "warmup_s_alignlab": round(warm_al, 1),
               # the MLM loss as run (rows a chunk, 0 the plain loss) and what loss_chunk_rows auto picks here
               "loss_chunk_rows": al.objectives["mlm"].output_chunk_rows,
               "auto_loss_chunk_rows": al.auto_output_chunk_rows()["mlm"],
               "optimizer": f"{type(al.optimizer).__name__}({', '.join(f'{k}={v}' for k, v in al.optimizer.defaults.items() if k in ('lr', 'fused', 'foreach'))})"}
        for who, ts in times.items():
            if not ts:
                continue
            s = statistics.median(ts)
            row[f"{who}_step_ms"] = round(s * 1e3, 3)
            row[f"{who}_step_ms_rounds"] = [round(x * 1e3, 3) for x in ts]
            row[f"{who}_tokens_per_s"] = round(tokens / s)
            row[f"{who}_mfu"] = None if peak is None else round(tokens / s * fpt / peak, 4)
        if with_hf:
            row["ratio_tokens_per_s"] = round(row["alignlab_tokens_per_s"] / row["hf_tokens_per_s"], 3)
            row["hf_attn_implementation"] = hf.attn
        if compile_model:  # breaks in the step's graph split it and cost a host round trip each
            from torch._dynamo.utils import counters

            row["graph_breaks"] = sum(counters["graph_break"].values())
            counters.clear()
        if device == "cuda":
            row["max_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
            torch.cuda.reset_peak_memory_stats()
        out[size + label] = row
        mfu = (lambda w: "n/a" if row.get(f"{w}_mfu") is None else f"{row[f'{w}_mfu']:.1%}")
        print(f"{size:>6}{label}  alignlab {row['alignlab_step_ms']:7.2f} ms/step "
              f"{row['alignlab_tokens_per_s']:>10,} tok/s MFU {mfu('alignlab')}"
              + (f"  | HF {row['hf_step_ms']:7.2f} ms/step {row['hf_tokens_per_s']:>10,} tok/s MFU {mfu('hf')}"
                 f"  | ratio {row['ratio_tokens_per_s']:.2f}x" if with_hf else ""), flush=True)
        al = hf = on_device = hf_inputs = collated = None  # free the device memory before the next size
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


def ray_run(size: str, tok, *, batch: int, steps: int, num_rows: int, device: str, cpus: int,
            cpus_per_worker: float, compile_model: bool = False, bucket_batches: int = 16,
            collate_workers: int = 0, corpus: Path | None = None) -> dict:
    """`pretrain.driver.pretrain` with one Train worker; figures from its reports. On `corpus` (a built corpus:
    real rows, length-bucketed, the four objectives at the paper preset's settings) or, without it, on a synthetic
    corpus of `num_rows` full rows (MLM + NSP). On a real corpus every step must fall inside its first epoch."""
    import ray
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from alignlab.platform.corpus.corpus import load_manifest
    from alignlab.platform.pretrain.driver import pretrain
    from alignlab.platform.runtime.ray_env import quiet_ray_data

    run = dict(num_workers=1, cpus_per_worker=cpus_per_worker, max_steps=steps, checkpoint_every=steps,
               eval_batches=2, compile=compile_model, bucket_batches=bucket_batches, collate_workers=collate_workers,
               log_every=min(10, max(1, steps // 4)))  # the default 10, but at least 3 reports for the steady figures
    if corpus is not None:
        train_rows = load_manifest(corpus)["stats"]["chunks"]["train"]
        if rows_read(steps, batch, bucket_batches) > train_rows:
            raise SystemExit(f"--ray-steps {steps} x --batch {batch} rows (in whole bucketing windows of "
                             f"{bucket_batches} batches) is more than one epoch of corpus {corpus.name} "
                             f"({train_rows:,} training rows): the timed steps would cross an epoch restart")
        cfg = dataclasses.replace(real_config(size, batch, device, compile_model=compile_model), **run,
                                  warmup_steps=steps // 10)  # the paper's 10,000 outlast the run
    else:
        cfg = config(size, batch, device, **run)
    with tempfile.TemporaryDirectory(prefix="alignlab-gpu-") as d:
        d = Path(d)
        t = time.perf_counter()
        if corpus is None:
            cdir = write_corpus(d, Path(tok.model_path), synthetic_rows(tok, num_rows), num_files=8)
            num_rows_read = num_rows
        else:
            cdir, num_rows_read = corpus, train_rows
        corpus_s = time.perf_counter() - t
        ray.init(num_cpus=cpus, num_gpus=1 if device == "cuda" else 0, include_dashboard=False, log_to_driver=False)
        quiet_ray_data()
        try:
            t = time.perf_counter()
            mdir = pretrain(cdir, cfg, d / "storage", max_failures=0, after_step=EpochLog(str(d / "epochs.txt")))
            fit_s = time.perf_counter() - t
        finally:
            ray.shutdown()
        acc = EventAccumulator(str(mdir / "tensorboard"))
        acc.Reload()
        scalars = {k: {e.step: (e.wall_time, e.value) for e in acc.Scalars(k)}
                   for k in ("data_wait_fraction", "throughput/tokens_per_s", "throughput/samples_per_s")}
        reports = [json.loads(line) for line in (d / "epochs.txt").read_text().splitlines()]
        epochs = [r["epoch"] for r in reports]
        memory = [r["max_memory_gib"] for r in reports if r["max_memory_gib"] is not None]
        ev = json.loads((mdir / "final" / "eval.json").read_text())
    tp = ev.get("throughput") or {}
    fpt = tp.get("flops_per_token")  # the run's own count per real token, its heads included
    steady = steady_intervals(scalars, batch)
    peak = peak_flops(device_label(device), "bf16")
    tps = steady["real_tokens_per_s"]
    return {"size": size, "batch": batch, "steps": steps, "rows": num_rows_read, "cpus": cpus,
            "rows_kind": "synthetic full rows" if corpus is None else f"real rows of corpus {corpus.name}",
            "objectives": ",".join(o.name for o in cfg.objectives), "vocab": tok.vocab_size,
            "cpus_per_worker": cpus_per_worker, "bucket_batches": cfg.bucket_batches, "compiled": cfg.compile,
            "prefetch_batches": cfg.prefetch_batches, "collate_workers": cfg.collate_workers,
            "corpus_write_s": round(corpus_s, 1), "fit_wall_s": round(fit_s, 1),
            "max_epoch": max(epochs),  # the loop's own epoch count at each report: 0 if no pass restarted
            "max_memory_gib": max(memory) if memory else None,  # the Train worker's peak by its last report
            "graph_breaks": reports[-1]["graph_breaks"],  # compiled: over every width's compile by the last report
            "steady_step_ms": steady["step_ms"], "steady_steps": steady["steps"],
            "steady_tokens_per_s": round(tps), "steady_real_tokens_per_step": steady["real_tokens_per_step"],
            "steady_mfu": None if peak is None or fpt is None else round(tps * fpt / peak, 4),
            "data_wait_fraction_steady": steady["wait_fraction"],
            "intervals_left_out": steady["left_out"],
            "data_wait_fraction_whole_loop": round(max(scalars["data_wait_fraction"].items())[1][1], 4),
            "eval_json_throughput": tp,
            "eval_json_device": ev.get("device") or tp.get("device")}


def rows_read(steps: int, batch: int, bucket_batches: int) -> int:
    """The most rows a run of `steps` steps reads: the loop reads whole bucketing windows of `bucket_batches`."""
    return -(-steps // bucket_batches) * bucket_batches * batch


class EpochLog:
    """`pretrain`'s after_step hook here, in the Train worker: at each report, one JSON line in `path` with the
    loop's epoch (a run whose stream ran out restarts its pass and counts epoch 1), the worker's peak device memory
    so far (CUDA) and, compiled, the graph breaks its compiles met so far (each splits the step's graph and costs a
    host round trip)."""

    def __init__(self, path: str):
        self.path = path

    def __call__(self, *, step, trainer, **_) -> None:
        mem = breaks = None
        if trainer.device.type == "cuda":
            mem = round(torch.cuda.max_memory_allocated(trainer.device) / 2**30, 2)
        if trainer.cfg.compile:
            from torch._dynamo.utils import counters

            breaks = sum(counters["graph_break"].values())
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, "epoch": trainer.state.epoch, "max_memory_gib": mem,
                                "graph_breaks": breaks}) + "\n")


def steady_intervals(scalars: dict, batch: int, slow: float = 1.5) -> dict:
    """The steady figures of a run from its reports (every `log_every` steps: wall time, the loop's running
    tokens/s and samples/s, and the share of its wall time it waited for data). At report k the loop had trained
    L_k = samples_k / samples_per_s_k seconds, on N_k = tokens_per_s_k * L_k real tokens, and waited W_k =
    wait_fraction_k * L_k; each interval between two reports gets its steps, seconds, real tokens and wait from
    the differences. The first interval (the pipeline's start) is left out, and so is an interval whose time not
    spent waiting is over `slow` times the median's a step: there the step compiled a new shape (a width met for
    the first time). A slow interval spent waiting for data stays in, so the wait share is never flattered."""
    wait, tok_s, smp_s = (scalars[k] for k in ("data_wait_fraction", "throughput/tokens_per_s",
                                               "throughput/samples_per_s"))
    steps = sorted(wait)
    marks = []
    for s in steps:
        t, f = wait[s]
        loop_s = s * batch / max(smp_s[s][1], 1e-9)
        marks.append((s, t, tok_s[s][1] * loop_s, f * loop_s))
    iv = [{"steps": b[0] - a[0], "s": b[1] - a[1], "tokens": b[2] - a[2], "wait": max(b[3] - a[3], 0.0)}
          for a, b in zip(marks[1:], marks[2:])] or [  # too few reports: the whole stretch after the first
        {"steps": marks[-1][0] - marks[0][0], "s": marks[-1][1] - marks[0][1], "tokens": marks[-1][2] - marks[0][2],
         "wait": max(marks[-1][3] - marks[0][3], 0.0)}]
    busy = statistics.median((i["s"] - i["wait"]) / i["steps"] for i in iv)
    kept = [i for i in iv if (i["s"] - i["wait"]) / i["steps"] <= slow * busy]
    out = [i for i in iv if i not in kept]
    n, secs = sum(i["steps"] for i in kept), sum(i["s"] for i in kept)
    return {"steps": n, "step_ms": round(secs / n * 1e3, 3), "real_tokens_per_s": sum(i["tokens"] for i in kept) / secs,
            "real_tokens_per_step": round(sum(i["tokens"] for i in kept) / n, 1),
            "wait_fraction": round(sum(i["wait"] for i in kept) / secs, 4),
            "left_out": {"intervals": len(out), "steps": sum(i["steps"] for i in out),
                         "seconds": round(sum(i["s"] for i in out), 1)}}


def real_corpus_config(preset: str, vocab: int | None):
    """The corpus preset `preset`'s config, with `vocab` pieces if given (the goals are read at 32K, the paper's
    GPU figures' vocabulary; the mini preset's own is 8K). A larger vocabulary trains its tokenizer on every
    document of the sources, since the preset's sample of 12,000 cannot fill 32K pieces."""
    from alignlab.platform.presets import Preset

    cfg = Preset.named(preset).corpus
    if vocab and vocab != cfg.vocab_size:
        cfg = dataclasses.replace(cfg, vocab_size=vocab,
                                  tokenizer_sample_docs=max(cfg.tokenizer_sample_docs, TOKENIZER_SAMPLE_AT_LARGE_VOCAB))
    return cfg


TOKENIZER_SAMPLE_AT_LARGE_VOCAB = 100_000  # more than the mini sources' 65,398 documents: all of them


def build_real_corpus(preset: str, root: Path, vocab: int | None = None, workers: int = 1) -> Path:
    """The bundled corpus of the corpus preset `preset` (with `vocab` pieces, `real_corpus_config`), built (or
    found under `root`) by the platform's own `build_corpus` with `workers` labelling actors; it starts a local
    Ray as `alignlab corpus build` does. Ray is shut down before any step is timed, so that none of its processes
    takes a core from the step."""
    import ray

    from alignlab.platform.corpus.corpus import build_corpus

    try:
        return build_corpus(real_corpus_config(preset, vocab), root, num_workers=workers, progress=False)
    finally:
        if ray.is_initialized():
            ray.shutdown()


def corpus_figures(cdir: Path, seconds: float) -> dict:
    """What a part says of the corpus it built or found: its id, rows, vocabulary and build phases."""
    from alignlab.platform.corpus.corpus import load_manifest

    stats = load_manifest(cdir)["stats"]
    return {"corpus_id": cdir.name, "train_rows": stats["chunks"]["train"], "vocab": stats["vocab_size"],
            "tokens": stats.get("tokens"), "built_or_found_s": round(seconds, 1),
            "build_wall_s": stats.get("wall_time_s"), "phase_seconds": stats.get("phase_seconds")}


def real_row_batches(cdir: Path, batch: int, windows: int, window: int) -> tuple[list, int]:
    """`windows` windows of `window` row batches of `batch` training rows, as Arrow tables (what the driver hands
    the loop, `batching.rows_from_arrow` turns them into rows), and the split's row count. The rows are the train
    shards' in the manifest's order, the order every pass reads them in; each window is a contiguous stretch of
    that stream, and the windows are spread evenly over the split, because a corpus holds its sources one after
    another (the mini one: Wikipedia summaries, then package summaries) and a pass meets them all. Ray Data's local
    shuffle is left out: it changes which rows meet in a window, not how long they are."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from alignlab.platform.corpus.corpus import load_manifest, shard_names

    names = shard_names(cdir, load_manifest(cdir), "train")
    table = pa.concat_tables([pq.read_table(cdir / "shards" / n) for n in names])
    span = window * batch
    if table.num_rows < span:
        raise SystemExit(f"corpus {cdir.name} has {table.num_rows} training rows, fewer than one window of {window} "
                         f"batches of {batch}: use a smaller --batch")
    starts = np.linspace(0, table.num_rows - span, windows).round().astype(int).tolist()
    return [table.slice(s + j * batch, batch).combine_chunks() for s in starts for j in range(window)], table.num_rows


def real_config(size: str, batch: int, device: str, *, compile_model: bool) -> PretrainConfig:
    """The paper preset (its objectives' settings, layout fraction, bucket windows) with the four objectives, at
    `size` and a global batch of `batch` on the one device, bf16; the learning rate schedule is the preset's and
    costs nothing here."""
    from alignlab.platform.encoder.registry import objectives_like
    from alignlab.platform.presets import Preset

    base = Preset.named("paper").pretrain
    return dataclasses.replace(base, model=MODEL_SIZES[size], batch_size=batch, num_workers=1, collate_workers=0,
                               objectives=objectives_like(REAL_OBJECTIVES, base.objectives), precision="bf16",
                               use_gpu=device == "cuda", compile=compile_model)


def bench_real_rows(sizes, tok, row_batches: list, out: dict, save, *, batch: int, rounds: int, device: str,
                    compile_model: bool) -> None:
    """The step of each size with the four objectives on batches made from `row_batches` by the training loop's
    own code, eager and (with `compile_model`) compiled; each model's figures (or its error) into `out`, saved."""
    peak = peak_flops(device_label(device), "bf16")
    for size in sizes:
        eager_ids: list = []
        for compiled in (False, True) if compile_model else (False,):
            label = f"{size} {'compiled' if compiled else 'eager'}"
            try:
                out[label] = real_rows_step(size, tok, row_batches, eager_ids, batch=batch, rounds=rounds,
                                            device=device, compiled=compiled, peak=peak)
            except Exception:  # keep the other figures; the log shows why
                traceback.print_exc()
                out[label] = {"size": size, "compiled": compiled, "error": traceback.format_exc(limit=3)}
            save()
            gc.collect()  # free the device memory before the next model
            if device == "cuda":
                torch.cuda.empty_cache()


def real_rows_step(size: str, tok, row_batches: list, eager_ids: list, *, batch: int, rounds: int, device: str,
                   compiled: bool, peak: float | None) -> dict:
    # The loop's own batch maker: length-bucketed windows (`bucketing.bucketed`), collated at each window's step,
    # cut to their longest example (eager) or to a static width (compiled), prepared (pinned on a GPU). With the
    # pool not entered, no collating process starts and the batches are made here, as with collate_workers 0.
    from alignlab.platform.pretrain.loop import CollatingProcesses, _prepared

    cfg = real_config(size, batch, device, compile_model=compiled)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()  # this model's peak alone
    t0 = time.perf_counter()
    tr = Pretrainer(cfg, tok, device=device)
    made = list(_prepared(tr, iter(row_batches), [0], skip=0, stop_at=len(row_batches), pool=CollatingProcesses(tr)))
    collate_s = time.perf_counter() - t0
    batches = [b for _, b, _ in made]
    ids = [i for _, _, i in made]
    seq_len = cfg.seq_len_at(0)
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    slots = sum(b["attention_mask"].numel() for b in batches)
    flops = sum(tr.batch_flops(b, seq_len) for b in batches)  # the loop's count, on the host batches
    widths = dict(sorted(collections.Counter(int(b["attention_mask"].shape[1]) for b in batches).items()))
    on_device = [tr.to_device(b) for b in batches]  # as the synthetic step's: the copy is not timed
    n = len(on_device)
    # One pass before the clock: every width is met once, so a compiled step has made all its graphs.
    for b in on_device:
        tr.step(b)
    sync(device)
    tr.read_metrics()
    warm_s = time.perf_counter() - t0
    times, losses = [], []
    for _ in range(rounds):
        times.append(timed(lambda i: tr.step(on_device[i]), n, device))
        losses.append(tr.read_metrics()["train/loss"])
    s = statistics.median(times)
    row = {"size": size, "compiled": compiled, "batch": batch, "seq_len": seq_len, "steps_per_round": n,
           "rounds": rounds, "step_ms": round(s * 1e3, 3), "step_ms_rounds": [round(x * 1e3, 3) for x in times],
           "real_tokens_per_step": round(real / n, 1), "real_tokens_per_s": round(real / n / s),
           "padding_fraction": round(1 - real / slots, 4), "widths": widths,
           "flops_per_real_token": round(flops / real),
           "mfu": None if peak is None else round(flops / n / s / peak, 4),
           "collate_s": round(collate_s, 1), "warmup_s": round(warm_s, 1),
           "loss_chunk_rows": tr.objectives["mlm"].output_chunk_rows,  # auto's pick (0: the plain loss)
           "train_loss_rounds": [round(x, 4) for x in losses]}
    if compiled:  # the rows, their grouping and their labels are the eager run's; only the widths differ
        row["same_rows_as_eager"] = ids == eager_ids
    else:
        eager_ids[:] = ids
    if device == "cuda":
        row["max_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    mfu = "n/a" if row["mfu"] is None else f"{row['mfu']:.1%}"
    print(f"{size:>6} {'compiled' if compiled else 'eager':>8}  {REAL_OBJECTIVES} on real bucketed rows: "
          f"{row['step_ms']:7.2f} ms/step {row['real_tokens_per_s']:>10,} real tok/s  padding "
          f"{row['padding_fraction']:.1%}  MFU {mfu}"
          + (f"  max memory {row['max_memory_gib']} GiB" if device == "cuda" else "")
          + (f"  (widths {widths})" if compiled else ""), flush=True)
    return row


def real_rows_part(args, sizes: list[str], result: dict, save) -> None:
    """`--real-rows`: the corpus built, its rows read, and the step of each size timed on them. Exits 1 if a
    model's step failed (the others' figures are kept)."""
    from alignlab.platform.encoder.tokenizer import Tokenizer

    with tempfile.TemporaryDirectory(prefix="alignlab-real-rows-") as d:
        t = time.perf_counter()
        cdir = build_real_corpus(args.real_rows, args.corpus_root or Path(d), args.corpus_vocab, args.corpus_workers)
        build_s = time.perf_counter() - t
        tok = Tokenizer(cdir / "tokenizer.model")
        window = real_config(sizes[0], args.batch, args.device, compile_model=False).bucket_batches
        row_batches, train_rows = real_row_batches(cdir, args.batch, args.real_windows, window)
        result["vocab"] = tok.vocab_size
        info = {"corpus_preset": args.real_rows, "corpus_id": cdir.name, "corpus_build_s": round(build_s, 1),
                "train_rows": train_rows, "vocab": tok.vocab_size, "objectives": REAL_OBJECTIVES,
                "batch": args.batch, "bucket_batches": window, "windows": args.real_windows,
                "steps_per_round": len(row_batches), "models": {}}
        result["real_rows"] = info
        print(f"# corpus: preset {args.real_rows} ({cdir.name}, {train_rows:,} training rows, built or found in "
              f"{build_s:.0f} s); vocabulary: the corpus's own tokenizer, {tok.vocab_size:,} pieces\n"
              f"# {REAL_OBJECTIVES} on {args.real_windows} bucketing window(s) of {window} batches of {args.batch} "
              f"rows spread over the split: {len(row_batches)} steps a round, {args.rounds} round(s)", flush=True)
        save()
        bench_real_rows(sizes, tok, row_batches, info["models"], save, batch=args.batch, rounds=args.rounds,
                        device=args.device, compile_model=args.compile)
    if any("error" in r for r in info["models"].values()):
        raise SystemExit(f"a step failed: see the traceback above and {os.path.relpath(args.out)}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench_args.add_flags(p, device="cuda")
    p.add_argument("--sizes", default="768x3,128x2", help="comma-separated hidden x layers labels")
    p.add_argument("--batch", type=int, default=256, help="global batch (rows per step on the one device)")
    p.add_argument("--steps", type=int, default=30,
                   help="timed steps per model per round (0: no step part, e.g. the Ray run alone)")
    bench_args.add_flags(p, rounds=4, help={"rounds": "alternating rounds (alignlab, HF, HF, alignlab, ...); with "
                                                      "--real-rows, timed passes over the batches"})
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--compile", action="store_true", help="also time alignlab's step under torch.compile")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="with --compile: also time the compiled step replayed as CUDA graphs (PretrainConfig.cuda_graphs)")
    p.add_argument("--vocab", type=int, default=32_000,
                   help="pieces of the tokenizer (32000; 111000 is the paper corpus's): the decoder's width")
    p.add_argument("--no-hf", action="store_true")
    p.add_argument("--loss-chunk-rows", type=int, default=-1,
                   help="PretrainConfig.loss_chunk_rows: -1 auto (pretrain.auto_loss_chunk_rows: chunked on a GPU where "
                        "the plain loss would hold more than 3 GiB), 0 the plain loss, N rows a chunk (gpu_checks.sh's "
                        "second call measures chunked against plain)")
    p.add_argument("--ray-steps", type=int, default=600, help="steps of each Ray Train run (0: no Ray part)")
    p.add_argument("--ray-rows", type=int, default=76_800, help="rows of the synthetic corpus (passes repeat)")
    p.add_argument("--ray-cpus", type=int, default=8)
    p.add_argument("--cpus-per-worker", type=float, default=4.0)
    p.add_argument("--ray-compile", action="store_true", help="the Ray runs with PretrainConfig.compile")
    p.add_argument("--ray-bucket-batches", type=int, default=16, help="PretrainConfig.bucket_batches of the Ray runs")
    p.add_argument("--ray-collate-workers", type=int, default=0,
                   help="PretrainConfig.collate_workers of the Ray runs (0: collated on the worker's prefetch thread)")
    p.add_argument("--real-rows", choices=("mini", "smoke"),
                   help="time only the step with mlm,nsp,whp,pad on length-bucketed rows of this corpus preset's "
                        "bundled corpus (built here; its own tokenizer), eager and with --compile compiled; the "
                        "synthetic, HF and Ray parts are not run")
    p.add_argument("--real-windows", type=int, default=4,
                   help="bucketing windows (of the preset's 16 row batches each) timed per round with --real-rows")
    p.add_argument("--ray-corpus", choices=("mini", "smoke"),
                   help="the Ray run trains on this corpus preset's bundled corpus (built here, --corpus-vocab pieces) "
                        "with mlm,nsp,whp,pad on its length-bucketed rows, all inside its first epoch; the step parts "
                        "use its tokenizer (without it: synthetic full rows, MLM + NSP, a --vocab tokenizer)")
    p.add_argument("--corpus-vocab", type=int, help="vocabulary of the --real-rows / --ray-corpus corpus "
                                                    "(default: the preset's own; 32000 for the goals)")
    p.add_argument("--corpus-workers", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                   help="labelling actors of a corpus build (default: half the CPUs)")
    p.add_argument("--build-corpus", choices=("mini", "smoke"),
                   help="only build (or find) this preset's corpus under --corpus-root and write its figures to --out "
                        "(gpu_checks.sh builds it beside the first part, on cores of its own)")
    p.add_argument("--corpus-root", type=Path, default=os.environ.get("ALIGNLAB_REAL_ROWS_ROOT") or None,
                   help="storage root to build (or find) the corpus under (default: $ALIGNLAB_REAL_ROWS_ROOT, else a "
                        "temporary one; a root that holds it already saves the build)")
    p.add_argument("--commit", default=os.environ.get("ALIGNLAB_COMMIT", "unknown"))
    p.add_argument("--out", type=Path, help=f"default {os.path.relpath(RESULTS)}, "
                                            f"or {os.path.relpath(REAL_RESULTS)} with --real-rows")
    args = p.parse_args(argv)
    LOSS_CHUNK_ROWS[0] = args.loss_chunk_rows
    args.out = args.out or (REAL_RESULTS if args.real_rows else RESULTS)
    sizes = [s for s in args.sizes.split(",") if s]
    for s in sizes:
        if s not in MODEL_SIZES:
            raise SystemExit(f"unknown size {s!r}: choose from {', '.join(MODEL_SIZES)}")
    if args.compile and not args.steps and not args.real_rows:
        raise SystemExit("--compile times the step: give it --steps (--steps 0 runs no step part)")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run on a GPU machine, or --device cpu for a dry run of the code paths")
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__)] + sys.argv[1:])
    result = {"command": command, "commit": args.commit,
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "machine": {**machine_info.machine("transformers", "ray"), "torch": torch.__version__,
                          "device": device_label(args.device),
                          "cuda": torch.version.cuda if args.device == "cuda" else None},
              "precision": "bf16", "seq_len": SEQ, "vocab": args.vocab, "loss_chunk_rows": args.loss_chunk_rows,
              "datasheet_bf16_peak_tflops": (peak_flops(device_label(args.device), "bf16") or 0) / 1e12 or None}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        tmp.replace(args.out)

    print(f"# {command}\n# commit {args.commit}  {result['date']}\n# {result['machine']}", flush=True)
    if args.build_corpus:
        if not args.corpus_root:
            raise SystemExit("--build-corpus needs --corpus-root (the corpus is kept there for the parts that read it)")
        t = time.perf_counter()
        cdir = build_real_corpus(args.build_corpus, args.corpus_root, args.corpus_vocab, args.corpus_workers)
        result["corpus"] = corpus_figures(cdir, time.perf_counter() - t)
        save()
        print(f"# corpus {cdir}: {result['corpus']}\n# wrote {os.path.relpath(args.out)}")
        return
    result["measured_bf16_matmul_tflops"] = round(matmul_peak(args.device), 1)
    print(f"# bf16 matmul (8192^3): {result['measured_bf16_matmul_tflops']} TFLOP/s measured; datasheet peak "
          f"{result['datasheet_bf16_peak_tflops']} TFLOP/s (MFU is against the datasheet)", flush=True)
    if args.real_rows:
        real_rows_part(args, sizes, result, save)
        print(f"# wrote {os.path.relpath(args.out)}\n# command: {command}")
        failed = failures(result)
        if failed:
            raise SystemExit(f"gpu_pretrain: {len(failed)} measurement(s) failed: {', '.join(failed)}")
        return
    with tempfile.TemporaryDirectory(prefix="alignlab-tok-") as d:
        corpus = None
        if args.ray_corpus and args.ray_steps:  # built (or found) before anything is timed; Ray is shut down after
            t = time.perf_counter()
            corpus = build_real_corpus(args.ray_corpus, args.corpus_root or Path(d), args.corpus_vocab,
                                       args.corpus_workers)
            result["corpus"] = corpus_figures(corpus, time.perf_counter() - t)
            from alignlab.platform.encoder.tokenizer import Tokenizer

            tok = Tokenizer(corpus / "tokenizer.model")
            result["vocab"] = tok.vocab_size
            if rows_read(args.ray_steps, args.batch, args.ray_bucket_batches) > result["corpus"]["train_rows"]:
                raise SystemExit(f"--ray-steps {args.ray_steps} x --batch {args.batch} rows (in whole bucketing "
                                 f"windows of {args.ray_bucket_batches} batches) is more than one epoch of corpus "
                                 f"{corpus.name} ({result['corpus']['train_rows']:,} training rows): use fewer steps")
            print(f"# corpus {corpus.name} for the Ray run: {result['corpus']}; the step parts use its tokenizer",
                  flush=True)
        else:
            tok = make_tokenizer(Path(d), args.vocab)
        table = synthetic_rows(tok, 4 * args.batch)
        result["models"] = bench_models(sizes, tok, table, batch=args.batch, steps=args.steps, rounds=args.rounds,
                                        warmup=args.warmup, device=args.device, compile_model=False,
                                        with_hf=not args.no_hf) if args.steps else {}
        save()
        for size in sizes if args.ray_steps else ():
            try:
                r = ray_run(size, tok, batch=args.batch, steps=args.ray_steps, num_rows=args.ray_rows,
                            device=args.device, cpus=args.ray_cpus, cpus_per_worker=args.cpus_per_worker,
                            compile_model=args.ray_compile, bucket_batches=args.ray_bucket_batches,
                            collate_workers=args.ray_collate_workers, corpus=corpus)
            except Exception:  # keep the other figures; the log shows why
                traceback.print_exc()
                r = {"size": size, "error": traceback.format_exc(limit=3)}
            result.setdefault("ray", {})[size + (" compiled" if args.ray_compile else "")
                                         + (" real rows" if corpus else "")
                                         + (f" bucket_batches={args.ray_bucket_batches}"
                                            if args.ray_bucket_batches != 16 else "")
                                         + (f" collate_workers={args.ray_collate_workers}"
                                            if args.ray_collate_workers else "")] = r
            save()
            if "error" not in r:
                hf = result["models"].get(size, {}).get("hf_tokens_per_s")
                mfu = "n/a" if r["steady_mfu"] is None else f"{r['steady_mfu']:.1%}"
                print(f"{size:>6}  Ray Train end to end ({r['objectives']} on {r['rows_kind']}): "
                      f"{r['steady_step_ms']:.2f} ms/step, {r['steady_tokens_per_s']:,} real tok/s, MFU {mfu}, data "
                      f"wait {r['data_wait_fraction_steady']:.1%} steady ({r['data_wait_fraction_whole_loop']:.1%} "
                      f"whole loop); {r['intervals_left_out']['intervals']} interval(s) of a new compile left out"
                      + (f", {r['steady_tokens_per_s'] / hf:.2f}x HF's step" if hf else "")
                      + f"; eval.json: {r['eval_json_throughput']}", flush=True)
        if args.compile:
            try:
                result["compiled"] = bench_models(sizes[:1], tok, table, batch=args.batch, steps=args.steps,
                                                  rounds=2, warmup=args.warmup, device=args.device,
                                                  compile_model=True, with_hf=False)
            except Exception:
                traceback.print_exc()
                result["compiled"] = {"error": traceback.format_exc(limit=3)}
            save()
        if args.compile and args.cuda_graphs:
            try:
                result["cuda_graphs"] = bench_models(sizes[:1], tok, table, batch=args.batch, steps=args.steps,
                                                     rounds=2, warmup=args.warmup, device=args.device,
                                                     compile_model=True, with_hf=False, cuda_graphs=True)
            except Exception:
                traceback.print_exc()
                result["cuda_graphs"] = {"error": traceback.format_exc(limit=3)}
            save()
    print(f"# wrote {os.path.relpath(args.out)}\n# command: {command}")
    # A part that failed was caught above so that the others still ran and saved their figures; the process still
    # fails, so that a failed compiled, CUDA-graph or Ray measurement never reads as a finished one.
    failed = failures(result)
    if failed:
        raise SystemExit(f"gpu_pretrain: {len(failed)} measurement(s) failed: {', '.join(failed)} (tracebacks above)")


def failures(result, where: str = "") -> list[str]:
    """The paths in `result` of the measurements that recorded an error."""
    if not isinstance(result, dict):
        return []
    if "error" in result:
        return [where or "result"]
    return [f for k, v in result.items() for f in failures(v, f"{where}/{k}" if where else str(k))]


if __name__ == "__main__":
    main()
