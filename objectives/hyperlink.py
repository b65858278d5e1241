"""WHP, Wikipedia hyperlink prediction (paper §3.2, Figure 2): tag each word S, E, SE or N.

Labelling rule (made at corpus time by `alignlab.platform.aligned_labels.whp_word_tags`): a word is S
if it starts a link, E if it ends one, SE if it is a whole one-word link, N otherwise (words inside a
multiword link too). The tag is predicted at the word's first subword; other subwords, specials and
chunks from unlinked sources carry -100 and are not scored. CT reuses this head's shape.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from alignlab.platform.model import TokenHead
from alignlab.objectives.registry import Objective, classification_sums, register

NUM_TAGS = 4  # N, S, E, SE


@register
@dataclass(frozen=True, kw_only=True, slots=True)
class HyperlinkConfig:
    name: ClassVar[str] = "whp"
    weight: float = 1.0

    def __post_init__(self) -> None:
        if self.weight < 0:
            raise ValueError("whp.weight must be >= 0")

    def build(self, tokenizer) -> "Hyperlink":
        return Hyperlink(self, tokenizer)


class Hyperlink(Objective):
    name = "whp"
    corpus_columns = ("whp_a", "whp_b")
    linked_only = True
    token_label_key = "whp"

    def load(self, ex, rows) -> None:
        ex.add_token_labels("whp", rows["whp_a"], rows["whp_b"])

    @property
    def num_classes(self) -> int:
        return NUM_TAGS

    def build_head(self, model_cfg, encoder) -> torch.nn.Module:
        return TokenHead(model_cfg.hidden, NUM_TAGS, model_cfg.dropout)

    def loss_and_sums(self, head, hidden_BTH, batch):
        labels = batch["whp"].reshape(-1)
        pos = torch.nonzero(labels != -100).squeeze(1)
        h = hidden_BTH.reshape(-1, hidden_BTH.shape[-1]).index_select(0, pos)
        return classification_sums(head(h), labels.index_select(0, pos))
