"""Can the encoder learn to *match* tokens at all, and how fast? A synthetic probe behind the PAD findings.

The task is the simplest piece of PAD: `[CLS] q [SEP] t1 ... tW [SEP]` with random letters; the label
says whether q is one of the t's (half the examples, as in PAD). Same tokens on both sides, so no spelling
needs learning, only the attention that compares q with every t and reports to [CLS]. alignlab's own
`Encoder` + `SequenceHead` (the PAD head), Adam, batch 32, dropout off.

    python benchmarks/probes/match_probe.py --lr 1e-3 --steps 5000 --every 500
    python benchmarks/probes/match_probe.py --lr 1e-4 --steps 5000 --every 500

Measured on this project's 2-core CPU (W=8, 26 letters, 128x2, seed 0; training accuracy over the last 500
steps): at lr 1e-3 (the mini preset's pretraining rate) it stays at chance (49.6-50.8%) for all 5,000 steps;
at lr 1e-4 (the paper's) it is at chance until ~2,000 steps, then learns: 55.4% at 2,500, 58.4% at 3,000,
61.5% at 5,000. (An earlier scratch version with another random stream started at ~1,750 steps; PyTorch's own
`nn.TransformerEncoder`, pre-LN, was also stuck at 1e-3 and reached 86% by 2,000 and 99.5% by 3,000 steps at
1e-4.) With `--init fan_in` (std 1/sqrt(fan-in) instead of BERT's 0.02) the same run at lr 1e-4 leaves chance by
1,000 steps: 63% at 1,000, 89% at 2,000, 98% at 3,000. Real PAD is far harder: 2-6 letters in order, among ~45 words, with the first letter of each of
thousands of pieces to learn.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np
import torch

from alignlab.platform.bench import bench_args
from alignlab.platform.config import MODEL_SIZES
from alignlab.platform.encoder.model import Encoder, SequenceHead


def batch(rng: np.random.Generator, n: int, words: int, letters: int) -> tuple[torch.Tensor, torch.Tensor]:
    chunk = rng.integers(0, letters, (n, words))
    want = rng.random(n) < 0.5
    q = np.empty(n, dtype=np.int64)
    for i in range(n):
        present = set(chunk[i].tolist())
        absent = [c for c in range(letters) if c not in present]
        q[i] = rng.choice(sorted(present)) if want[i] or not absent else rng.choice(absent)
        want[i] = q[i] in present
    cls, sep, first = 1, 2, 3
    x = np.concatenate([np.full((n, 1), cls), first + q[:, None], np.full((n, 1), sep), first + chunk,
                        np.full((n, 1), sep)], 1)
    return torch.from_numpy(x), torch.from_numpy(want.astype(np.int64))


def add_model_args(p: argparse.ArgumentParser, *, lr: float, steps: int, init: str, every: int) -> None:
    """The encoder, optimizer and run arguments the synthetic probes share."""
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--init", choices=("bert", "fan_in"), default=init, help="the encoder's init (ModelConfig.init)")
    p.add_argument("--every", type=int, default=every)
    p.add_argument("--seed", type=int, default=0)
    bench_args.add_flags(p, threads=1)


def train(a: argparse.Namespace, vocab: int, max_len: int, next_batch, label: dict, metric: str) -> None:
    """alignlab's `Encoder` + `SequenceHead`, Adam, dropout off, on `next_batch()` -> (ids, segments, labels);
    prints `metric` (accuracy over the last `a.every` batches) every `a.every` steps."""
    cfg = dataclasses.replace(MODEL_SIZES["128x2"], hidden=a.hidden, num_layers=a.layers, head_dim=a.head_dim,
                              max_len=max_len, dropout=0.0, init=a.init)
    enc, head = Encoder(cfg, vocab), SequenceHead(a.hidden, 2, 0.0)
    opt = torch.optim.Adam([*enc.parameters(), *head.parameters()], lr=a.lr)
    correct, t0 = [], time.time()
    for step in range(a.steps):
        x, seg, y = next_batch()
        logits = head(enc(x, seg, x != 0)[:, 0])
        loss = torch.nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        correct.append((logits.argmax(-1) == y).float().mean().item())
        if (step + 1) % a.every == 0:
            print(json.dumps({"step": step + 1, **label, metric: round(float(np.mean(correct[-a.every:])), 3),
                              "seconds": round(time.time() - t0)}), flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p, lr=1e-3, steps=2000, init="bert", every=250)
    p.add_argument("--words", type=int, default=8)
    p.add_argument("--letters", type=int, default=26)
    a = p.parse_args(argv)
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    rng = np.random.default_rng(a.seed)

    def next_batch():
        x, y = batch(rng, 32, a.words, a.letters)
        seg = torch.zeros_like(x)
        seg[:, 3:] = 1
        return x, seg, y

    train(a, 3 + a.letters, max(16, a.words + 4), next_batch, {"lr": a.lr}, "train_accuracy_recent")


if __name__ == "__main__":
    main()
