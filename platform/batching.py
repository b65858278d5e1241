"""Rows of corpus shards → model-ready batches, with the on-the-fly labels of the objectives.

Plain numpy/torch, no Ray: the pretraining loop calls `Collator(rows, step)` on each batch of rows
it streams. Randomness is keyed by (seed, rank, step) instead of a running generator, so a resumed
run makes exactly the batches the uninterrupted run would have made. Every array of a batch is per row ([B] or
[B, T]): length bucketing (`bucketing.py`) collates a window of rows at once and cuts it into batches by row.

The example mix: every row becomes exactly one example, `[CLS] chunk [SEP] next-or-random [SEP]` (the "pair"
layout), unless an objective declares a layout of its own (`example_format`) and says the row can take it
(`example_rows`): such a row then takes it with probability `layout_fraction`, `[CLS] lead [SEP] chunk [SEP]`,
where the objective writes the lead tokens (`Examples.lead`). Both kinds share one encoder pass. The chunk of
such an example keeps its token labels when the objective says so (`Examples.lead_chunk_labels`).
"""
from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np
import torch

IGNORE = -100
"""The label of positions and examples that no loss scores (PyTorch's cross-entropy ignore_index): the one
definition for the engine and the objectives."""
PAIR = "pair"
"""The layout every row takes unless an objective's own layout draws it (`row_format` 0; the other is 1)."""


class Examples:
    """A batch as Python lists, the view objectives edit before tensors are made."""

    def __init__(self, rows: dict, fmt: list[str], a: list[list[int]], b: list[list[int] | None], max_len: int):
        n = len(fmt)
        self.rows, self.fmt, self.a, self.b, self.max_len = rows, fmt, a, b, max_len
        self.a_orig = list(a)
        self.doc_id = [str(x) for x in rows["doc_id"]]
        self.kind = [str(x) for x in rows["kind"]]
        self.lead: list[list[int] | None] = [None] * n
        """The tokens before the chunk of a row in an objective's own layout (written by that objective)."""
        self.a_labels: dict[str, list[np.ndarray]] = {}
        self.b_labels: dict[str, list[np.ndarray | None]] = {}
        self.a_labels_orig: dict[str, list[np.ndarray]] = {}
        self.example_labels: dict[str, np.ndarray] = {}
        self.epoch = 0
        """The pass over the corpus these rows come from (0 = the first)."""
        self.lead_chunk_labels = False
        """Do rows of the objective's own layout keep their chunk's token labels (the objective says)?"""

    def add_token_labels(self, key: str, a_col: Sequence, b_col: Sequence) -> None:
        a_lab = []
        b_lab = []
        for i in range(len(self.fmt)):
            a_lab.append(_labels_or_ignore(a_col[i], len(self.a[i])))
            b_lab.append(None if self.b[i] is None else _labels_or_ignore(b_col[i], len(self.b[i])))
        self.a_labels[key], self.b_labels[key], self.a_labels_orig[key] = a_lab, b_lab, list(a_lab)


def _labels_or_ignore(col, n: int) -> np.ndarray:
    if col is None or len(col) != n:  # absent, or tokens re-sampled by subword regularization
        return np.full(n, IGNORE, dtype=np.int64)
    return col.astype(np.int64) if isinstance(col, np.ndarray) else np.fromiter(col, dtype=np.int64, count=n)


