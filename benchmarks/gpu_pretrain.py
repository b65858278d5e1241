"""Pretraining on one GPU: alignlab's step against Hugging Face `BertForPreTraining`, and the whole run under Ray Train.

Three measurements, side by side in one process (written to `--out`, default
`benchmarks/results/gpu_pretrain.json`):

1. **Model step** (`models`): one optimizer step (forward, backward, grad clipping at 1.0, the same optimizer
   class and settings) at sequence length 128, a global batch of 256 rows on the one GPU, bf16 autocast, for
   each size: alignlab's `Pretrainer.step` (MLM on the masked positions + NSP) against `BertForPreTraining`
   at the same config and vocabulary, fed the same collated batches already on the device (HF's labels are the
   same masked positions over a [B, T] tensor, as HF expects). The two alternate in rounds, so a change of clock
   hits both. Step time is wall time over `--steps` steps between two `torch.cuda.synchronize()`.
2. **Compiled** (`--compile`): alignlab's step with `PretrainConfig.compile` (static shapes), the same batches.
3. **Ray Train, end to end** (`ray`): `pretrain.driver.pretrain` itself -- Ray Data reading parquet shards, the
   rank's rows collated and length-bucketed on the prefetch thread into pinned memory, one GPU Train worker --
   on a synthetic corpus, for each size. Steady seconds per step and the fraction of wall time the loop waited
   for data come from the loop's TensorBoard reports (as in `pretrain_throughput.py --part ray`); tokens/s and MFU
   are also read from the model's `final/eval.json` ("throughput"), i.e. what every run records.

MFU everywhere is the one FLOP count of `throughput.batch_flops` (6 N + 12 L d T per real token, plus the heads on
what they score: MLM's 6 (d^2 + d V) per predicted position, NSP's pooler per row; the same count for HF, which
decodes every position but is credited with the useful work only) per second, over the
datasheet bf16 peak of the device in `throughput.PEAK_TFLOPS`; the measured peak of a large bf16 matmul is
printed beside it. Every row is 128 real tokens (`[CLS] 63 [SEP] 62 [SEP]`, ids drawn uniformly from a real
sentencepiece vocabulary of `--vocab` pieces, 32,000 by default), so tokens and real tokens are the same here.

Run from the repo root on a machine with a CUDA GPU (see benchmarks/README.md):
    python benchmarks/gpu_pretrain.py --compile
A CPU dry run of the code paths (no figures worth keeping):
    python benchmarks/gpu_pretrain.py --device cpu --sizes 128x2 --batch 16 --steps 2 --rounds 1 --ray-steps 20
"""
from __future__ import annotations

import argparse
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

import torch

import machine_info  # benchmarks/, on sys.path when a benchmark runs as a script
from pretrain_throughput import HFStep, make_tokenizer, synthetic_rows, write_corpus
from alignlab.objectives.masked_lm import MaskedLMConfig
from alignlab.objectives.next_sentence import NextSentenceConfig
from alignlab.platform.config import MODEL_SIZES, PretrainConfig
from alignlab.platform.pretrain.pretrain import Pretrainer, to_numpy_rows
from alignlab.platform.throughput import peak_flops

SEQ = 128
RESULTS = Path(__file__).resolve().parent / "results" / "gpu_pretrain.json"


