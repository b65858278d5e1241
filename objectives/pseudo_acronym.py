"""PAD, pseudo-acronym detection (paper §3.2): does this acronym match initials of a span of the chunk?

Labelling rule (pairs made at corpus time by `alignlab.platform.aligned_labels.make_pad_pairs`):
positive = initials of a random contiguous 2-6-word span of the chunk; negative, with equal
probability, one to all letters of a positive mutated (replacement letters drawn from the corpus's
word-initial letter distribution) or the positive of another random chunk; never an accidental
match. Input: `[CLS] acronym [SEP] chunk [SEP]`, scored from [CLS]; AD reuses this head's shape.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from alignlab.platform.model import SequenceHead
from alignlab.objectives.registry import Objective, classification_sums, register


@register
@dataclass(frozen=True, kw_only=True, slots=True)
class PseudoAcronymConfig:
    name: ClassVar[str] = "pad"
    weight: float = 1.0
    acronym_form: str = "letters"
    """"letters": one token per letter; "text": sentencepiece pieces of the acronym."""

    def __post_init__(self) -> None:
        if self.weight < 0:
            raise ValueError("pad.weight must be >= 0")
        if self.acronym_form not in ("letters", "text"):
            raise ValueError(f"pad.acronym_form must be 'letters' or 'text', got {self.acronym_form!r}")

    def build(self, tokenizer) -> "PseudoAcronym":
        return PseudoAcronym(self, tokenizer)


class PseudoAcronym(Objective):
    name = "pad"
    example_format = "acronym"
    corpus_columns = ("pad_acronym", "pad_label")
    linked_only = True

    def load(self, ex, rows) -> None:
        labels = np.full(len(ex.a), -100, dtype=np.int64)
        for i, f in enumerate(ex.fmt):
            if f == "acronym":
                ex.acronym[i] = self.tokenizer.encode_acronym(str(rows["pad_acronym"][i]), self.config.acronym_form)
                labels[i] = int(rows["pad_label"][i])
        ex.example_labels["pad"] = labels

    def build_head(self, model_cfg, encoder) -> torch.nn.Module:
        return SequenceHead(model_cfg.hidden, 2, model_cfg.dropout)

    def loss_and_sums(self, head, hidden_BTH, batch):
        return classification_sums(head(hidden_BTH[:, 0]), batch["pad"])
