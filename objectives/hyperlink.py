"""WHP, Wikipedia hyperlink prediction (paper §3.2, Figure 2): tag each word S, E, SE or N.

Labelling rule (made at corpus time, `word_tags`): one tag per word, ids N=0, S=1, E=2, SE=3 (`TAGS`;
the classes of Figure 2's CT task). A word belongs to a link when its span overlaps the link's span (a
link may cover only part of a word: "[[bus]]es", or "Paris," with the comma outside). Of the words a link
covers, the first is S, the last E, and a one-word link's word SE; words strictly inside a multiword link
and words in no link are N. When two links touch the same word the earlier link wins: the later link
keeps only the words no earlier link took, and its S/E/SE are placed on those (so every tag sequence
stays well formed). A link that covers only whitespace tags nothing.

The tag is predicted at the word's first subword; other subwords, specials and chunks from unlinked
sources carry -100 and are not scored. CT reuses this head's shape.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pyarrow as pa
import torch

from alignlab.platform.encoder.model import TokenHead
from alignlab.platform.encoder.registry import (CorpusLabels, Objective, classification_sums, labelled, labelled_count,
                                        register)
from alignlab.platform.runtime.throughput import matmul_flops

TAGS = ("N", "S", "E", "SE")
N, S, E, SE = 0, 1, 2, 3
NUM_TAGS = len(TAGS)


def _link_bounds(link) -> tuple[int, int]:
    if hasattr(link, "start"):
        return int(link.start), int(link.end)
    return int(link[0]), int(link[1])


def word_tags(word_spans, links) -> np.ndarray:
    """One tag id per word (N=0, S=1, E=2, SE=3); see the module docstring for the rule.

    `word_spans`: (start, end) pairs as from `split_words`, sorted; `links`: `Link`s or (start, end[, ...])
    tuples, character offsets into the same text.
    """
    n = len(word_spans)
    tags = np.zeros(n, dtype=np.int8)
    if n == 0 or not links:
        return tags
    spans = np.asarray(word_spans, dtype=np.int64).reshape(n, 2)
    bounds = sorted(_link_bounds(link) for link in links)
    lo = np.asarray([b[0] for b in bounds], dtype=np.int64)
    hi = np.asarray([b[1] for b in bounds], dtype=np.int64)
    # word w overlaps link [lo, hi) iff start_w < hi and end_w > lo
    first = np.searchsorted(spans[:, 1], lo, side="right")  # first word ending after lo
    last = np.searchsorted(spans[:, 0], hi, side="left") - 1  # last word starting before hi
    taken = -1  # highest word index claimed by an earlier link
    for a, b in zip(first.tolist(), last.tolist()):
        a = max(a, taken + 1)  # earlier link wins on shared words
        if a > b:
            continue
        if a == b:
            tags[a] = SE
        else:
            tags[a] = S
            tags[b] = E
        taken = b
    return tags



class HyperlinkLabels(CorpusLabels):
    """Per-token tags of the chunks of linked (Wikipedia) documents; other documents get none (null)."""

    token_columns = ("whp_a", "whp_b")
    stats_columns = ("whp_a",)

    def word_labels(self, doc, word_spans) -> np.ndarray | None:
        return word_tags(word_spans, doc.links) if doc.kind == "wiki" else None

    def count(self, table: pa.Table, acc: Counter) -> None:
        tags = table.column("whp_a").combine_chunks()
        if pa.types.is_list(tags.type):
            w = tags.flatten().to_numpy(zero_copy_only=False)
            acc.update(w[w >= 0].tolist())

    def stats(self, acc: Counter) -> dict:
        return {"whp_tag_counts": {TAGS[k]: v for k, v in sorted(acc.items())}}


@register
@dataclass(frozen=True, kw_only=True, slots=True)
class HyperlinkConfig:
    name: ClassVar[str] = "whp"
    default_set_rank: ClassVar[int] = 2  # the paper's four, in its order (`registry.default_set`)
    weight: float = 1.0

    def __post_init__(self) -> None:
        if self.weight < 0:
            raise ValueError("whp.weight must be >= 0")

    def build(self, tokenizer) -> "Hyperlink":
        return Hyperlink(self, tokenizer)


class Hyperlink(Objective):
    name = "whp"
    corpus_labels = HyperlinkLabels
    corpus_columns = HyperlinkLabels.token_columns
    linked_only = True
    labelled_keys = ("whp",)

    def load(self, ex, rows) -> None:
        ex.add_token_labels("whp", rows["whp_a"], rows["whp_b"])

    @property
    def num_classes(self) -> int:
        return NUM_TAGS

    def build_head(self, model_cfg, encoder) -> torch.nn.Module:
        return TokenHead(model_cfg.hidden, NUM_TAGS, model_cfg.dropout)

    def loss_and_sums(self, head, hidden_BTH, batch):
        pos, target = labelled(batch, "whp")  # padded to a few shapes; padded rows are IGNORE
        h = hidden_BTH.reshape(-1, hidden_BTH.shape[-1]).index_select(0, pos)
        return classification_sums(head(h), target)

    def head_flops(self, model_cfg, batch, *, seq_len):
        return matmul_flops(model_cfg.hidden * NUM_TAGS, labelled_count(batch, "whp"))

    @classmethod
    def expected_head_flops(cls, config, model_cfg, vocab_size, *, seq_len, rows, tokens):
        # At most every token (only linked rows' words are labelled): a d x 4 matrix, ~0.01% of the encoder's work.
        return matmul_flops(model_cfg.hidden * NUM_TAGS, tokens)
