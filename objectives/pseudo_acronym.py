"""PAD, pseudo-acronym detection (paper §3.2): does this acronym match initials of a span of the chunk?

Input: `[CLS] acronym [SEP] chunk [SEP]`, scored from [CLS]; AD reuses this head's shape. The pairs are
made at corpus time (`make_pad_pairs`, steps 1-3 of §3.2), among the linked chunks of a labelling batch, and
used on the first pass over the corpus; every later pass draws new pairs among the acronym examples of each
training batch (`PseudoAcronym.redraw_pairs`), so a corpus repeated for several epochs does not repeat its pairs.
A chunk cut to fit a shorter example gets a new pair drawn from its visible words (`PseudoAcronym.fit_to_length`).

Initials and eligible spans are those of `alignlab.platform.sources.text`: a word's initial is its first
alphabetic character, accents dropped, lowercased, in a-z, else the word is ineligible; only contiguous
spans of `min_words`..`max_words` (2..6) eligible words count.

`make_pad_pairs` makes one (acronym, label, kind) per chunk:
- The valid chunks (those with at least one eligible span) are split exactly in half by a random
  permutation: half positives (label 1, kind "pos"), half negatives (label 0); with an odd count
  a fair coin gives the extra one. Chunks with no eligible span get ("", -1, "none").
- A chunk's *positive candidate*: span length uniform over the lengths that have an eligible span
  in the chunk, then a start uniform over the eligible spans of that length; its initials.
- A negative is, with equal probability,
  "mutate": the chunk's own positive candidate with k letters replaced, k uniform in 1..len, the
  k positions a uniform subset, each replacement drawn from the corpus's word-initial letter
  distribution `letter_probs` and never equal to the letter it replaces; or
  "other": the positive candidate of another valid chunk of the batch, chosen uniformly.
- No accidental match (step 3): a negative never equals the initials of any 2-6-word eligible
  span of its own chunk. A colliding draw is redrawn with the same length (so the length
  distribution of negatives stays that of the first draws, i.e. of positives): "mutate" with a
  fresh candidate of that length and fresh k, positions and letters; "other" with another chunk's
  candidate of that length, and after `_OTHER_RETRIES` failures by mutation. After
  `_MUTATE_RETRIES` more failures the chunk gets ("", -1, "none") (never seen on real text).

Why replacement letters follow the corpus distribution rather than uniform a-z: uniform mutations
put rare letters (x, q, z) into negatives, and a classifier that reads only the acronym's letters
tells them apart from positives, a shortcut that teaches no spelling. Drawing "from p but different
from the letter replaced" is still biased: it under-draws frequent letters (a "t" can never replace
a "t"). So replacement letters are drawn from the kernel K(c, l) = q_l / (1 - q_c) (l != c),
with q solved so that p K = p: a mutated letter is distributed exactly like the letter it
replaced, and the letters of negatives match those of positives. Lengths match too: "mutate" keeps
the candidate's length, "other" takes another chunk's candidate, and redraws keep the length.
"""
from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import pyarrow as pa
import torch

from alignlab.platform.encoder.batching import IGNORE
from alignlab.platform.encoder.model import SequenceHead
from alignlab.platform.encoder.registry import CorpusLabels, Objective, classification_sums, register
from alignlab.platform.runtime.throughput import TwoWayClsHeadFlops
from alignlab.platform.sources.text import (INELIGIBLE, LETTERS, InitialCache, check_span_lengths, initials_string,
                                         letter_distribution, mutation_kernel)

_OTHER_RETRIES = 16
_MUTATE_RETRIES = 64
MAX_WORDS = 6
"""The longest span an acronym abbreviates (`make_pad_pairs`' default `max_words`, the corpus labeller's)."""
ACRONYM_TOKENS = MAX_WORDS + 1
"""The most tokens an acronym takes: one a letter in the "letters" form; a text form may add a leading piece."""
LETTER_SAMPLE_DOCS = 5000
"""Documents of the tokenizer sample whose word initials give the replacement-letter distribution."""


class _Chunk:
    """A chunk's initials string and its eligible spans by length, computed once."""

    __slots__ = ("s", "lengths", "runs")

    def __init__(self, s: str, min_words: int, max_words: int):
        self.s = s
        if INELIGIBLE not in s:
            self.runs = None
            self.lengths = list(range(min_words, min(max_words, len(s)) + 1))
        else:
            runs, pos = [], 0
            for part in s.split(INELIGIBLE):
                if len(part) >= min_words:
                    runs.append((pos, len(part)))
                pos += len(part) + 1
            self.runs = runs
            longest = max((r for _, r in runs), default=0)
            self.lengths = list(range(min_words, min(max_words, longest) + 1))

    def span(self, length: int, u: float) -> str | None:
        """Initials of the eligible span of `length` picked by u in [0, 1); None if there is none."""
        s = self.s
        if self.runs is None:
            count = len(s) - length + 1
            if count <= 0:
                return None
            i = min(int(u * count), count - 1)
            return s[i:i + length]
        counts = [max(0, r - length + 1) for _, r in self.runs]
        total = sum(counts)
        if total == 0:
            return None
        i = min(int(u * total), total - 1)
        for (off, _), c in zip(self.runs, counts):
            if i < c:
                return s[off + i:off + i + length]
            i -= c
        return None  # unreachable

    def candidate(self, u_len: float, u_start: float) -> str:
        ls = self.lengths
        length = ls[min(int(u_len * len(ls)), len(ls) - 1)]
        return self.span(length, u_start)


