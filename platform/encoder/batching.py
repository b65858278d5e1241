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


class Ragged(Sequence):
    """A list column of a batch of rows, as Arrow holds it: one flat array of values and the offsets of the rows
    (row i is `values[offsets[i]:offsets[i + 1]]`; None where `valid` is False). Indexing gives a row as a numpy
    view, as Ray Data's numpy batches do, so objectives read it like any column; the collation reads the flat
    arrays whole instead of making one array per row (`rows_from_arrow`)."""

    __slots__ = ("values", "offsets", "valid")

    def __init__(self, values: np.ndarray, offsets: np.ndarray, valid: np.ndarray | None = None):
        self.values, self.offsets, self.valid = values, np.asarray(offsets, dtype=np.int64), valid

    @classmethod
    def from_arrow(cls, arr) -> "Ragged":
        """A pyarrow ListArray (sliced or not: its offsets index its values, which ignore the slice)."""
        valid = None if arr.null_count == 0 else arr.is_valid().to_numpy(zero_copy_only=False)
        return cls(arr.values.to_numpy(zero_copy_only=False), arr.offsets.to_numpy(), valid)

    @classmethod
    def concat(cls, parts: Sequence["Ragged"]) -> "Ragged":
        values = [p.values[p.offsets[0]:p.offsets[-1]] for p in parts]
        offsets = [np.zeros(1, dtype=np.int64)]
        end = 0
        for p in parts:
            offsets.append(p.offsets[1:] - p.offsets[0] + end)
            end += int(p.offsets[-1] - p.offsets[0])
        valid = None
        if any(p.valid is not None for p in parts):
            valid = np.concatenate([np.ones(len(p), dtype=bool) if p.valid is None else p.valid for p in parts])
        return cls(np.concatenate(values), np.concatenate(offsets), valid)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                raise IndexError("a Ragged column slices with step 1 only")
            valid = None if self.valid is None else self.valid[start:stop]
            return Ragged(self.values, self.offsets[start:max(start, stop) + 1], valid)
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"row {i} of a column of {n}")
        i %= n
        if self.valid is not None and not self.valid[i]:
            return None
        return self.values[self.offsets[i]:self.offsets[i + 1]]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """What `np.asarray` of the column gives: an object array of the rows, as in Ray Data's numpy batches."""
        out = np.empty(len(self), dtype=object)
        for i in range(len(self)):
            out[i] = self[i]
        return out if dtype is None else out.astype(dtype)

    def lengths(self) -> np.ndarray:
        """Each row's length (0 for a null row)."""
        n = np.diff(self.offsets)
        return n if self.valid is None else np.where(self.valid, n, 0)


def rows_from_arrow(table) -> dict:
    """A pyarrow Table or RecordBatch as the dict-of-columns rows `Collator` takes: list columns as `Ragged`, the
    others as numpy arrays (strings as object arrays). Cheaper than Ray Data's numpy format, which makes one array
    per row of every list column."""
    import pyarrow as pa

    out = {}
    for name in table.schema.names:
        col = table.column(name)
        if isinstance(col, pa.ChunkedArray):
            col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            out[name] = Ragged.from_arrow(col)
        else:
            out[name] = col.to_numpy(zero_copy_only=False)
    return out


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
        self.reads: tuple[_Read | None, _Read | None] = (None, None)
        """The `a_ids` and `b_ids` columns the chunk lists were made from, when they came as `Ragged` columns."""

    def add_token_labels(self, key: str, a_col: Sequence, b_col: Sequence) -> None:
        """Token labels of the chunks from two list columns of the rows, IGNORE where a row's labels are absent or do
        not match its tokens (re-sampled by subword regularization)."""
        a_lab = _label_rows(a_col, self.a)
        b_lab = _label_rows(b_col, self.b)
        self.a_labels[key], self.b_labels[key], self.a_labels_orig[key] = a_lab, b_lab, list(a_lab)


