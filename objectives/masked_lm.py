"""MLM with rarer tokens masked more often (paper §3.3, after XLM: Conneau & Lample 2019).

Labelling rule, per `pair` example: of its non-special tokens, `round(mask_prob * n)` (at least one)
positions are drawn without replacement with probability proportional to count(token)^-alpha, where
count is the token's corpus frequency saved next to the tokenizer; of those, 80% become [MASK], 10%
a uniformly random non-special token, 10% stay. The decoder is tied to the input embeddings and runs
only on the drawn positions.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from alignlab.platform.encoder.batching import IGNORE
from alignlab.platform.encoder.linear_cross_entropy import linear_cross_entropy_sums
from alignlab.platform.encoder.model import MaskedLMHead
from alignlab.platform.encoder.registry import (Objective, classification_metrics, classification_sums, labelled,
                                        labelled_count, lock_inputs, register)
from alignlab.platform.runtime.throughput import matmul_flops


@register
@dataclass(frozen=True, kw_only=True, slots=True)
class MaskedLMConfig:
    name: ClassVar[str] = "mlm"
    default_set_rank: ClassVar[int] = 0  # the paper's four, in its order (`registry.default_set`)
    default_on: ClassVar[bool] = True
    """What a PretrainConfig that names no objective trains (`registry.default_objectives`)."""
    weight: float = 1.0
    mask_prob: float = 0.15
    alpha: float = 0.5
    """Sampling exponent: weight of a token is count^-alpha (0 = uniform, as in BERT)."""
    mask_token_prob: float = 0.8
    random_token_prob: float = 0.1

    def __post_init__(self) -> None:
        if not 0 < self.mask_prob < 1:
            raise ValueError(f"mlm.mask_prob must be in (0, 1), got {self.mask_prob}")
        if self.alpha < 0 or self.weight < 0:
            raise ValueError("mlm.alpha and mlm.weight must be >= 0")
        if self.mask_token_prob + self.random_token_prob > 1:
            raise ValueError("mlm.mask_token_prob + mlm.random_token_prob must be <= 1")

    def curriculum(self) -> "MaskedLMConfig":
        """What MLM collates with in a curriculum's first steps (`PretrainConfig.curriculum_fraction`): uniform
        masks, on which a small encoder learns to use the context faster (docs/journal/round-04.md)."""
        return dataclasses.replace(self, alpha=0.0)

    def build(self, tokenizer) -> "MaskedLM":
        return MaskedLM(self, tokenizer)


def _gumbel_at(rng: np.random.Generator, shape: tuple[int, int], where: np.ndarray) -> np.ndarray:
    """`rng.gumbel(size=shape)[where]`, drawing what that call draws but taking logarithms only where needed (most
    of a collated window is padding). NumPy's Gumbel sampler is `-log(-log(1 - U))` for a uniform U, drawn again
    when U is 0; on that (2^-53 per draw) this falls back to the sampler itself, from the same state."""
    state = rng.bit_generator.state
    u = 1.0 - rng.random(size=shape)
    if (u == 1.0).any():
        rng.bit_generator.state = state
        return rng.gumbel(size=shape)[where]
    return -np.log(-np.log(u[where]))


def decoder_flops(hidden: int, vocab_size: int, predicted: float) -> float:
    """Training FLOPs of `MaskedLMHead` on `predicted` positions: 6 (d^2 + d V) each."""
    return matmul_flops(hidden * hidden + hidden * vocab_size, predicted)


class MaskedLM(Objective):
    name = "mlm"
    labelled_keys = ("mlm",)

    def __init__(self, config: MaskedLMConfig, tokenizer):
        super().__init__(config, tokenizer)
        counts = np.asarray(tokenizer.counts, dtype=np.float64)
        w = np.power(np.maximum(counts, 1.0), -config.alpha)
        w[tokenizer.special_ids] = 0.0
        self.log_weight = np.log(np.maximum(w, 1e-300))
        self.log_weight[tokenizer.special_ids] = -np.inf
        self.random_ids = np.setdiff1d(np.arange(tokenizer.vocab_size), tokenizer.special_ids)

    def add_labels(self, batch: dict, ex, rng: np.random.Generator) -> None:
        ids = batch["input_ids"]  # numpy [B, T], edited in place
        B, T = ids.shape
        log_w = self.log_weight[ids]
        cand = np.isfinite(log_w) & (batch["row_format"] == 0)[:, None]
        n_pred = np.where(cand.any(1), np.maximum(1, np.rint(self.config.mask_prob * cand.sum(1))), 0).astype(int)
        # Weighted sampling without replacement per row by the Gumbel-top-k trick: a row's n_pred largest keys,
        # found as those at or above its n_pred-th largest (a sort, not an argsort and its inverse; the keys are
        # continuous, so ties between candidates have probability zero).
        keys = np.full((B, T), -np.inf)
        keys[cand] = log_w[cand] + _gumbel_at(rng, (B, T), cand)
        kth = -np.sort(-keys, axis=1)[np.arange(B), np.maximum(n_pred - 1, 0)]
        chosen = cand & (keys >= kth[:, None]) & (n_pred > 0)[:, None]
        pos = np.flatnonzero(chosen)
        labels = ids.reshape(-1)[pos].copy()
        u = rng.random(pos.size)
        flat = ids.reshape(-1)
        to_mask = u < self.config.mask_token_prob
        to_rand = (u >= self.config.mask_token_prob) & (u < self.config.mask_token_prob + self.config.random_token_prob)
        flat[pos[to_mask]] = self.tokenizer.mask_id
        flat[pos[to_rand]] = rng.choice(self.random_ids, size=int(to_rand.sum()))
        lock_inputs(batch, chosen)  # e.g. RTD must not resample what MLM predicts
        # Labels per row ([B, T], IGNORE where nothing is predicted), so that any batch cut from a collated window
        # by row carries exactly its own labels (bucketing.py).
        out = np.full((B, T), IGNORE, dtype=np.int64)
        out.reshape(-1)[pos] = labels
        batch["mlm"] = out

    @property
    def num_classes(self) -> int:
        return self.tokenizer.vocab_size

    def build_head(self, model_cfg, encoder) -> torch.nn.Module:
        return MaskedLMHead(model_cfg.hidden, encoder.tok)

    def loss_and_sums(self, head, hidden_BTH, batch):
        # The decoder runs only on the predicted positions (sparse prediction), in row-major order, padded to a few
        # shapes (labelled_rows: padded rows are labelled IGNORE and count nowhere).
        pos, target = labelled(batch, "mlm")
        h = hidden_BTH.reshape(-1, hidden_BTH.shape[-1]).index_select(0, pos)
        if head.training and self.output_chunk_rows:
            # The decoder and its loss a chunk of rows at a time: no [N, V] fp32 logits (a GPU's step; the same loss
            # within float tolerance, `linear_cross_entropy`).
            return linear_cross_entropy_sums(head.transform(h), head.tok_embedding.weight, head.bias, target,
                                             chunk_rows=self.output_chunk_rows)
        logits = head(h)
        loss, sums = classification_sums(logits, target)
        if not head.training:  # held-out evaluation only: a second argmax is not worth its cost in training steps
            with torch.no_grad():
                shown = batch["input_ids"].reshape(-1).index_select(0, pos)
                at_mask = (shown == self.tokenizer.mask_id) & (target != IGNORE)
                sums["masked_count"] = at_mask.sum().float()
                sums["masked_correct"] = ((logits.argmax(-1) == target) & at_mask).sum().float()
        return loss, sums

    def max_labelled(self, key, rows, width):
        # round(mask_prob x n) of a row's n <= width - 2 non-special tokens (at least one), a monotone bound.
        return rows * max(1, int(np.rint(self.config.mask_prob * (width - 2))))

    def head_flops(self, model_cfg, batch, *, seq_len):
        # The transform (d x d) and the tied decoder (d x V) on each predicted position: at a 111K vocabulary the
        # decoder alone is ~40% of the 768x3 model's work per example (docs/throughput.md#the-flop-count).
        return decoder_flops(model_cfg.hidden, self.tokenizer.vocab_size, labelled_count(batch, "mlm"))

    @classmethod
    def expected_head_flops(cls, config, model_cfg, vocab_size, *, seq_len, rows, tokens):
        # round(mask_prob x n) of each row's n non-special tokens (a pair example has 3 specials).
        return decoder_flops(model_cfg.hidden, vocab_size, config.mask_prob * max(tokens - 3 * rows, 0))

    def finalize(self, sums: dict[str, float]) -> dict[str, float]:
        """Accuracy and perplexity over every predicted position, as the paper (XLM's code) counts them, and
        `masked_accuracy` over the positions whose input was [MASK]: the other predicted positions show the
        token itself (10% kept, 10% random), and a model that only copies what it sees scores the kept 10%
        there without using any context (the mini models at 2,000 steps do exactly that)."""
        out = classification_metrics(sums)
        n = float(sums.get("masked_count", 0.0))
        if n:
            out["masked_accuracy"] = float(sums["masked_correct"]) / n
        return out
