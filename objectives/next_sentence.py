"""NSP (BERT; paper §3.3): is segment B the true next chunk of segment A?

Labelling rule, per `pair` example, drawn on the fly: a row whose chunk has a next chunk keeps it
with probability 0.5 (label 1); otherwise (and always for a document's last chunk) B is the first
segment of another row of the batch from a different document (label 0). B's per-token labels
travel with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from alignlab.platform.encoder.batching import IGNORE
from alignlab.platform.encoder.draws import OneByOne
from alignlab.platform.encoder.model import SequenceHead
from alignlab.platform.encoder.registry import Objective, classification_sums, register
from alignlab.platform.runtime.throughput import TwoWayClsHeadFlops


@register
@dataclass(frozen=True, kw_only=True, slots=True)
class NextSentenceConfig:
    name: ClassVar[str] = "nsp"
    default_set_rank: ClassVar[int] = 1  # the paper's four, in its order (`registry.default_set`)
    weight: float = 1.0
    next_prob: float = 0.5

    def __post_init__(self) -> None:
        if not 0 <= self.next_prob <= 1 or self.weight < 0:
            raise ValueError("nsp.next_prob must be in [0, 1] and nsp.weight >= 0")

    def build(self, tokenizer) -> "NextSentence":
        return NextSentence(self, tokenizer)


class NextSentence(TwoWayClsHeadFlops, Objective):
    name = "nsp"
    bert_pooler = True  # BERT's pooler is trained by NSP; export writes this head's `pool` as BertModel's pooler

    def corrupt(self, ex, rng: np.random.Generator) -> None:
        n = len(ex.a)
        # Draws one row at a time, in row order (a partner's draw depends on the coin before it), so that the
        # stream of randomness keyed by (seed, step) gives every batch its pairs. The partner is the k-th row of
        # another document, found from the (few, ascending) rows of the row's own document, not a scan of the batch.
        rows_of: dict[str, list[int]] = {}
        for i, d in enumerate(ex.doc_id):
            rows_of.setdefault(d, []).append(i)
        one_by_one = OneByOne.of(rng)  # the same draws as rng.random() and rng.integers(m), made cheaply
        random, integers = (one_by_one.random, one_by_one.integers) if one_by_one else (rng.random, rng.integers)
        next_prob = self.config.next_prob
        b, doc_id, a_orig = ex.b, ex.doc_id, ex.a_orig
        label_lists = [(ex.b_labels[key], ex.a_labels_orig[key]) for key in ex.b_labels]
        out = [IGNORE] * n
        for i, f in enumerate(ex.fmt):
            if f != "pair":
                continue
            if b[i] is not None and random() < next_prob:
                out[i] = 1
                continue
            mine = rows_of[doc_id[i]]
            if len(mine) == n:
                out[i] = 1 if b[i] is not None else IGNORE
                continue
            j = int(integers(n - len(mine)))
            for t in mine:
                if t > j:
                    break
                j += 1
            b[i] = a_orig[j]
            for b_labels, a_labels in label_lists:
                b_labels[i] = a_labels[j]
            out[i] = 0
        if one_by_one:
            one_by_one.close()
        ex.example_labels["nsp"] = np.array(out, dtype=np.int64)

    @property
    def num_classes(self) -> int:
        return 2

    def build_head(self, model_cfg, encoder) -> torch.nn.Module:
        return SequenceHead(model_cfg.hidden, 2, model_cfg.dropout)

    def loss_and_sums(self, head, hidden_BTH, batch):
        return classification_sums(head(hidden_BTH[:, 0]), batch["nsp"])

