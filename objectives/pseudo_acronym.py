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
    subword_alpha: float = 0.0
    """> 0: the chunk of every PAD example is re-segmented by sentencepiece sampling at this alpha (subword
    regularization, Kudo 2018), fresh each time it is seen. The paper pairs PAD with subword regularization
    "to teach the model spelling" (§3.2): a sampled segmentation often splits a word's first letter off as
    its own word-initial piece ("▁w orld"), the same token the "letters" form gives that letter, which
    gives a small model a first foothold on matching letters to words. 0 turns it off."""

    def __post_init__(self) -> None:
        if self.weight < 0 or self.subword_alpha < 0:
            raise ValueError("pad.weight and pad.subword_alpha must be >= 0")
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

    def corrupt(self, ex, rng: np.random.Generator) -> None:
        alpha = self.config.subword_alpha
        if alpha <= 0:
            return
        for i, f in enumerate(ex.fmt):
            if f != "acronym":
                continue
            room = ex.max_len - 3 - len(ex.acronym[i] or ())
            pieces = [t for w in self.tokenizer.encode_words(str(ex.rows["a_text"][i]).split(), alpha=alpha,
                                                                 seed=int(rng.integers(1, 2**31)))
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
