"""Which synthetic world and which small model make PAD learnable? A fast in-process probe for the alignment control.

The alignment control (studies/alignment_control.py) needs PAD to leave chance in minutes on a CPU; its pipeline
probe (benchmarks/probes/alignment_control_pad_probe.py) costs minutes of Ray start-up and corpus build a run. This probe
asks the same question in one process, on the control's own parts, so that a world and a model can be tried in
about a minute:

- documents from `synthetic.synthetic_text` with the world's knobs (`--words`, `--initials`, `--per-initial`,
  `--no-letters`), tokenized by a sentencepiece model trained on them at the control's vocabulary size;
- PAD pairs drawn by PAD's own `make_pad_pairs` (fresh every batch, replacement letters from the documents'
  initial distribution), laid out `[CLS] a c r [SEP] chunk [SEP]` as the pretraining collator does;
- alignlab's `Encoder` + `SequenceHead` (the PAD head), Adam at `--lr` with the pretraining schedule (warmup 100,
  linear decay to 0 at the last step), dropout off, batch 32.

Prints held-out PAD accuracy (1,000 pairs of documents of another namespace) every `--every` steps.

    flock /tmp/alignlab-heavy.lock .venv/bin/python benchmarks/probes/synthetic_world_pad_probe.py --init fan_in --lr 1e-3
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def world_documents(n: int, namespace: str, a) -> list[str]:
    from alignlab.platform.sources import synthetic as syn

    return [syn.synthetic_text(random.Random(f"probe:{namespace}:{i}"), not a.no_letters)[0] for i in range(n)]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--every", type=int, default=250)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--init", choices=("bert", "fan_in"), default="bert")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--words", default=None, help="document length in words, 'lo,hi' (default: the source's)")
    ap.add_argument("--no-letters", action="store_true", help="no one-letter words in the documents")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)

    from alignlab.objectives.pseudo_acronym import make_pad_pairs
    from alignlab.platform.encoder.model_config import ModelConfig
    from alignlab.platform.encoder.model import Encoder, SequenceHead
    from alignlab.platform.encoder.tokenizer import Tokenizer, train_tokenizer
    from alignlab.platform.sources import synthetic as syn
    from alignlab.platform.sources.text import letter_distribution
    from alignlab.studies.alignment_control import CORPUS

    if a.words:
        syn.SYNTHETIC_WORDS = tuple(int(x) for x in a.words.split(","))
    docs = world_documents(syn.SYNTHETIC_DOCS, "corpus", a)
    held = world_documents(1000, "held", a)
    tmp = Path(tempfile.mkdtemp())
    train_tokenizer(iter(docs), tmp / "t.model", vocab_size=CORPUS.vocab_size)
    tok = Tokenizer(tmp / "t.model")
    probs = letter_distribution(docs)
    max_len = CORPUS.max_len

    def batch(texts: list[str], rng: np.random.Generator):
        words = [t.split() for t in texts]
        pairs = make_pad_pairs(words, rng, probs)
        ids = np.zeros((len(texts), max_len), dtype=np.int64)
        seg = np.zeros_like(ids)
        y = np.full(len(texts), -100, dtype=np.int64)
        for i, (w, (acr, label, _)) in enumerate(zip(words, pairs)):
            if label < 0:
                continue
            lead = tok.encode_spelled(acr)
            chunk = [p for ps in tok.encode_words(w) for p in ps][:max_len - 3 - len(lead)]
            row = [tok.cls_id, *lead, tok.sep_id, *chunk, tok.sep_id]
            ids[i, :len(row)] = row
            seg[i, len(lead) + 2:len(row)] = 1
            y[i] = label
        keep = y >= 0
        T = int((ids[keep] != 0).sum(1).max()) if tok.pad_id == 0 else max_len
        return (torch.from_numpy(ids[keep, :T]), torch.from_numpy(seg[keep, :T]), torch.from_numpy(y[keep]))

    cfg = ModelConfig(hidden=a.hidden, num_layers=a.layers, head_dim=a.head_dim, ffn=4 * a.hidden, max_len=max_len,
                      norm="pre", dropout=0.0, init=a.init)
    enc, head = Encoder(cfg, tok.vocab_size), SequenceHead(a.hidden, 2, 0.0)
    params = [*enc.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=a.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / 100, max(0.0, (a.steps - s) / max(1, a.steps - 100))))
    rng = np.random.default_rng(a.seed)
    held_batches = [batch(held[i:i + 100], np.random.default_rng(i)) for i in range(0, len(held), 100)]
    t0 = time.time()
    for step in range(a.steps):
        x, s, y = batch([docs[i] for i in rng.integers(0, len(docs), a.batch)], rng)
        logits = head(enc(x, s, x != tok.pad_id)[:, 0])
        loss = torch.nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if (step + 1) % a.every == 0:
            with torch.no_grad():
                enc.eval()
                hits = n = 0
                for x, s, y in held_batches:
                    hits += int((head(enc(x, s, x != tok.pad_id)[:, 0]).argmax(-1) == y).sum())
                    n += len(y)
                enc.train()
            print(json.dumps({"step": step + 1, "heldout_pad": round(hits / n, 3), "n": n,
                              "seconds": round(time.time() - t0)}), flush=True)
    print("CONFIG", json.dumps({**vars(a), "words": list(syn.SYNTHETIC_WORDS), "vocab": tok.vocab_size}))


if __name__ == "__main__":
    main()