def _mutate(cand: str, u_k: float, u_pos: Sequence[float], u_let: Sequence[float], cum: list[list[float]],
            K: np.ndarray) -> str:
    L = len(cand)
    k = min(int(u_k * L), L - 1) + 1
    chosen = sorted(range(L), key=u_pos.__getitem__)[:k]
    out = list(cand)
    for j in chosen:
        c = ord(out[j]) - 97
        r = bisect.bisect_right(cum[c], u_let[j])
        if r == c or r > 25:  # float edge at the end of a row: take the row's likeliest other letter
            r = int(np.argmax(K[c]))
        out[j] = LETTERS[r]
    return "".join(out)


def make_pad_pairs(
    chunks: Sequence[Sequence[str]],
    rng: np.random.Generator,
    letter_probs: np.ndarray,
    *,
    min_words: int = 2,
    max_words: int = MAX_WORDS,
) -> list[tuple[str, int, str]]:
    """One (acronym, label, kind) per chunk (a chunk is its list of words); rules in the module docstring.

    label 1 = positive (kind "pos"), 0 = negative (kind "mutate" or "other"), -1 = no eligible span
    (kind "none", acronym ""); callers skip label -1. Among the others labels are 50/50 (+-1).
    """
    check_span_lengths(min_words, max_words)
    K = mutation_kernel(letter_probs)
    cum = np.cumsum(K, axis=1)
    cum[:, -1] = 1.0
    cum = cum.tolist()

    cache = InitialCache()
    n = len(chunks)
    info = [_Chunk(initials_string(words, cache), min_words, max_words) for words in chunks]
    valid = [i for i, c in enumerate(info) if c.lengths]
    nv = len(valid)
    out: list[tuple[str, int, str]] = [("", -1, "none")] * n
    if nv == 0:
        return out
    where = {i: k for k, i in enumerate(valid)}

    n_pos = nv // 2 + (int(rng.random() < 0.5) if nv % 2 else 0)
    order = rng.permutation(nv)
    is_pos = np.zeros(nv, dtype=bool)
    is_pos[order[:n_pos]] = True
    is_pos = is_pos.tolist()
    # Pre-drawn uniforms (vectorised); redraws after a collision take fresh scalars from rng.
    U = rng.random((nv, 6)).tolist()  # len, start, kind, other chunk, k, (spare)
    W = rng.random((nv, 2 * max_words)).tolist()  # mutation positions | replacement letters

    def other_chunk(i_pos: int, u: float) -> _Chunk:
        j = min(int(u * (nv - 1)), nv - 2)
        return info[valid[j + (j >= i_pos)]]

    for k, i in enumerate(valid):
        ch = info[i]
        u = U[k]
        if is_pos[k]:
            out[i] = (ch.candidate(u[0], u[1]), 1, "pos")
            continue
        s = ch.s
        kind = "mutate" if (u[2] < 0.5 or nv < 2) else "other"
        if kind == "mutate":
            cand = ch.candidate(u[0], u[1])
            w = W[k]
            neg = _mutate(cand, u[4], w[:max_words], w[max_words:], cum, K)
            length = len(cand)
        else:
            neg = other_chunk(k, u[3]).candidate(u[0], u[1])
            length = len(neg)
            tries = 0
            while neg in s and tries < _OTHER_RETRIES:
                tries += 1
                got = other_chunk(k, rng.random()).span(length, rng.random())
                if got is not None:
                    neg = got
            if neg in s:
                kind = "mutate"
        if neg in s and kind == "mutate":
            for _ in range(_MUTATE_RETRIES):
                cand = ch.span(length, rng.random())
                if cand is None:  # "other" fell back with a length this chunk lacks
                    length = ch.lengths[int(rng.random() * len(ch.lengths))]
                    continue
                neg = _mutate(cand, rng.random(), rng.random(max_words).tolist(),
                              rng.random(max_words).tolist(), cum, K)
                if neg not in s:
                    break
        # an a-z string of length >= 2 is a substring of the chunk's initials string iff it is the
        # initials of an eligible span (it cannot cross an ineligible word's "#")
        out[i] = (neg, 0, kind) if neg not in s and len(neg) >= min_words else ("", -1, "none")
    return out


