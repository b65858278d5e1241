"""Length bucketing: examples of similar length trained together, so that a batch is mostly real tokens.

A batch is as wide as its longest example; a corpus of short summaries and long articles padded that way wastes
about half of every batch at 128 tokens. Sorting rows before collation is not enough: an example's length is
only known once it is made (NSP replaces half of the next chunks by another row's chunk; PAD puts an acronym in
front of a chunk). So `bucketed` reads a window of `window` row batches, collates them as one batch (one draw of
the objectives' randomness, keyed by the window's first step), orders the examples by their real length (stable,
so ties keep stream order), cuts them into batches of the stream's own sizes, trims each to its longest example,
and hands them out in an order drawn from `key` (so that the model does not see a window's batches shortest
first). Every row is still trained exactly once per pass, in batches of the same sizes; which rows share a batch
changes, and an NSP partner may come from anywhere in the window.

Under `torch.compile` (`PretrainConfig.compile`) a batch is cut to a static width instead (`static_width`: the
smallest of a few fixed widths that holds its longest example), so that the step meets a handful of shapes; the
rows, their order and their labels are those of the trimmed batches.

A window is collated with its first step's settings (sequence length, curriculum): a schedule switch takes effect
at the first window that starts on or after it, up to `window - 1` steps late.

Exact resume: a pass's windows start at fixed positions (every `window` row batches from the start of the pass),
and the batch handed out j-th in window w has data position w * window + j + 1. A run resumed at position p
re-reads window p // window, collates and sorts it the same way, and skips its first p % window batches.
`window` 1 is the stream as it comes, each batch collated at its own step. No Ray here.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future

import numpy as np
import torch

from alignlab.platform.encoder.batching import Ragged, rows_from_arrow

Collate = Callable[[dict, int, int], tuple[dict[str, torch.Tensor], list[str]]]
"""collate(rows, offset, batches) -> (batch, row ids): the rows of `batches` row batches collated at the step
`offset` steps after the one the caller resumed at (negative for the first window of a resume inside it)."""


def _concat(batches: Sequence[dict]) -> dict:
    out = {}
    for c in batches[0]:
        cols = [b[c] for b in batches]
        if all(isinstance(x, Ragged) for x in cols):
            out[c] = Ragged.concat(cols)
        elif all(isinstance(x, np.ndarray) for x in cols):
            out[c] = np.concatenate(cols)
        else:  # a list column (rows built by hand): kept a list
            out[c] = [v for x in cols for v in x]
    return out


Window = tuple[list[dict], int, int, int]
"""(row batches, window index, batches of it to skip, offset): one window to collate and cut (`window_batches`)."""


def bucketed(row_batches: Iterator[dict], window: int, *, skip: int, key: Sequence[int], collate: Collate,
             width: str = "longest", counted: list[int] | None = None,
             elsewhere: tuple[Callable[[Window], Future], int] | None = None) -> Iterator[tuple[int, dict, list[str]]]:
    """(data position, batch, row ids) in bucketed order, from the data position after `skip`.
    `key`: each window's batch order is drawn from (*key, window index): pass (seed, phase, epoch) so that every
    pass has its own order and a resumed run the same one. `width`: how wide each batch is cut (`WIDTHS`).
    `counted[0]`, if given, counts the row batches read from the
    stream (skipped ones included).
    `elsewhere` = (submit, ahead): each window is handed to `submit`, which returns a future of the window's
    `window_batches` made elsewhere (collating processes), with up to `ahead` windows in flight; the batches and
    their order are the same."""
    windows = _windows(row_batches, window, skip, counted if counted is not None else [0])
    if elsewhere is None:
        for batches, w, skip_w, offset in windows:
            yield from window_batches(batches, w, window, skip_w, offset, key, collate, width)
        return
    submit, ahead = elsewhere
    pending: deque[Future] = deque()
    try:
        for job in windows:
            pending.append(submit(job))
            while len(pending) > max(0, ahead - 1):
                yield from pending.popleft().result()
        while pending:
            yield from pending.popleft().result()
    finally:
        for f in pending:
            f.cancel()


def _windows(row_batches: Iterator[dict], window: int, skip: int, counted: list[int]) -> Iterator[Window]:
    """The windows to collate from the data position after `skip` on."""
    if window < 1:
        raise ValueError(f"bucket window must be >= 1 row batch, got {window}")
    first_window, skip_in_window = divmod(skip, window)
    w = 0
    while True:
        batches = []
        for _ in range(window):
            try:
                batches.append(next(row_batches))
            except StopIteration:
                break
            counted[0] += 1
        if not batches:
            return
        if w >= first_window:
            yield batches, w, skip_in_window if w == first_window else 0, w * window - skip
        if len(batches) < window:
            return
        w += 1


def window_batches(batches: list[dict], w: int, window: int, skip: int, offset: int, key: Sequence[int],
                   collate: Collate, width: str) -> Iterator[tuple[int, dict, list[str]]]:
    """The batches of window `w` (its first `skip` left out), each with its data position and row ids. Row batches
    may come as Arrow tables (the driver's; they travel to a collating process cheaply) or as dicts of columns."""
    if width not in WIDTHS:
        raise ValueError(f"batch width must be one of {', '.join(WIDTHS)}, got {width!r}")
    batches = [b if isinstance(b, dict) else rows_from_arrow(b) for b in batches]
    if window == 1:
        if not skip:
            batch, ids = collate(batches[0], offset, 1)
            if width == "static":
                batch = _cut(batch, static_width(int(batch["attention_mask"].sum(1).max()),
                                                 batch["attention_mask"].shape[1]))
            yield w + 1, batch, ids
        return
    batch, ids = collate(_concat(batches), offset, len(batches))
    for k, v in batch.items():
        if len(v) != len(ids):
            raise ValueError(f"batch tensor {k!r} has {len(v)} rows, not the window's {len(ids)}: length bucketing "
                             "cuts a window into batches by row (keep labels per row, [B] or [B, T])")
    mask = batch["attention_mask"]
    T = mask.shape[1]
    real = mask.sum(1).numpy()
    order = np.argsort(real, kind="stable")
    bounds = np.cumsum([0, *(len(b["a_ids"]) for b in batches)])
    handed = np.random.default_rng([*map(int, key), w]).permutation(len(batches))
    for j, i in enumerate(handed.tolist()):
        if j < skip:
            continue
        rows = order[bounds[i]:bounds[i + 1]]
        longest = int(real[rows].max())
        cut = {"longest": longest, "window": T, "static": static_width(longest, T)}[width]
        yield w * window + j + 1, _cut(batch, cut, torch.from_numpy(rows)), [ids[t] for t in rows.tolist()]


WIDTHS = ("longest", "window", "static")
"""How wide a batch is cut: to its longest example (the default: least padding), to its window's width, or to a
`static_width` (static shapes for `torch.compile`)."""

STATIC_WIDTHS_PER_LENGTH = 4
"""`static_width` picks among this many widths per sequence length: a quarter, a half, three quarters, all of it."""


def static_width(longest: int, full: int) -> int:
    """The smallest multiple of `full / STATIC_WIDTHS_PER_LENGTH` (rounded up) that holds `longest` tokens, at most
    `full`: 32, 64, 96 or 128 at length 128. A compiled step then meets one shape per width (and length), where
    trimming to the longest example gives it one per length a batch happens to have; the cost is the padding up to
    the next width (about an eighth of a batch on average, less where most rows are full)."""
    step = -(-full // STATIC_WIDTHS_PER_LENGTH)
    return min(full, -(-longest // step) * step)


def _cut(batch: dict, width: int, rows: torch.Tensor | None = None) -> dict:
    """`batch`'s token-level tensors ([B, T]) cut to `width` positions, and every tensor to `rows` (all when None)."""
    T = batch["attention_mask"].shape[1]
    out = {}
    for k, v in batch.items():
        if v.dim() >= 2 and v.shape[1] == T:  # token-level; example-level ones are [B]
            v = v[:, :width]
        out[k] = v if rows is None else v.index_select(0, rows)
    return out
