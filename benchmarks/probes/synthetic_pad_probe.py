"""How many steps does PAD's *matching* take, with and without spelling to learn? A synthetic probe.

`match_probe.py` asks the easiest question ("is letter q among these 8?"). This one asks PAD's own, on
synthetic data, so that its steps are cheap and its only difficulty is the one named:

    [CLS] l1 .. lk [SEP] w1 ... wW [SEP]      label: are l1..lk the initials of some contiguous span of w's?

k is 2-6 and W is 45 (about a mini chunk's words). A positive is a random span's initials; a negative is a
positive with one to all letters mutated or another row's positive (equal odds), never an accidental match,
as in the corpus's PAD pairs. Letters are uniform, so a letters-only classifier is at chance.

`--words letters`: each w is its letter's own token (spelling given free: only matching is learnt).
`--words N`: each w is one of N word tokens, Zipf-distributed, each with a fixed random first letter the model
must learn from PAD alone (the real task's situation with a vocabulary of N pieces).

    python benchmarks/probes/synthetic_pad_probe.py --words letters --lr 1e-4 --init fan_in --steps 10000
    python benchmarks/probes/synthetic_pad_probe.py --words 2000 --lr 1e-4 --init fan_in --steps 10000

alignlab's own `Encoder` + `SequenceHead`, Adam, batch 32, dropout off; prints training accuracy over each
`--every` steps (every batch is fresh data, so it is also held-out accuracy).

Measured on this project's 2-core CPU (2026-11-23, two runs side by side at 1 thread each, ~75 ms a step at
128x2; results/synthetic_pad_probe.json):
- `--words letters` (spelling free), 128x2, lr 1e-4, fan_in: 51.7% at 2,000 steps, 54.8% at 10,000, 56.2% at
  20,000, 58.6% at 30,000, 62.1% at 40,000 (1.28M examples). Slow, steady, no sudden take-off.
- the same at lr 3e-4: chance (49.7-51.3%) for 4,000 steps, then stopped.
- 256x3 at lr 1e-4: chance (48.9-50.7%) for all 8,000 steps.
- `--words 2000` (first letters to learn), 128x2, lr 1e-4: chance (50.1-51.1%) for all 14,000 steps, where
  spelling-free was at 55%. (A first version drew mutation letters uniformly while the words' initials were
  not: it reached 57% in 1,000 steps through that letters-only shortcut, which is why mutations now follow
  the initials' distribution, as the corpus's PAD pairs do.)
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from match_probe import add_model_args, train  # the shared encoder, optimizer and loop (this folder is on the path)

LETTERS = 26
CLS, SEP, FIRST = 1, 2, 3  # letter tokens are FIRST..FIRST+25, word tokens follow


def has_span(initials: np.ndarray, acronym: np.ndarray) -> bool:
    k = len(acronym)
    return any(np.array_equal(initials[s:s + k], acronym) for s in range(len(initials) - k + 1))


def make_batch(rng, n: int, width: int, word_letter: np.ndarray | None, zipf: np.ndarray | None):
    # Mutation letters follow the initials' own distribution (as the corpus's PAD pairs do): uniform ones would
    # let a letters-only shortcut in whenever the words' initials are not uniform.
    marginal = None if word_letter is None else np.bincount(word_letter, weights=zipf, minlength=LETTERS)
    if word_letter is None:
        initials = rng.integers(0, LETTERS, (n, width))
        words = FIRST + initials
    else:
        ids = rng.choice(len(word_letter), (n, width), p=zipf)
        initials, words = word_letter[ids], FIRST + LETTERS + ids
    acr, labels = [], np.zeros(n, dtype=np.int64)
    positives = []
    for i in range(n):
        k = int(rng.integers(2, 7))
        s = int(rng.integers(0, width - k + 1))
        positives.append(initials[i, s:s + k].copy())
    for i in range(n):
        if rng.random() < 0.5:
            acr.append(positives[i])
            labels[i] = 1
            continue
        for _ in range(100):
            if rng.random() < 0.5:
                a = positives[i].copy()
                idx = rng.choice(len(a), int(rng.integers(1, len(a) + 1)), replace=False)
                a[idx] = rng.choice(LETTERS, len(idx), p=marginal)
            else:
                a = positives[int(rng.integers(0, n))].copy()
            if not has_span(initials[i], a):
                break
        labels[i] = int(has_span(initials[i], a))
        acr.append(a)
    L = 2 + 6 + width + 1
    x = np.zeros((n, L), dtype=np.int64)
    seg = np.zeros((n, L), dtype=np.int64)
    for i, a in enumerate(acr):
        row = [CLS, *(FIRST + a).tolist(), SEP]
        seg[i, len(row):len(row) + width + 1] = 1
        row += [*words[i].tolist(), SEP]
        x[i, :len(row)] = row
    return torch.from_numpy(x), torch.from_numpy(seg), torch.from_numpy(labels)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p, lr=1e-4, steps=10000, init="fan_in", every=500)
    p.add_argument("--words", default="letters", help="'letters' or a word-vocabulary size")
    p.add_argument("--width", type=int, default=45)
    a = p.parse_args(argv)
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    rng = np.random.default_rng(a.seed)
    word_letter = zipf = None
    vocab = FIRST + LETTERS
    if a.words != "letters":
        n_words = int(a.words)
        word_letter = rng.integers(0, LETTERS, n_words)
        zipf = 1.0 / np.arange(1, n_words + 1)
        zipf /= zipf.sum()
        vocab += n_words
    train(a, vocab, 2 + 6 + a.width + 1, lambda: make_batch(rng, 32, a.width, word_letter, zipf),
          {"words": a.words, "lr": a.lr, "init": a.init}, "accuracy_recent")


if __name__ == "__main__":
    main()