class PseudoAcronymLabels(CorpusLabels):
    """An (acronym, label) pair per linked chunk, drawn among the linked chunks of each labelling batch; other
    rows get ("", -1). Replacement letters follow the word-initial letter distribution of the corpus sample."""

    row_columns = {"pad_acronym": pa.string(), "pad_label": pa.int8()}
    stats_columns = ("pad_label",)

    def __init__(self) -> None:
        self.letter_probs = np.full(26, 1 / 26)

    def fit(self, sample: list[str]) -> None:
        if sample:
            self.letter_probs = letter_distribution(sample[:LETTER_SAMPLE_DOCS])

    def label_rows(self, rows: list[dict], rng: np.random.Generator) -> None:
        linked = [r for r in rows if r["kind"] == "wiki"]
        pairs = make_pad_pairs([r["a_text"].split() for r in linked], rng, self.letter_probs) if linked else []
        for r in rows:
            r["pad_acronym"], r["pad_label"] = "", -1
        for r, (acr, label, _kind) in zip(linked, pairs):
            r["pad_acronym"], r["pad_label"] = acr, int(label)

    def count(self, table: pa.Table, acc: Counter) -> None:
        acc.update(table.column("pad_label").to_pylist())

    def stats(self, acc: Counter) -> dict:
        return {"pad_pairs": {"positive": acc.get(1, 0), "negative": acc.get(0, 0), "none": acc.get(-1, 0)}}


@register
@dataclass(frozen=True, kw_only=True, slots=True)
class PseudoAcronymConfig:
    name: ClassVar[str] = "pad"
    default_set_rank: ClassVar[int] = 3  # the paper's four, in its order (`registry.default_set`)
    # PretrainConfig.layout_fraction (the share of linked rows that become PAD examples) was acronym_fraction
    # before PAD owned its layout: config dicts keep that key, so every model id made before stays.
    layout_fraction_key: ClassVar[str] = "acronym_fraction"
    weight: float = 1.0
    acronym_form: str = "letters"
    """"letters": one token per letter; "text": sentencepiece pieces of the acronym."""
    subword_alpha: float = 0.0
    """> 0: the chunk of every PAD example is re-segmented by sentencepiece sampling at this alpha (subword
    regularization, Kudo 2018), fresh each time it is seen. The paper pairs PAD with subword regularization
    "to teach the model spelling" (§3.2): a sampled segmentation often splits a word's first letter off as
    its own word-initial piece ("▁w orld"), the same token the "letters" form gives that letter, which
    gives a small model a first foothold on matching letters to words. 0 turns it off."""
    chunk_labels: bool = field(default=False, metadata={"omit_at_default": True})
    """True: the chunk of an acronym example keeps the token labels the other objectives give it (WHP's tags), so a
    linked row that becomes a PAD example still trains WHP. False (the paper leaves it open; alignlab's behaviour
    before this field): an acronym example trains PAD alone, and with `PretrainConfig.layout_fraction` 0.5 WHP sees
    half of the linked rows. MLM never predicts in an acronym example: a masked word of the span would make the
    acronym unmatchable and its label wrong. A chunk whose pieces were re-segmented (`subword_alpha`) keeps no
    labels (they were made for the corpus's pieces)."""

    def __post_init__(self) -> None:
        if self.weight < 0 or self.subword_alpha < 0:
            raise ValueError("pad.weight and pad.subword_alpha must be >= 0")
        if self.acronym_form not in ("letters", "text"):
            raise ValueError(f"pad.acronym_form must be 'letters' or 'text', got {self.acronym_form!r}")

    def build(self, tokenizer) -> "PseudoAcronym":
        return PseudoAcronym(self, tokenizer)