def _label_rows(col: Sequence, tokens: list) -> list[np.ndarray | None]:
    """Per row, `col`'s labels as int64 (`_labels_or_ignore`); None where the row has no tokens list."""
    if not isinstance(col, Ragged):
        return [None if t is None else _labels_or_ignore(c, len(t)) for c, t in zip(col, tokens)]
    flat = col.values.astype(np.int64)
    o = col.offsets.tolist()
    want = _lengths(tokens)
    use = col.lengths() == want
    if col.valid is not None:
        use &= col.valid
    # Rows without usable labels get IGNORE from one buffer, each its own slice (no row shares another's labels).
    ignore = np.full(int(want[~use].sum()), IGNORE, dtype=np.int64)
    at = 0
    out: list[np.ndarray | None] = []
    for i, (t, u, n) in enumerate(zip(tokens, use.tolist(), want.tolist())):
        if t is None:
            out.append(None)
        elif u:
            out.append(flat[o[i]:o[i + 1]])
        else:
            out.append(ignore[at:at + n])
            at += n
    return out


def _labels_or_ignore(col, n: int) -> np.ndarray:
    if col is None or len(col) != n:  # absent, or tokens re-sampled by subword regularization
        return np.full(n, IGNORE, dtype=np.int64)
    return col.astype(np.int64) if isinstance(col, np.ndarray) else np.fromiter(col, dtype=np.int64, count=n)


def widen(batch: dict[str, np.ndarray], width: int, pad_id: int) -> dict[str, np.ndarray]:
    """A collated batch's token-level ([B, T]) arrays padded on the right to `width` positions: `input_ids` with the
    padding piece, `segment_ids` 0, booleans (the attention mask, locked inputs) False, floats 0, and any other
    integer array -- an objective's labels -- IGNORE (the convention every token-level label array keeps at
    padding). Example-level ([B]) arrays are unchanged."""
    T = batch["input_ids"].shape[1]
    if T >= width:
        return batch
    out = {}
    for k, v in batch.items():
        if v.ndim == 2 and v.shape[1] == T:
            fill = pad_id if k == "input_ids" else 0 if k == "segment_ids" or v.dtype.kind in "bf" else IGNORE
            wide = np.full((v.shape[0], width), fill, dtype=v.dtype)
            wide[:, :T] = v
            v = wide
        out[k] = v
    return out


