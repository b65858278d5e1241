"""The input path as it was before issue #42 (main at 95c4c1f): the per-row Python collation that
`platform/encoder/batching.py` replaced with array operations over the batch.

Kept verbatim (names aside) as the yardstick of two things: tests/test_input_path.py checks that the new collation
gives exactly these batches for the same rows and step, and benchmarks/throughput/feed_rate.py times both side by side. The
example view `Examples` is shared with the new path: it is unchanged but for a faster conversion of label lists,
which makes the old path here a little faster than it was. Benchmark code, not engine code: it names the objectives whose batch-time verbs changed (NSP's pairing,
MLM's draw).
"""
from __future__ import annotations

import numpy as np
import torch

from alignlab.platform.encoder.batching import IGNORE, Examples, _flat
from alignlab.platform.encoder.registry import lock_inputs

FORMAT_IDS = {"pair": 0, "acronym": 1}  # row_format of the two layouts (the engine's was this until PAD owned its own)


def reference_nsp_corrupt(nsp, ex, rng: np.random.Generator) -> None:
    n = len(ex.a)
    labels = np.full(n, IGNORE, dtype=np.int64)
    pair_rows = [i for i in range(n) if ex.fmt[i] == "pair"]
    for i in pair_rows:
        if ex.b[i] is not None and rng.random() < nsp.config.next_prob:
            labels[i] = 1
            continue
        others = [j for j in range(n) if ex.doc_id[j] != ex.doc_id[i]]
        if not others:
            labels[i] = 1 if ex.b[i] is not None else IGNORE
            continue
        j = others[int(rng.integers(len(others)))]
        ex.b[i] = ex.a_orig[j]
        for key in ex.b_labels:
            ex.b_labels[key][i] = ex.a_labels_orig[key][j]
        labels[i] = 0
    ex.example_labels["nsp"] = labels


def reference_mlm_add_labels(mlm, batch: dict, rng: np.random.Generator) -> None:
    ids = batch["input_ids"]
    B, T = ids.shape
    cand = np.isfinite(mlm.log_weight[ids]) & (batch["row_format"] == 0)[:, None]
    n_pred = np.where(cand.any(1), np.maximum(1, np.rint(mlm.config.mask_prob * cand.sum(1))), 0).astype(int)
    keys = np.where(cand, mlm.log_weight[ids] + rng.gumbel(size=(B, T)), -np.inf)
    order = np.argsort(-keys, axis=1)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(T)[None].repeat(B, 0), axis=1)
    chosen = (rank < n_pred[:, None]) & cand
    pos = np.flatnonzero(chosen)
    labels = ids.reshape(-1)[pos].copy()
    u = rng.random(pos.size)
    flat = ids.reshape(-1)
    to_mask = u < mlm.config.mask_token_prob
    to_rand = (u >= mlm.config.mask_token_prob) & (u < mlm.config.mask_token_prob + mlm.config.random_token_prob)
    flat[pos[to_mask]] = mlm.tokenizer.mask_id
    flat[pos[to_rand]] = rng.choice(mlm.random_ids, size=int(to_rand.sum()))
    lock_inputs(batch, chosen)
    out = np.full((B, T), IGNORE, dtype=np.int64)
    out.reshape(-1)[pos] = labels
    batch["mlm"] = out


