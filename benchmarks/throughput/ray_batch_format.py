"""Where the Ray Train run of the mini preset spends time that the plain loop does not: turning Ray Data's Arrow
blocks into the numpy batches the collator takes.

The plain loop of `pretrain_throughput.py --part ray` is fed row batches converted to numpy before its clock
starts; under Ray Train every 32-row batch is sliced from an Arrow block and formatted to numpy (object arrays for
the list columns) inside the worker, by Ray Data's format thread pool, on the same cores as the training step.
This times that work alone (Ray's own `BlockAccessor.to_batch_format("numpy")`, no cluster needed) next to the
engine's collation of the same batch, on the synthetic shard rows of `pretrain_throughput.py`. CPU figures on a
shared machine: read them as ratios.

    python benchmarks/throughput/ray_batch_format.py
"""
from __future__ import annotations

import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pretrain_throughput import load_average, make_tokenizer, pretrain_config, synthetic_rows  # noqa: E402

from alignlab.platform.pretrain.pretrain import Pretrainer  # noqa: E402


def per_batch_ms(fn, batches, reps: int = 3) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        for b in batches:
            fn(b)
        best = min(best, (time.perf_counter() - t) / len(batches))
    return best * 1e3


def main() -> None:
    from ray.data.block import BlockAccessor

    torch.set_num_threads(1)
    print(f"# python {shlex.join([os.path.relpath(__file__)] + sys.argv[1:])}\n# load average at start: "
          f"{load_average()}", flush=True)
    with tempfile.TemporaryDirectory() as d:
        tok = make_tokenizer(Path(d))
        table = synthetic_rows(tok, 2048)
        slices = [table.slice(i, 32) for i in range(0, 2048, 32)]
        fmt = per_batch_ms(lambda t: BlockAccessor.for_block(t).to_batch_format("numpy"), slices)
        rows = [BlockAccessor.for_block(t).to_batch_format("numpy") for t in slices]
        trainer = Pretrainer(pretrain_config("128x2"), tok)
        collate = per_batch_ms(lambda r: trainer.collate(r, step=0), rows)
    print(f"Ray Data numpy formatting of a 32-row batch: {fmt:.2f} ms; the engine's collation of it: "
          f"{collate:.2f} ms (1 thread; best of 3 passes over 64 batches); load {load_average()}", flush=True)


if __name__ == "__main__":
    main()
