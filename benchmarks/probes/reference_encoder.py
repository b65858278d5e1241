"""Is the mini encoder's MLM plateau alignlab's, or any small encoder's? (issue #15, round 3)

A plain PyTorch pre-LN `nn.TransformerEncoder` (no alignlab model code) trained with MLM alone on alignlab's own
batches (the bundled corpus, the engine's `Collator`, uniform BERT masks, 64 tokens), scored every `--every` steps
at the held-out [MASK] positions (the same examples and masks each time). `--alibi` adds a symmetric distance bias
to the attention scores, one slope per head (ALiBi, Press et al. 2022, without the causal mask): what
`ModelConfig.alibi` does inside alignlab. Measured here (2-core Xeon, bf16, 1 thread, 128x2, init std 0.02):

    python benchmarks/probes/reference_encoder.py --steps 2000 --every 250                 # stuck: 6.7% at 2,000
    python benchmarks/probes/reference_encoder.py --steps 2500 --every 250 --alibi 1,0.25  # 9.2% at 500, 18.3% at 2,500

Results go to benchmarks/results/reference_encoder.json, one entry per command.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from alignlab.platform.bench import bench_args, machine_info
from alignlab.platform.bench.bench_corpus import load_corpus
from alignlab.platform.encoder.batching import IGNORE, Collator
from alignlab.platform.encoder.registry import resolve_objectives
from alignlab.platform.pretrain.pretrain import to_numpy_rows


class Reference(nn.Module):
    """Embeddings + LayerNorm, PyTorch's pre-LN encoder, a final LayerNorm, BERT's MLM head tied to the embeddings."""

    def __init__(self, vocab: int, hidden: int, layers: int, heads: int, max_len: int, slopes: list[float]):
        super().__init__()
        self.tok, self.pos, self.ln = nn.Embedding(vocab, hidden), nn.Embedding(max_len, hidden), nn.LayerNorm(hidden)
        layer = nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.final_ln, self.dense, self.head_ln = nn.LayerNorm(hidden), nn.Linear(hidden, hidden), nn.LayerNorm(hidden)
        self.bias = nn.Parameter(torch.zeros(vocab))
        self.slopes, self.heads = slopes, heads
        for m in self.modules():  # BERT's init, as alignlab's default
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        B, T = ids.shape
        x = self.ln(self.tok(ids) + self.pos(torch.arange(T))[None])
        if not self.slopes:
            return self.final_ln(self.enc(x, src_key_padding_mask=~keep))
        dist = (torch.arange(T)[None] - torch.arange(T)[:, None]).abs().float()
        bias = -torch.tensor(self.slopes)[:, None, None] * dist  # [heads, T, T]
        bias = bias[None] + torch.where(keep, 0.0, float("-inf"))[:, None, None, :]
        return self.final_ln(self.enc(x, mask=bias.reshape(B * self.heads, T, T)))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(self.head_ln(F.gelu(self.dense(h))), self.tok.weight, self.bias)


def slopes_list(text: str) -> list[float]:
    """`--alibi`'s value: comma-separated numbers ("" for none)."""
    return [float(s) for s in text.split(",") if s]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--storage", type=Path, default=Path("alignlab-storage"))
    p.add_argument("--corpus", type=Path, help="a finished corpus folder (default: the only one under --storage)")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--every", type=int, default=250)
    p.add_argument("--alibi", default=[], type=slopes_list,
                   help="comma list of per-head slopes, one per head (empty: no distance bias)")
    p.add_argument("--len", type=int, default=64, help="training and evaluation length in tokens")
    p.add_argument("--lr", type=float, default=1e-3)
    bench_args.add_flags(p, threads=1, out="reference_encoder.json")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    corpus, tok, train, held = load_corpus(a.storage, a.corpus)
    held = to_numpy_rows(held)
    mlm = [dataclasses.replace(o, alpha=0.0, mask_prob=0.15, mask_token_prob=0.8, random_token_prob=0.1).build(tok)
           for o in resolve_objectives("mlm")]
    collate = Collator(mlm, tok, max_len=a.len, seed=1)
    held_batches = [Collator(mlm, tok, max_len=a.len, seed=0)({k: v[i:i + 32] for k, v in held.items()},
                                                             step=(1 << 40) + i // 32) for i in range(0, 800, 32)]
    slopes, heads = a.alibi, 2
    if slopes and len(slopes) != heads:
        sys.exit(f"reference_encoder: --alibi needs {heads} slopes (one per head), got {len(slopes)}")
    model = Reference(tok.vocab_size, 128, 2, heads, 128, slopes)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    warm = 100  # then linear decay to 0 at the last step, as the mini preset
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / warm, max(0.0, (a.steps - s) / (a.steps - warm))))

    def masked(b):
        h = model(b["input_ids"], b["attention_mask"].bool())
        labels = b["mlm"].reshape(-1)
        at = torch.nonzero(labels != IGNORE).squeeze(1)
        return model.logits(h.reshape(-1, h.shape[-1]).index_select(0, at)), labels[at], b["input_ids"].reshape(-1)[at]

    def accuracy_at_mask() -> float:
        # Scored in train mode (dropout is 0): nn.TransformerEncoder's eval fast path mishandles 3-D float masks.
        ok = n = 0
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            for b in held_batches:
                logits, labels, inputs = masked(b)
                at_mask = inputs == tok.mask_id
                ok += int(((logits.argmax(-1) == labels) & at_mask).sum())
                n += int(at_mask.sum())
        return round(100 * ok / n, 2)

    command = bench_args.command("probes/reference_encoder.py", argv)
    print(f"# {command}\n# corpus {corpus.name}, bf16 autocast, {a.threads} thread(s), slopes {slopes or 'none'}",
          flush=True)
    order = np.random.default_rng(0).permutation(train.num_rows)
    points, t0 = [], time.time()
    for step in range(a.steps):
        start = (step * 32) % (len(order) - 32)
        b = collate(to_numpy_rows(train.take(order[start:start + 32])), step=step)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, labels, _ = masked(b)
            loss = F.cross_entropy(logits.float(), labels)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if (step + 1) % a.every == 0:
            point = {"step": step + 1, "seconds": round(time.time() - t0), "loss": round(loss.item(), 3),
                     "masked_accuracy_uniform": accuracy_at_mask()}
            points.append(point)
            print(json.dumps(point), flush=True)
    print(f"# {command}")
    machine_info.record(a.out, {"command": command, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                "slopes": slopes, "points": points})


if __name__ == "__main__":
    main()