def config(size: str, batch: int, device: str, **kw) -> PretrainConfig:
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
                 compile_model: bool, with_hf: bool) -> dict:
    out = {}
    peak = peak_flops(device_label(device), "bf16")
    rows = to_numpy_rows(table.slice(0, 4 * batch))
    for size in sizes:
        m = MODEL_SIZES[size]
        cfg = config(size, batch, device, compile=compile_model)
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
               "compiled": compile_model, "warmup_s_alignlab": round(warm_al, 1),
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
        if device == "cuda":
            row["max_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
            torch.cuda.reset_peak_memory_stats()
        out[size + (" compiled" if compile_model else "")] = row
        mfu = (lambda w: "n/a" if row.get(f"{w}_mfu") is None else f"{row[f'{w}_mfu']:.1%}")
        print(f"{size:>6}{' compiled' if compile_model else ''}  alignlab {row['alignlab_step_ms']:7.2f} ms/step "
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
            collate_workers: int = 0) -> dict:
    """`pretrain.driver.pretrain` with one Train worker on a synthetic corpus; figures from its reports."""
    import ray
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from alignlab.platform.pretrain.driver import pretrain
    from alignlab.platform.ray_env import quiet_ray_data

    cfg = config(size, batch, device, num_workers=1, cpus_per_worker=cpus_per_worker, max_steps=steps,
                 checkpoint_every=steps, eval_batches=2, compile=compile_model, bucket_batches=bucket_batches,
                 collate_workers=collate_workers,
                 log_every=min(10, max(1, steps // 4)))  # the default 10, but at least 3 reports for the steady figures
    with tempfile.TemporaryDirectory(prefix="alignlab-gpu-") as d:
        d = Path(d)
        t = time.perf_counter()
        cdir = write_corpus(d, Path(tok.model_path), synthetic_rows(tok, num_rows), num_files=8)
        corpus_s = time.perf_counter() - t
        ray.init(num_cpus=cpus, num_gpus=1 if device == "cuda" else 0, include_dashboard=False, log_to_driver=False)
        quiet_ray_data()
        try:
            t_wall0, t = time.time(), time.perf_counter()
            mdir = pretrain(cdir, cfg, d / "storage", max_failures=0)
            fit_s = time.perf_counter() - t
        finally:
            ray.shutdown()
        acc = EventAccumulator(str(mdir / "tensorboard"))
        acc.Reload()
        points = [(e.step, e.wall_time - t_wall0) for e in acc.Scalars("train/loss")]
        waits = [e.value for e in acc.Scalars("data_wait_fraction")]
        ev = json.loads((mdir / "final" / "eval.json").read_text())
    # Steady seconds per step between the second report and the last (the first includes the pipeline's start),
    # and the waiting share over that stretch: the loop reports data_wait_fraction = waited / loop wall so far.
    (a, t_a), (b, t_b) = points[1], points[-1]
    step_s = (t_b - t_a) / (b - a)
    fa, fb = waits[1], waits[-1]
    loop_a = a * step_s / (1 - fa)
    steady_wait = (fb * (loop_a + t_b - t_a) - fa * loop_a) / (t_b - t_a)
    tokens = batch * SEQ
    peak = peak_flops(device_label(device), "bf16")
    fpt = (ev.get("throughput") or {}).get("flops_per_token")  # the run's own count, its heads included
    return {"size": size, "batch": batch, "steps": steps, "rows": num_rows, "cpus": cpus,
            "cpus_per_worker": cpus_per_worker, "bucket_batches": cfg.bucket_batches, "compiled": cfg.compile,
            "prefetch_batches": cfg.prefetch_batches, "collate_workers": cfg.collate_workers,
            "corpus_write_s": round(corpus_s, 1),
            "fit_wall_s": round(fit_s, 1), "steady_step_ms": round(step_s * 1e3, 3),
            "steady_steps": b - a, "steady_tokens_per_s": round(tokens / step_s),
            "steady_mfu": None if peak is None or fpt is None else round(tokens / step_s * fpt / peak, 4),
            "data_wait_fraction_steady": round(max(steady_wait, 0.0), 4),
            "data_wait_fraction_whole_loop": round(fb, 4),
            "eval_json_throughput": ev.get("throughput"),
            "eval_json_device": ev.get("device") or (ev.get("throughput") or {}).get("device")}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--sizes", default="768x3,128x2", help="comma-separated hidden x layers labels")
    p.add_argument("--batch", type=int, default=256, help="global batch (rows per step on the one device)")
    p.add_argument("--steps", type=int, default=30, help="timed steps per model per round")
    p.add_argument("--rounds", type=int, default=4, help="alternating rounds (alignlab, HF, HF, alignlab, ...)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--compile", action="store_true", help="also time alignlab's step under torch.compile")
    p.add_argument("--vocab", type=int, default=32_000,
                   help="pieces of the tokenizer (32000; 111000 is the paper corpus's): the decoder's width")
    p.add_argument("--no-hf", action="store_true")
    p.add_argument("--ray-steps", type=int, default=600, help="steps of each Ray Train run (0: no Ray part)")
    p.add_argument("--ray-rows", type=int, default=76_800, help="rows of the synthetic corpus (passes repeat)")
    p.add_argument("--ray-cpus", type=int, default=8)
    p.add_argument("--cpus-per-worker", type=float, default=4.0)
    p.add_argument("--ray-compile", action="store_true", help="the Ray runs with PretrainConfig.compile")
    p.add_argument("--ray-bucket-batches", type=int, default=16, help="PretrainConfig.bucket_batches of the Ray runs")
    p.add_argument("--ray-collate-workers", type=int, default=0,
                   help="PretrainConfig.collate_workers of the Ray runs (0: collated on the worker's prefetch thread)")
    p.add_argument("--commit", default=os.environ.get("ALIGNLAB_COMMIT", "unknown"))
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    sizes = [s for s in args.sizes.split(",") if s]
    for s in sizes:
        if s not in MODEL_SIZES:
            raise SystemExit(f"unknown size {s!r}: choose from {', '.join(MODEL_SIZES)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run on a GPU machine, or --device cpu for a dry run of the code paths")
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__)] + sys.argv[1:])
    result = {"command": command, "commit": args.commit,
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "machine": {**machine_info.machine("transformers", "ray"), "torch": torch.__version__,
                          "device": device_label(args.device),
                          "cuda": torch.version.cuda if args.device == "cuda" else None},
              "precision": "bf16", "seq_len": SEQ, "vocab": args.vocab,
              "datasheet_bf16_peak_tflops": (peak_flops(device_label(args.device), "bf16") or 0) / 1e12 or None}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        tmp.replace(args.out)

    print(f"# {command}\n# commit {args.commit}  {result['date']}\n# {result['machine']}", flush=True)
    result["measured_bf16_matmul_tflops"] = round(matmul_peak(args.device), 1)
    print(f"# bf16 matmul (8192^3): {result['measured_bf16_matmul_tflops']} TFLOP/s measured; datasheet peak "
          f"{result['datasheet_bf16_peak_tflops']} TFLOP/s (MFU is against the datasheet)", flush=True)
    with tempfile.TemporaryDirectory(prefix="alignlab-tok-") as d:
        tok = make_tokenizer(Path(d), args.vocab)
        table = synthetic_rows(tok, 4 * args.batch)
        result["models"] = bench_models(sizes, tok, table, batch=args.batch, steps=args.steps, rounds=args.rounds,
                                        warmup=args.warmup, device=args.device, compile_model=False,
                                        with_hf=not args.no_hf)
        save()
        for size in sizes if args.ray_steps else ():
            try:
                r = ray_run(size, tok, batch=args.batch, steps=args.ray_steps, num_rows=args.ray_rows,
                            device=args.device, cpus=args.ray_cpus, cpus_per_worker=args.cpus_per_worker,
                            compile_model=args.ray_compile, bucket_batches=args.ray_bucket_batches,
                            collate_workers=args.ray_collate_workers)
            except Exception:  # keep the other figures; the log shows why
                traceback.print_exc()
                r = {"size": size, "error": traceback.format_exc(limit=3)}
            result.setdefault("ray", {})[size + (" compiled" if args.ray_compile else "")
                                         + (f" bucket_batches={args.ray_bucket_batches}"
                                            if args.ray_bucket_batches != 16 else "")
                                         + (f" collate_workers={args.ray_collate_workers}"
                                            if args.ray_collate_workers else "")] = r
            save()
            if "error" not in r:
                hf = result["models"].get(size, {}).get("hf_tokens_per_s")
                mfu = "n/a" if r["steady_mfu"] is None else f"{r['steady_mfu']:.1%}"
                print(f"{size:>6}  Ray Train end to end: {r['steady_step_ms']:.2f} ms/step, "
                      f"{r['steady_tokens_per_s']:,} tok/s, MFU {mfu}, data wait {r['data_wait_fraction_steady']:.1%} "
                      f"steady ({r['data_wait_fraction_whole_loop']:.1%} whole loop)"
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
    print(f"# wrote {os.path.relpath(args.out)}\n# command: {command}")


if __name__ == "__main__":
    main()