class Collator:
    def __init__(self, objectives: Sequence, tokenizer, *, max_len: int, layout_fraction: float = 0.25,
                 subword_alpha: float = 0.0, seed: int = 0, rank: int = 0, pad_to_max_len: bool = False):
        """`pad_to_max_len`: every batch is widened to the step's full length after its labels are drawn at its own
        width (`widen`), so that it holds exactly the batch collated without it, plus padding: room for the static
        widths of `torch.compile` (`PretrainConfig.compile`, `bucketing.static_width`)."""
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
        a, a_read = _read(rows["a_ids"])
        b, b_read = _read(rows["b_ids"])
        b = [x if h else None for x, h in zip(b, np.asarray(rows["has_next"], dtype=bool).tolist())]
        if self.subword_alpha > 0:
            self._resample_web(rows, kind, a, b, rng)
        ex = Examples(rows, fmt, a, b, L)
        ex.reads = (a_read, b_read)
        ex.epoch = epoch
        for o in self.objectives:
            o.load(ex, rows)
        for o in self.objectives:
            o.corrupt(ex, rng)
        batch = self.tensorize(ex)
        for o in self.objectives:
            o.add_labels(batch, ex, rng)
        if self.pad_to_max_len:
            batch = widen(batch, L, self.tok.pad_id)
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
        """The examples as [B, T] arrays, made with array operations over the batch. An example is five segments,
        `[CLS] first [SEP] second [SEP]`: a pair row's first is its chunk and its second the next (or another
        row's) chunk, the last [SEP] only when there is a second; a row of an objective's own layout has the lead
        first and the chunk second. Which tokens fit is worked out from the lengths alone; the tokens and labels are
        then gathered from one flat buffer of every row's lists."""
        cls, sep, L = self.tok.cls_id, self.tok.sep_id, ex.max_len
        if L < 5:
            raise ValueError(f"an example needs at least 5 positions ([CLS] x [SEP] y [SEP]), got max_len {L}")
        B = len(ex.fmt)
        own = np.fromiter((f != PAIR for f in ex.fmt), dtype=bool, count=B)
        la, lb, ll = _lengths(ex.a), _lengths(ex.b), _lengths(ex.lead)
        # Rows of an objective's own layout: the lead keeps at most L - 4 tokens, the chunk what is left.
        lead_n = np.minimum(ll, L - 4)
        chunk_n = np.minimum(la, L - 3 - lead_n)
        # Pair rows: when both chunks do not fit (a sequence length shorter than the corpus's), each keeps at least
        # half of the room, so NSP still sees both sides; otherwise nothing is cut.
        a_n = np.minimum(la, np.where(lb == 0, L - 2, np.maximum((L - 3) // 2, L - 3 - lb)))
        b_n = np.minimum(lb, np.maximum(0, L - 3 - a_n))
        first_n = np.where(own, lead_n, a_n)
        second_n = np.where(own, chunk_n, b_n)
        last_sep = (own | (b_n > 0)).astype(np.int64)
        # Each segment is gathered from a flat buffer: where its row's list starts there, and how many it keeps.
        zero, one = np.zeros(B, dtype=np.int64), np.ones(B, dtype=np.int64)
        seg_n = np.stack([one, first_n, one, second_n, last_sep], 1).reshape(-1)

        def gather(a_at, b_at, lead_at) -> np.ndarray:
            seg_at = np.stack([zero, np.where(own, lead_at, a_at), one, np.where(own, a_at, b_at), one], 1).reshape(-1)
            return np.repeat(seg_at - _starts(seg_n), seg_n) + np.arange(int(seg_n.sum()))

        tokens, a_at, b_at, lead_at = _token_buffer(ex, cls, sep)
        lens = 2 + first_n + second_n + last_sep
        T = int(lens.max())  # the objectives draw their labels at this width, padded to the full length or not
        pos = np.arange(T)
        valid = pos < lens[:, None]
        input_ids = np.full((B, T), self.tok.pad_id, dtype=np.int64)
        input_ids[valid] = tokens[gather(a_at, b_at, lead_at)]
        first = first_n + 2
        out = {
            "input_ids": input_ids,
            "segment_ids": ((pos >= first[:, None]) & valid).astype(np.int64),
            "attention_mask": valid,
            "row_format": own.astype(np.int64),
        }
        if ex.a_labels:
            # A chunk in the objective's own layout keeps its labels only when the objective says so and it is a
            # prefix of the corpus's own pieces (a chunk cut to whole words to fit the lead is; a re-segmented one
            # is not); the labels are then the corpus's.
            chunk_labelled = np.zeros(B, dtype=bool)
            if ex.lead_chunk_labels:
                for i in np.flatnonzero(own).tolist():
                    chunk = ex.a[i][:int(chunk_n[i])]
                    chunk_labelled[i] = chunk == ex.a_orig[i][:len(chunk)]
            # Label buffers hold every row's chunk, next chunk and lead back to back (labels are arrays: joining
            # them is cheap), the lead all IGNORE.
            # Every position of the batch reads one element of a key's buffer: its label, or (padding) the
            # buffer's first, IGNORE. One gather per key, no fill and masked store.
            src = np.zeros(B * T, dtype=np.int64)
            src[valid.reshape(-1)] = gather(2 + _starts(la), 2 + int(la.sum()) + _starts(lb),
                                            2 + int(la.sum() + lb.sum()) + _starts(ll))
            ignore = np.full(2, IGNORE, dtype=np.int64)
            lead_ignore = np.full(int(ll.sum()), IGNORE, dtype=np.int64)
            own_rows = own.tolist()
            for k in ex.a_labels:
                cur, orig = ex.a_labels[k], ex.a_labels_orig[k]
                a_labels = [(orig[i] if chunk_labelled[i] else None) if own_rows[i] else cur[i] for i in range(B)]
                labels = np.concatenate([ignore, _flat_labels(a_labels, la), _flat_labels(ex.b_labels[k], lb),
                                         lead_ignore])
                out[k] = labels[src].reshape(B, T)
        for k, v in ex.example_labels.items():
            out[k] = np.asarray(v, dtype=np.int64)
        return out


class _Read:
    """A `Ragged` column as its rows' lists were made from it: the values as one int64 array, and the same values as
    one Python list with each row's bounds. A list that an objective left as it was (compared by value, so that an
    edit in place counts as an edit) is then taken from the array instead of being flattened again."""

    __slots__ = ("values", "flat", "bounds")

    def __init__(self, col: Ragged):
        o = col.offsets
        self.values = col.values[o[0]:o[-1]].astype(np.int64)
        self.flat = self.values.tolist()
        self.bounds = (o - o[0]).tolist()

    def unedited(self, i: int, x) -> bool:
        return type(x) is list and x == self.flat[self.bounds[i]:self.bounds[i + 1]]


def _read(col) -> tuple[list, _Read | None]:
    """A list column's rows as lists of Python ints (None for a null row), and the column read (`_Read`): for a
    `Ragged` column, one `tolist` of its values, then slices."""
    if not isinstance(col, Ragged):
        return [None if x is None else _ints(x) for x in col], None
    if not len(col):
        return [], None
    r = _Read(col)
    lists = list(map(r.flat.__getitem__, map(slice, r.bounds[:-1], r.bounds[1:])))
    if col.valid is not None:
        lists = [x if v else None for x, v in zip(lists, col.valid.tolist())]
    return lists, r


def _token_buffer(ex: Examples, cls: int, sep: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One flat buffer with every token the examples may take, and where each row's chunk, next chunk and lead start
    in it: [CLS] and [SEP], then the values of the columns the chunks were read from (`Examples.reads`), then the
    lists objectives changed (or all lists, for rows that did not come as `Ragged` columns), back to back. A next
    chunk that NSP took from another row's chunk is found there by the identity of its list."""
    a_read, b_read = ex.reads
    parts, size = [np.array([cls, sep], dtype=np.int64)], 2
    a_base = b_base = 0
    if a_read is not None:
        a_base, size = size, size + len(a_read.values)
        parts.append(a_read.values)
    if b_read is not None:
        b_base, size = size, size + len(b_read.values)
        parts.append(b_read.values)
    changed: list[list[int]] = []
    n_changed = 0

    def place(x) -> int:
        nonlocal n_changed
        changed.append(x)
        n_changed += len(x)
        return size + n_changed - len(x)

    if a_read is not None:
        flat, at = a_read.flat, a_read.bounds
        a_at = [a_base + s if type(x) is list and x == flat[s:e] else place(x)
                for x, s, e in zip(ex.a, at, at[1:])]
        first_of = {id(x): j for j, x in enumerate(ex.a_orig)}
    else:
        a_at = [place(x) for x in ex.a]
        first_of = {}
    b_at = []
    for i, x in enumerate(ex.b):
        if not x:
            b_at.append(0)
        elif b_read is not None and b_read.unedited(i, x):
            b_at.append(b_base + b_read.bounds[i])
        elif (j := first_of.get(id(x))) is not None and a_read.unedited(j, x):
            b_at.append(a_base + a_read.bounds[j])
        else:
            b_at.append(place(x))
    lead_at = [place(x) if x else 0 for x in ex.lead]
    parts.append(np.fromiter(chain.from_iterable(changed), dtype=np.int64, count=n_changed))
    as_array = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    return np.concatenate(parts), as_array(a_at), as_array(b_at), as_array(lead_at)


def _lengths(lists: list) -> np.ndarray:
    """len() of each list, 0 for None."""
    try:
        return np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    except TypeError:  # a None among them
        return np.array([0 if x is None else len(x) for x in lists], dtype=np.int64)


def _starts(n: np.ndarray) -> np.ndarray:
    """Where each of consecutive runs of lengths `n` starts."""
    return np.cumsum(n) - n


def _flat_labels(arrays: list, n: np.ndarray) -> np.ndarray:
    """Label arrays back to back, each made exactly `n[i]` long: cut, or padded with IGNORE; None is all IGNORE."""
    arrays = list(arrays)
    have = np.fromiter((-1 if x is None else len(x) for x in arrays), dtype=np.int64, count=len(arrays))
    ignore = np.full(int(n.max(initial=0)), IGNORE, dtype=np.int64)  # only read: joined into a new array below
    for i in np.flatnonzero(have != n).tolist():
        x = arrays[i]
        if x is None:
            arrays[i] = ignore[:n[i]]
            continue
        fixed = np.full(int(n[i]), IGNORE, dtype=np.int64)
        kept = min(len(x), int(n[i]))
        fixed[:kept] = np.asarray(x[:kept], dtype=np.int64)
        arrays[i] = fixed
    if not arrays:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(arrays).astype(np.int64, copy=False)


def _ints(x) -> list[int]:
    """A row's token ids as a list of Python ints (an array from Ray Data, a list from pyarrow's `to_pylist`)."""
    return x.tolist() if isinstance(x, np.ndarray) else list(x) if isinstance(x, list) else [int(t) for t in x]


def _flat(pieces: list[list[int]]) -> list[int]:
    return [t for p in pieces for t in p]
