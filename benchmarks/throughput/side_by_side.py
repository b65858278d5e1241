"""Several small models side by side on one device against one alone: does packing them fill a GPU?

A study trains several models (the objective ablation four, Table 1 eleven). A 128x2 model's step leaves most of an
H100 idle (its time is kernel launches, not FLOPs), so K of them trained at once by K processes on the one GPU -- what
a study does with fractional GPUs per Train worker -- may get far more work out of it. This measures it directly:
`--copies` K processes each build the same model (`Pretrainer`, MLM + NSP on
synthetic full rows, as benchmarks/throughput/gpu_pretrain.py), wait at a barrier, and time `--steps` optimizer steps; the
aggregate tokens/s of K side by side is compared with one process alone, in one run, one after the other.

    python benchmarks/throughput/side_by_side.py --size 128x2 --copies 3            # on a machine with a CUDA GPU
    python benchmarks/throughput/side_by_side.py --device cpu --batch 8 --steps 2   # a dry run of the code path on CPU

Prints one line per layout and writes `--out` (JSON: command, commit, machine, device, precision, figures).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
from queue import Empty
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch

from gpu_pretrain import config, device_label, sync
from pretrain_throughput import make_tokenizer, synthetic_rows
from alignlab.platform.bench import bench_args, machine_info
from alignlab.platform.config import MODEL_SIZES
from alignlab.platform.pretrain.pretrain import Pretrainer, to_numpy_rows

SEQ = 128
RESULTS = Path(__file__).resolve().parents[1] / "results" / "side_by_side.json"


def _one(args: dict, tok_path: str, barrier, queue) -> None:
    """One process: build the model, warm it, wait for the others, time its steps, report tokens/s."""
    from alignlab.platform.encoder.tokenizer import Tokenizer

    torch.set_num_threads(args["threads"])
    device, batch = args["device"], args["batch"]
    tok = Tokenizer(tok_path)
    trainer = Pretrainer(config(args["size"], batch, device), tok, device=device)
    rows = to_numpy_rows(synthetic_rows(tok, 4 * batch, seed=args["seed"]))
    ready = [trainer.to_device(trainer.prepare(trainer.collate({k: v[i * batch:(i + 1) * batch] for k, v in
                                                                 rows.items()}, step=i))) for i in range(4)]
    for i in range(args["warmup"]):
        trainer.step(ready[i % 4])
    sync(device)
    barrier.wait()
    t = time.perf_counter()
    for i in range(args["steps"]):
        trainer.step(ready[i % 4])
    sync(device)
    seconds = time.perf_counter() - t
    trainer.read_metrics()
    queue.put({"seconds": seconds, "tokens": args["steps"] * batch * SEQ})


def layout(copies: int, args: dict, tok_path: str) -> dict:
    """`copies` processes side by side: their wall time from the common start, aggregate and per-copy tokens/s."""
    ctx = mp.get_context("spawn")  # CUDA cannot be forked
    barrier, queue = ctx.Barrier(copies), ctx.Queue()
    procs = [ctx.Process(target=_one, args=({**args, "seed": i}, tok_path, barrier, queue)) for i in range(copies)]
    for p in procs:
        p.start()
    results = []
    while len(results) < copies:  # a process that dies before reporting must not leave this waiting forever
        try:
            results.append(queue.get(timeout=5))
        except Empty:
            if dead := [p.exitcode for p in procs if p.exitcode not in (None, 0)]:
                for p in procs:
                    p.terminate()
                raise SystemExit(f"a side-by-side process failed (exit {dead[0]}); its traceback is above")
    for p in procs:
        p.join()
    wall = max(r["seconds"] for r in results)  # every copy started at the barrier
    tokens = sum(r["tokens"] for r in results)
    return {"copies": copies, "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall),
            "per_copy_tokens_per_s": [round(r["tokens"] / r["seconds"]) for r in results]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_args.add_flags(p, device="cuda")
    p.add_argument("--size", default="128x2")
    p.add_argument("--copies", type=int, default=3, help="models trained side by side (compared with 1 alone)")
    p.add_argument("--batch", type=int, default=256, help="rows per step of each model")
    p.add_argument("--steps", type=int, default=100, help="timed steps per model")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--vocab", type=int, default=32_000)
    bench_args.add_flags(p, threads=1, help={"threads": "torch threads per process (the host side of a step)"})
    p.add_argument("--commit", default=os.environ.get("ALIGNLAB_COMMIT", "unknown"))
    bench_args.add_flags(p, out=RESULTS)
    args = p.parse_args(argv)
    if args.size not in MODEL_SIZES:
        raise SystemExit(f"unknown size {args.size!r}: choose from {', '.join(MODEL_SIZES)}")
    if args.copies < 2:
        raise SystemExit("--copies must be at least 2 (it is compared with one model alone)")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run on a GPU machine, or --device cpu for a dry run of the code path")
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__)] + sys.argv[1:])
    result = {"command": command, "commit": args.commit,
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "machine": {**machine_info.machine("ray"), "torch": torch.__version__,
                          "device": device_label(args.device)},
              "precision": "bf16", "size": args.size, "batch": args.batch, "seq_len": SEQ, "vocab": args.vocab,
              "steps": args.steps}
    print(f"# {command}\n# commit {args.commit}  {result['date']}\n# {result['machine']}", flush=True)
    one = {k: getattr(args, k) for k in ("device", "size", "batch", "steps", "warmup", "threads")}
    with tempfile.TemporaryDirectory(prefix="alignlab-tok-") as d:
        tok = make_tokenizer(Path(d), args.vocab)
        alone = layout(1, one, tok.model_path)
        together = layout(args.copies, one, tok.model_path)
    result["alone"], result["side_by_side"] = alone, together
    result["aggregate_ratio"] = round(together["tokens_per_s"] / alone["tokens_per_s"], 3)
    for r in (alone, together):
        print(f"{args.size} x{r['copies']} side by side on one {result['machine']['device']}: "
              f"{r['tokens_per_s']:,} tok/s in all (per copy {r['per_copy_tokens_per_s']})", flush=True)
    print(f"{args.size}: {args.copies} side by side give {result['aggregate_ratio']:.2f}x the tokens/s of one alone "
          f"(bf16, batch {args.batch}, sequence {SEQ}, vocab {args.vocab})", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