class ReferenceCollator:
    def __init__(self, objectives: Sequence, tokenizer, *, max_len: int, layout_fraction: float = 0.25,
                 subword_alpha: float = 0.0, seed: int = 0, rank: int = 0):
        self.objectives, self.tok, self.max_len = list(objectives), tokenizer, max_len
        self.layout_fraction, self.subword_alpha = layout_fraction, subword_alpha
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
        # A row may become an "acronym" example when an objective of that format says it can (PAD: a linked row
        # with a pair); the draw is made only for such rows.
        can = [False] * n
        for o in self.objectives:
            if o.example_format == "acronym":
                can = [c or bool(ok) for c, ok in zip(can, o.example_rows(rows))]
        fmt = []
        for i in range(n):
            fmt.append("acronym" if can[i] and rng.random() < self.layout_fraction else "pair")
        a = [list(map(int, x)) for x in rows["a_ids"]]
        b = [list(map(int, x)) if bool(h) else None for x, h in zip(rows["b_ids"], rows["has_next"])]
        if self.subword_alpha > 0:
            self._resample_web(rows, kind, a, b, rng)
        ex = Examples(rows, fmt, a, b, L)
        ex.epoch = epoch
        for o in self.objectives:
            o.load(ex, rows)
        for o in self.objectives:
            # NSP's pairing as it was: a Python scan of the batch per row.
            reference_nsp_corrupt(o, ex, rng) if o.name == "nsp" else o.corrupt(ex, rng)
        batch = self.tensorize(ex)
        for o in self.objectives:
            reference_mlm_add_labels(o, batch, rng) if o.name == "mlm" else o.add_labels(batch, ex, rng)
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
        cls, sep, L = self.tok.cls_id, self.tok.sep_id, ex.max_len
        seqs, segs, tok_labels = [], [], {k: [] for k in ex.a_labels}
        for i, f in enumerate(ex.fmt):
            if f == "acronym":
                acr = (ex.lead[i] or [])[: L - 4]
                room = L - 3 - len(acr)
                ids = [cls, *acr, sep, *ex.a[i][:room], sep]
                seg = [0] * (len(acr) + 2) + [1] * (len(ids) - len(acr) - 2)
                chunk = ex.a[i][:room]
                # The chunk's labels hold only for the corpus's own pieces: a chunk cut to whole words
                # (PAD's fit_to_length) is a prefix of them, a re-segmented one is not.
                keep = ex.lead_chunk_labels and chunk == ex.a_orig[i][:len(chunk)]
                for k in tok_labels:
                    lab = np.full(len(ids), IGNORE, dtype=np.int64)
                    if keep:
                        lab[len(acr) + 2: len(acr) + 2 + len(chunk)] = ex.a_labels_orig[k][i][:len(chunk)]
                    tok_labels[k].append(lab)
            else:
                b_ids = ex.b[i] or []
                # When both chunks do not fit (a sequence length shorter than the corpus's), each keeps at least
                # half of the room, so NSP still sees both sides; otherwise nothing is cut.
                a_room = L - 2 if not b_ids else max((L - 3) // 2, L - 3 - len(b_ids))
                a_ids = ex.a[i][:a_room]
                room = max(0, L - 3 - len(a_ids))
                b_ids = b_ids[:room]
                ids = [cls, *a_ids, sep] + ([*b_ids, sep] if b_ids else [])
                seg = [0] * (len(a_ids) + 2) + [1] * (len(ids) - len(a_ids) - 2)
                for k in tok_labels:
                    parts = [[IGNORE], ex.a_labels[k][i][: len(a_ids)], [IGNORE]]
                    if b_ids:
                        bl = ex.b_labels[k][i]
                        parts += [bl[: len(b_ids)] if bl is not None else np.full(len(b_ids), IGNORE), [IGNORE]]
                    tok_labels[k].append(np.concatenate([np.asarray(p, dtype=np.int64) for p in parts]))
            seqs.append(ids)
            segs.append(seg)
        T = max(len(s) for s in seqs)
        B = len(seqs)
        out = {
            "input_ids": np.full((B, T), self.tok.pad_id, dtype=np.int64),
            "segment_ids": np.zeros((B, T), dtype=np.int64),
            "attention_mask": np.zeros((B, T), dtype=bool),
            "row_format": np.array([FORMAT_IDS[f] for f in ex.fmt], dtype=np.int64),
        }
        for i, (s, g) in enumerate(zip(seqs, segs)):
            out["input_ids"][i, : len(s)] = s
            out["segment_ids"][i, : len(g)] = g
            out["attention_mask"][i, : len(s)] = True
        for k, rows_lab in tok_labels.items():
            arr = np.full((B, T), IGNORE, dtype=np.int64)
            for i, lab in enumerate(rows_lab):
                arr[i, : len(lab)] = lab
            out[k] = arr
        for k, v in ex.example_labels.items():
            out[k] = np.asarray(v, dtype=np.int64)
        return out