class PseudoAcronym(TwoWayClsHeadFlops, Objective):
    name = "pad"
    example_format = "acronym"
    corpus_labels = PseudoAcronymLabels
    corpus_columns = tuple(PseudoAcronymLabels.row_columns)
    linked_only = True

    def example_rows(self, rows) -> list[bool]:
        return [str(k) == "wiki" and int(lab) in (0, 1) for k, lab in zip(rows["kind"], rows["pad_label"])]

    def load(self, ex, rows) -> None:
        ex.lead_chunk_labels = self.config.chunk_labels
        labels = np.full(len(ex.a), IGNORE, dtype=np.int64)
        for i, f in enumerate(ex.fmt):
            if f == "acronym":
                ex.lead[i] = self.tokenizer.encode_spelled(str(rows["pad_acronym"][i]), self.config.acronym_form)
                labels[i] = int(rows["pad_label"][i])
        ex.example_labels["pad"] = labels

    @property
    def letter_probs(self) -> np.ndarray:
        """The word-initial letter distribution for pairs drawn at batch time, from the corpus's token counts (the
        first letter of every word-initial piece, weighted by its count): the corpus-time labeller's estimate
        from the tokenizer sample is not stored with the corpus, and this one needs nothing but the tokenizer."""
        if getattr(self, "_letter_probs", None) is None:
            tok, counts = self.tokenizer, np.zeros(26)
            cache = InitialCache()
            for i in np.flatnonzero(tok.word_start & (tok.counts > 0)):
                c = cache[tok.sp.id_to_piece(int(i))[1:]]
                if c != INELIGIBLE:
                    counts[ord(c) - 97] += tok.counts[i]
            self._letter_probs = counts / counts.sum() if counts.sum() else np.full(26, 1 / 26)
        return self._letter_probs

    def redraw_pairs(self, ex, rng: np.random.Generator) -> None:
        """New (acronym, label) pairs for the batch's acronym examples, drawn by `make_pad_pairs` among them: on a
        second or later pass over the corpus a chunk gets a fresh pair, not the one stored at corpus time."""
        rows = [i for i, f in enumerate(ex.fmt) if f == "acronym"]
        if not rows:
            return
        pairs = make_pad_pairs([str(ex.rows["a_text"][i]).split() for i in rows], rng, self.letter_probs)
        labels = ex.example_labels["pad"]
        for i, (acr, label, _kind) in zip(rows, pairs):
            ex.lead[i] = self.tokenizer.encode_spelled(acr, self.config.acronym_form) if label >= 0 else []
            labels[i] = label if label >= 0 else IGNORE

    def fit_to_length(self, ex, rng: np.random.Generator) -> dict[int, list[str]]:
        """Cut the chunks that do not fit their example to whole words, and draw their pairs anew from what is left.

        The collator cuts a chunk longer than its example's room, and a positive's span may be in the part cut off:
        its label would then be wrong. That happens when a step's sequence length is shorter than the corpus's
        (`PretrainConfig.short_seq_len`: 6% of the positives at 64 tokens on the bundled corpus), and to the odd
        long chunk with a long acronym. Such chunks keep the whole words that fit beside the longest acronym, and
        get pairs drawn by `make_pad_pairs` among themselves (half positives), from the words the model sees.
        Returns the kept words by row."""
        over = [i for i, f in enumerate(ex.fmt)
                if f == "acronym" and len(ex.a[i]) > ex.max_len - 3 - len(ex.lead[i] or ())]
        if not over:
            return {}
        room = ex.max_len - 3 - ACRONYM_TOKENS
        kept: dict[int, list[str]] = {}
        for i in over:
            words = str(ex.rows["a_text"][i]).split()
            pieces, n, used = self.tokenizer.encode_words(words), 0, 0
            while n < len(words) and used + len(pieces[n]) <= room:
                used, n = used + len(pieces[n]), n + 1
            kept[i], ex.a[i] = words[:n], [t for w in pieces[:n] for t in w]
        labels = ex.example_labels["pad"]
        for i, (acr, label, _kind) in zip(over, make_pad_pairs(list(kept.values()), rng, self.letter_probs)):
            ex.lead[i] = self.tokenizer.encode_spelled(acr, self.config.acronym_form) if label >= 0 else []
            labels[i] = label if label >= 0 else IGNORE
        return kept

    def corrupt(self, ex, rng: np.random.Generator) -> None:
        if ex.epoch > 0:
            # The collator's generator is keyed by (seed, step), and steps never repeat: every pass draws anew,
            # and a resumed run draws what the uninterrupted one did.
            self.redraw_pairs(ex, rng)
        kept = self.fit_to_length(ex, rng)
        alpha = self.config.subword_alpha
        if alpha <= 0:
            return
        for i, f in enumerate(ex.fmt):
            if f != "acronym":
                continue
            room = ex.max_len - 3 - len(ex.lead[i] or ())
            words = kept.get(i) or str(ex.rows["a_text"][i]).split()
            pieces = [t for w in self.tokenizer.encode_words(words, alpha=alpha, seed=int(rng.integers(1, 2**31)))
                      for t in w]
            # A sampled segmentation is longer; one that no longer fits keeps the chunk's own pieces rather
            # than cutting words off the end (which could cut the positive's span and flip its label).
            if len(pieces) <= room:
                ex.a[i] = pieces

    @property
    def num_classes(self) -> int:
        return 2

    def build_head(self, model_cfg, encoder) -> torch.nn.Module:
        return SequenceHead(model_cfg.hidden, 2, model_cfg.dropout)

    def loss_and_sums(self, head, hidden_BTH, batch):
        return classification_sums(head(hidden_BTH[:, 0]), batch["pad"])

