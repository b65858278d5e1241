"""Word embeddings that start from the corpus's co-occurrence statistics (`PretrainConfig.corpus_embeddings`).

Why: a compute-starved encoder (the mini preset: ~3,000 steps of 32 rows) spends much of its budget learning which
pieces occur near which, before it can predict a masked piece from its neighbours. Counting that takes seconds:
positive pointwise mutual information of the pieces within `WINDOW` of each other (Levy & Goldberg 2014; context
counts smoothed to the power 0.75, Levy, Goldberg & Dagan 2015), factorised by a truncated SVD into `hidden`
dimensions (U * sqrt(S)). The encoder's word embeddings start there, scaled to the configured per-entry standard
deviation; every other weight starts as before. Only the training split is counted, never the held-out rows or a
task's data. The decoder of MLM is tied to these embeddings, so it starts from them too (why, and what it
changed: docs/journal/round-14.md).

The table is made once per model by the driver, written atomically next to the model (`WORD_EMBEDDINGS`), and read
by every Train worker before its first step; a resumed run loads its checkpoint's weights instead.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

# The corpus module (pyarrow) is imported inside `for_corpus`, the benchmarks' entry: the driver and
# the workers call the rest without it.

WINDOW = 2
"""Pieces at most this far apart count as co-occurring (a symmetric window). Part of the method, so changing it
must change `corpus_embeddings`'s meaning: it is fixed here, not a config field."""
MAX_TOKENS = 20_000_000
"""Pieces counted at most (the first of the training stream): statistics saturate long before a paper-size corpus
ends, and the count matrix stays sparse and small."""
WORD_EMBEDDINGS = "word_embeddings.npy"
TOKEN_COLUMNS = ("a_ids", "b_ids")


def cooccurrence(seqs: Iterable[np.ndarray], vocab_size: int, window: int = WINDOW, max_tokens: int = MAX_TOKENS):
    """Symmetric counts of piece pairs at most `window` apart within each sequence, as a scipy CSR matrix."""
    import scipy.sparse as sp

    parts, n = [], 0
    for s in seqs:
        if n >= max_tokens:
            break
        s = np.asarray(s, dtype=np.int64)[: max_tokens - n]
        parts.append(s)
        parts.append(np.full(window, -1, dtype=np.int64))  # a sequence boundary as wide as the window: no pair spans it
        n += len(s)
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    if flat.size and (flat.max() >= vocab_size or flat.min() < -1):
        raise ValueError(f"token ids outside the vocabulary of {vocab_size} pieces (min {flat.min()}, max {flat.max()})")
    rows, cols = [], []
    for d in range(1, window + 1):
        a, b = flat[:-d], flat[d:]
        ok = (a >= 0) & (b >= 0)
        rows.append(a[ok])
        cols.append(b[ok])
    r, c = np.concatenate(rows), np.concatenate(cols)
    m = sp.coo_matrix((np.ones(len(r), dtype=np.float64), (r, c)), shape=(vocab_size, vocab_size)).tocsr()
    return (m + m.T).tocsr()


def ppmi_svd(counts, dim: int, *, seed: int = 0, smoothing: float = 0.75) -> np.ndarray:
    """[vocab, dim] float32: U * sqrt(S) of the truncated SVD of the counts' positive PMI."""
    import torch

    m = counts.tocoo()
    row = np.asarray(counts.sum(axis=1)).ravel()
    ctx = np.asarray(counts.sum(axis=0)).ravel() ** smoothing
    pmi = np.log(m.data * ctx.sum() / (row[m.row] * ctx[m.col]))
    keep = pmi > 0
    values = torch.from_numpy(pmi[keep])
    index = torch.from_numpy(np.stack([m.row[keep], m.col[keep]]).astype(np.int64))
    ppmi = torch.sparse_coo_tensor(index, values, counts.shape, check_invariants=True).coalesce()
    q = min(dim, min(counts.shape) - 1)
    # One model id must mean one table: in float64 on one thread (a thread count changes the order of the sums, and
    # near-equal singular values turn rounding into other vectors), and each vector's sign fixed (an SVD's is free).
    threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch.set_num_threads(1)
        try:
            u, s, _ = torch.svd_lowrank(ppmi, q=q, niter=4)
        finally:
            torch.set_num_threads(threads)
    u = u * torch.sign(u.gather(0, u.abs().argmax(dim=0, keepdim=True)))
    out = np.zeros((counts.shape[0], dim), dtype=np.float32)
    out[:, :q] = (u * s.sqrt()).numpy().astype(np.float32)
    return out


def word_embeddings(seqs: Iterable[np.ndarray], vocab_size: int, dim: int, std: float, *, seed: int = 0) -> np.ndarray:
    """The table a model's word embeddings start from: PPMI-SVD of `seqs`, scaled to a per-entry std of `std`.
    Pieces the corpus never shows near another (specials, unused pieces) get BERT's random rows, N(0, 0.02)."""
    counts = cooccurrence(seqs, vocab_size)
    table = ppmi_svd(counts, dim, seed=seed)
    counted = np.asarray(counts.sum(axis=1)).ravel() > 0
    if not counted.any():
        raise ValueError("no piece pairs to count: the training split has no sequence of two or more pieces")
    table *= std / float(table[counted].std())
    rng = np.random.default_rng(seed)
    table[~counted] = rng.normal(0.0, 0.02, size=(int((~counted).sum()), dim)).astype(np.float32)
    return table


def training_sequences(shard_paths: Iterable[str], filesystem=None,
                       vocab_size: int | None = None) -> Iterable[np.ndarray]:
    """The token ids of every chunk of the training shards, in the manifest's order. With `vocab_size`, a chunk
    with an id outside the vocabulary (a shard from another tokenizer, a damaged file) is refused, naming the
    shard, its row and column."""
    for path in shard_paths:
        table = pq.read_table(path, columns=list(TOKEN_COLUMNS), filesystem=filesystem)
        for name in TOKEN_COLUMNS:
            for row, ids in enumerate(table.column(name).to_numpy(zero_copy_only=False)):
                if not len(ids):
                    continue
                if vocab_size is not None and (ids.min() < 0 or ids.max() >= vocab_size):
                    bad = ids[(ids < 0) | (ids >= vocab_size)][0]
                    raise ValueError(f"{path}: row {row}, column {name!r}: token id {int(bad)} is outside the "
                                     f"vocabulary of {vocab_size} pieces (was the shard made with another tokenizer?)")
                yield ids


def save(path: Path, table: np.ndarray) -> None:
    """Written to a temporary name and renamed: a worker never reads half a table."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npy")
    np.save(tmp, table)
    tmp.replace(path)


def for_corpus(cdir: Path, cfg, vocab_size: int) -> np.ndarray | None:
    """The table a `Pretrainer` for `cfg` starts from on the finished corpus in `cdir` (its training shards in the
    manifest's order, as `alignlab pretrain` counts them), or None when `cfg.corpus_embeddings` is off. For
    scripts that train without the engine (benchmarks/)."""
    if not cfg.corpus_embeddings:
        return None
    from alignlab.platform.corpus.corpus import load_manifest, shard_names

    paths = [str(Path(cdir) / "shards" / name) for name in shard_names(cdir, load_manifest(Path(cdir)), "train")]
    return word_embeddings(training_sequences(paths, vocab_size=vocab_size), vocab_size, cfg.model.hidden,
                           cfg.corpus_embeddings, seed=cfg.seed)