class Collator:
    def __init__(self, objectives: Sequence, tokenizer, *, max_len: int, layout_fraction: float = 0.25,
                 subword_alpha: float = 0.0, seed: int = 0, rank: int = 0, pad_to_max_len: bool = False):
        """`pad_to_max_len`: every batch is the step's full length wide, not its longest example's (static shapes
        for `torch.compile`)."""
        self.objectives, self.tok, self.max_len = list(objectives), tokenizer, max_len
        self.pad_to_max_len = pad_to_max_len
        self.layout_fraction, self.subword_alpha = layout_fraction, subword_alpha
        own = sorted({o.example_format for o in self.objectives} - {PAIR})
        if len(own) > 1:
            raise ValueError(f"objectives declare {len(own)} layouts of their own ({', '.join(own)}); a batch "
                             "draws rows into one")
        self.layout = own[0] if own else None
        self.seed, self.rank = seed, rank

    def rng(self, step: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.rank, step])

    def __call__(self, rows: dict, step: int, max_len: int | None = None, epoch: int = 0) -> dict[str, torch.Tensor]:
        """One batch; `max_len` (default: the collator's) is the longest example this step, in tokens; `epoch` is
        the pass over the corpus the rows come from (objectives may draw labels afresh on every pass)."""
        L = max_len or self.max_len
        rng = self.rng(step)
        n = len(rows["doc_id"])
        kind = [str(k) for k in rows["kind"]]
        # A row may take an objective's own layout when that objective says it can; the draw is made only for
        # such rows, in row order: `rng.random(k)` gives the numbers k calls of `rng.random()` give, so the
        # batch is the one the per-row draws made.
        can = np.zeros(n, dtype=bool)
        for o in self.objectives:
            if o.example_format != PAIR:
                can |= np.asarray(o.example_rows(rows), dtype=bool).reshape(n)
        drawn = np.zeros(n, dtype=bool)
        where = np.flatnonzero(can)
        drawn[where] = rng.random(where.size) < self.layout_fraction
        fmt = [self.layout if d else PAIR for d in drawn.tolist()]
        a = [_ints(x) for x in rows["a_ids"]]
        b = [_ints(x) if bool(h) else None for x, h in zip(rows["b_ids"], rows["has_next"])]
        if self.subword_alpha > 0:
            self._resample_web(rows, kind, a, b, rng)
        ex = Examples(rows, fmt, a, b, L)
        ex.epoch = epoch
        for o in self.objectives:
            o.load(ex, rows)
        for o in self.objectives:
            o.corrupt(ex, rng)
        batch = self.tensorize(ex)
        for o in self.objectives:
            o.add_labels(batch, ex, rng)
        return {k: torch.from_numpy(v) for k, v in batch.items()}

    def _resample_web(self, rows, kind, a, b, rng: np.random.Generator) -> None:
        """Subword regularization (paper §3.3): new sampled pieces for web chunks, each step."""
        limit = (self.max_len - 3) // 2
        for i, k in enumerate(kind):
            if k != "web":
                continue
            a[i] = _flat(self.tok.encode_words(str(rows["a_text"][i]).split(), alpha=self.subword_alpha,
                                               seed=int(rng.integers(1, 2**31))))[:limit]
            if b[i] is not None:
                b[i] = _flat(self.tok.encode_words(str(rows["b_text"][i]).split(), alpha=self.subword_alpha,
                                                   seed=int(rng.integers(1, 2**31))))[:limit]

    def tensorize(self, ex: Examples) -> dict[str, np.ndarray]:
        """The examples as [B, T] arrays. The per-row work is only list slicing (which tokens fit); the arrays are
        filled in one scatter per array, from flat token and label buffers."""
        cls, sep, L = self.tok.cls_id, self.tok.sep_id, ex.max_len
        B = len(ex.fmt)
        seqs, first = [], np.empty(B, dtype=np.int64)
        # Token-label spans: (row, first position, label array) of the parts of a row that carry labels.
        spans: dict[str, list] = {k: [] for k in ex.a_labels}
        for i, f in enumerate(ex.fmt):
            if f != PAIR:
                lead = (ex.lead[i] or [])[: L - 4]
                room = L - 3 - len(lead)
                chunk = ex.a[i][:room]
                ids = [cls, *lead, sep, *chunk, sep]
                first[i] = len(lead) + 2
                # The chunk's labels hold only for the corpus's own pieces: a chunk cut to whole words (by the
                # objective, to fit its lead) is a prefix of them, a re-segmented one is not.
                if ex.lead_chunk_labels and chunk == ex.a_orig[i][:len(chunk)]:
                    for k, sp in spans.items():
                        sp.append((i, len(lead) + 2, ex.a_labels_orig[k][i][:len(chunk)]))
            else:
                b_ids = ex.b[i] or []
                # When both chunks do not fit (a sequence length shorter than the corpus's), each keeps at least
                # half of the room, so NSP still sees both sides; otherwise nothing is cut.
                a_room = L - 2 if not b_ids else max((L - 3) // 2, L - 3 - len(b_ids))
                a_ids = ex.a[i][:a_room]
                room = max(0, L - 3 - len(a_ids))
                b_ids = b_ids[:room]
                ids = [cls, *a_ids, sep, *b_ids, sep] if b_ids else [cls, *a_ids, sep]
                first[i] = len(a_ids) + 2
                for k, sp in spans.items():
                    sp.append((i, 1, ex.a_labels[k][i][: len(a_ids)]))
                    bl = ex.b_labels[k][i]
                    if b_ids and bl is not None:
                        sp.append((i, len(a_ids) + 2, bl[: len(b_ids)]))
            seqs.append(ids)
        lens = np.fromiter(map(len, seqs), dtype=np.int64, count=B)
        T = L if self.pad_to_max_len else int(lens.max())
        pos = np.arange(T)
        valid = pos < lens[:, None]
        input_ids = np.full((B, T), self.tok.pad_id, dtype=np.int64)
        input_ids[valid] = np.fromiter(chain.from_iterable(seqs), dtype=np.int64, count=int(lens.sum()))
        out = {
            "input_ids": input_ids,
            "segment_ids": ((pos >= first[:, None]) & valid).astype(np.int64),
            "attention_mask": valid,
            "row_format": np.array([f != PAIR for f in ex.fmt], dtype=np.int64),
        }
        for k, sp in spans.items():
            out[k] = _scatter_spans(sp, B, T)
        for k, v in ex.example_labels.items():
            out[k] = np.asarray(v, dtype=np.int64)
        return out


def _ints(x) -> list[int]:
    """A row's token ids as a list of Python ints (an array from Ray Data, a list from pyarrow's `to_pylist`)."""
    return x.tolist() if isinstance(x, np.ndarray) else list(x) if isinstance(x, list) else [int(t) for t in x]


def _scatter_spans(spans: list, B: int, T: int) -> np.ndarray:
    """A [B, T] label array, IGNORE but for the spans (row, start, labels), written in one fancy-index store."""
    out = np.full((B, T), IGNORE, dtype=np.int64)
    if not spans:
        return out
    rows, starts, labs = zip(*spans)
    lengths = np.fromiter(map(len, labs), dtype=np.int64, count=len(labs))
    total = int(lengths.sum())
    if total:
        base = np.asarray(rows, dtype=np.int64) * T + np.asarray(starts, dtype=np.int64)
        offset = np.cumsum(lengths) - lengths
        idx = np.arange(total) + np.repeat(base - offset, lengths)
        out.reshape(-1)[idx] = np.concatenate(labs)
    return out


def _flat(pieces: list[list[int]]) -> list[int]:
    return [t for p in pieces for t in p]
