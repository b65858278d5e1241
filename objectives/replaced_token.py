"""RTD, ELECTRA's replaced-token detection (Clark et al. 2020; seeds/003 §5.2): a small generator fills masked
positions with plausible samples, and the encoder (the discriminator) tells every token original or replaced.

Labelling rule, per `pair` example, redrawn every step:
- Candidates: the real, non-special tokens of the row, except positions another objective has already corrupted
  and predicts (`batch["input_locked"]`, e.g. MLM's drawn positions: replacing those would let a sample leak
  MLM's answer and would give the same token two contradicting labels).
- `round(mask_prob * n)` candidates (at least one) are drawn uniformly without replacement and shown to the
  generator as [MASK]. The generator, a small masked language model that is part of this objective, predicts
  them (its MLM loss trains it) and a token is sampled from its softmax at each (special tokens excluded).
- The sampled tokens replace those positions in the encoder's input. Every candidate is labelled 1 if its token
  now differs from the original and 0 otherwise: a sample equal to the original counts as original, as in
  ELECTRA. Acronym examples, specials, padding and locked positions carry -100.

Loss: `generator MLM loss + discriminator_weight * discriminator loss` (ELECTRA's lambda = 50), times the
objective's `weight` in the engine's sum like every objective. The generator has `generator_hidden` units (a
quarter of the encoder's width by default, the size ELECTRA found best), the encoder's depth, and a
proportionally smaller FFN. With `tie_embeddings` (the default, as in ELECTRA) it reads the encoder's own
embedding layer (token, position and segment embeddings, projected to its width) and its output softmax is tied
to the encoder's token embeddings; otherwise it has its own.

The generator edits the encoder's input with a model, so RTD uses the interface's model-time verb
`edit_input(head, batch)`, which the engine calls for every objective before the encoder runs. Randomness
(which positions, which sample) comes from uniform draws made in the data pipeline, keyed by (seed, rank, step)
like every on-the-fly label, so a resumed run redraws the same corruption.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from alignlab.platform.encoder.batching import IGNORE
from alignlab.platform.encoder.model import Encoder, EncoderLayer, MaskedLMHead, TokenHead, init_weights
from alignlab.platform.encoder.registry import Objective, classification_metrics, classification_sums, labelled_rows, register
from alignlab.platform.runtime.throughput import matmul_flops


@register
@dataclass(frozen=True, kw_only=True, slots=True)
class ReplacedTokenConfig:
    name: ClassVar[str] = "rtd"
    weight: float = 1.0
    discriminator_weight: float = 50.0
    """ELECTRA's lambda: the discriminator loss's weight against the generator's MLM loss."""
    mask_prob: float = 0.15
    generator_hidden: int | None = None
    """The generator's width; None = a quarter of the encoder's (ELECTRA's best generator size)."""
    generator_layers: int | None = None
    """None = as many layers as the encoder (ELECTRA shrinks the width, not the depth)."""
    tie_embeddings: bool = True
    """Share the encoder's embedding layer and tie the generator's softmax to its token embeddings (ELECTRA)."""

    def __post_init__(self) -> None:
        if not 0 < self.mask_prob < 1:
            raise ValueError(f"rtd.mask_prob must be in (0, 1), got {self.mask_prob}")
        if self.weight < 0 or self.discriminator_weight < 0:
            raise ValueError("rtd.weight and rtd.discriminator_weight must be >= 0")
        for f in ("generator_hidden", "generator_layers"):
            v = getattr(self, f)
            if v is not None and v <= 0:
                raise ValueError(f"rtd.{f} must be > 0 or None, got {v}")

    def build(self, tokenizer) -> "ReplacedToken":
        return ReplacedToken(self, tokenizer)


def generator_config(cfg: ReplacedTokenConfig, model_cfg):
    """The generator's ModelConfig: the encoder's shape at `generator_hidden` units."""
    import dataclasses

    g = cfg.generator_hidden or max(1, model_cfg.hidden // 4)
    head_dim = min(model_cfg.head_dim, g)
    if g % head_dim:
        raise ValueError(f"rtd.generator_hidden ({g}) must be a multiple of the head size ({head_dim})")
    return dataclasses.replace(model_cfg, hidden=g, head_dim=head_dim, ffn=max(g, model_cfg.ffn * g // model_cfg.hidden),
                               num_layers=cfg.generator_layers or model_cfg.num_layers)


class TiedGenerator(nn.Module):
    """A small MLM reading the encoder's embedding layer (projected to its width), softmax tied to its tokens."""

    def __init__(self, gcfg, encoder: Encoder):
        super().__init__()
        H = encoder.cfg.hidden
        self.proj = nn.Linear(H, gcfg.hidden)
        self.layers = nn.ModuleList(EncoderLayer(gcfg) for _ in range(gcfg.num_layers))
        self.dense = nn.Linear(gcfg.hidden, H)
        self.ln = nn.LayerNorm(H, eps=1e-12)
        self.bias = nn.Parameter(torch.zeros(encoder.vocab_size))
        self.apply(init_weights)
        self.encoder = [encoder]  # a list, so the encoder is not registered (and saved) twice as a submodule

    def forward(self, ids, seg, mask_B11T) -> torch.Tensor:
        x = self.proj(self.encoder[0].embed(ids, seg))
        for layer in self.layers:
            x = layer(x, mask_B11T)
        return x

    def logits(self, h_NG: torch.Tensor) -> torch.Tensor:
        return F.linear(self.ln(F.gelu(self.dense(h_NG))), self.encoder[0].tok.weight, self.bias)


class OwnGenerator(nn.Module):
    """A small MLM with embeddings of its own."""

    def __init__(self, gcfg, vocab_size: int):
        super().__init__()
        self.enc = Encoder(gcfg, vocab_size)
        self.head = MaskedLMHead(gcfg.hidden, self.enc.tok)

    def forward(self, ids, seg, mask_B11T) -> torch.Tensor:
        x = self.enc.embed(ids, seg)
        for layer in self.enc.layers:
            x = layer(x, mask_B11T)
        return x

    def logits(self, h_NG: torch.Tensor) -> torch.Tensor:
        return self.head(h_NG)


class ReplacedTokenHead(nn.Module):
    def __init__(self, generator: nn.Module, hidden: int, dropout: float):
        super().__init__()
        self.generator = generator
        self.discriminator = TokenHead(hidden, 2, dropout)


class ReplacedToken(Objective):
    name = "rtd"

    def __init__(self, config: ReplacedTokenConfig, tokenizer):
        super().__init__(config, tokenizer)
        self.special = torch.as_tensor(np.asarray(tokenizer.special_ids, dtype=np.int64))

    @property
    def num_classes(self) -> int:
        return 2

    def add_labels(self, batch: dict, ex, rng: np.random.Generator) -> None:
        # Only the draws are made here; which tokens are candidates is decided in edit_input, after every
        # objective's data-time edits (whatever order they are listed in).
        B, T = batch["input_ids"].shape
        batch["rtd_select_u"] = rng.random((B, T)).astype(np.float32)
        batch["rtd_sample_u"] = rng.random((B, T)).astype(np.float32)

    def build_head(self, model_cfg, encoder) -> nn.Module:
        gcfg = generator_config(self.config, model_cfg)
        gen = TiedGenerator(gcfg, encoder) if self.config.tie_embeddings else OwnGenerator(gcfg, encoder.vocab_size)
        return ReplacedTokenHead(gen, model_cfg.hidden, model_cfg.dropout)

    def candidates(self, batch: dict) -> torch.Tensor:
        ids = batch["input_ids"]
        cand = batch["attention_mask"].bool() & ~torch.isin(ids, self.special.to(ids.device))
        cand &= (batch["row_format"] == 0)[:, None]
        if "input_locked" in batch:
            cand &= ~batch["input_locked"].bool()
        return cand

    def edit_input(self, head: ReplacedTokenHead, batch: dict) -> dict:
        ids = batch["input_ids"]
        cand = self.candidates(batch)
        n_pred = torch.where(cand.any(1), (self.config.mask_prob * cand.sum(1)).round().clamp(min=1), 0).long()
        # Uniform sampling without replacement: the n smallest uniforms among the candidates.
        keys = torch.where(cand, batch["rtd_select_u"].float(), torch.tensor(2.0, device=ids.device))
        rank = keys.argsort(1).argsort(1)
        chosen = (rank < n_pred[:, None]) & cand
        pos = torch.nonzero(chosen.reshape(-1)).squeeze(1)
        original = ids.reshape(-1).index_select(0, pos)
        gen_ids = ids.reshape(-1).clone()
        gen_ids[pos] = self.tokenizer.mask_id
        gen_ids = gen_ids.view_as(ids)
        mask = batch["attention_mask"].bool()
        mask_B11T = None if bool(mask.all()) else mask[:, None, None, :]
        h = head.generator(gen_ids, batch["segment_ids"], mask_B11T)
        gen_logits = head.generator.logits(h.reshape(-1, h.shape[-1]).index_select(0, pos))
        with torch.no_grad():  # sampling is not differentiated through (ELECTRA): the generator learns by MLM only
            lg = gen_logits.detach().float()
            lg[:, self.special.to(lg.device)] = float("-inf")
            cdf = torch.softmax(lg, -1).cumsum(-1)
            u = batch["rtd_sample_u"].reshape(-1).index_select(0, pos).float()[:, None] * cdf[:, -1:]
            sampled = torch.searchsorted(cdf, u).squeeze(1).clamp(max=lg.shape[1] - 1)
            new_ids = ids.reshape(-1).clone()
            new_ids[pos] = sampled
            labels = torch.full_like(new_ids, IGNORE)
            labels[cand.reshape(-1)] = 0
            labels[pos] = (sampled != original).long()
        return {**batch, "input_ids": new_ids.view_as(ids), "rtd_labels": labels.view_as(ids),
                "rtd_gen_logits": gen_logits, "rtd_gen_labels": original, "rtd_positions": pos}

    def loss_and_sums(self, head: ReplacedTokenHead, hidden_BTH, batch):
        gen_loss, gen_sums = classification_sums(batch["rtd_gen_logits"], batch["rtd_gen_labels"])
        pos, lab = labelled_rows(batch["rtd_labels"].reshape(-1))  # padded to a few shapes; padded rows are IGNORE
        h = hidden_BTH.reshape(-1, hidden_BTH.shape[-1]).index_select(0, pos)
        logits = head.discriminator(h)
        disc_loss, sums = classification_sums(logits, lab)
        with torch.no_grad():
            replaced = lab == 1
            sums["replaced"] = replaced.sum().float()
            sums["replaced_correct"] = ((logits.argmax(-1) == 1) & replaced).sum().float()
        sums.update({f"generator_{k}": v for k, v in gen_sums.items()})
        # Two means in one loss: data-parallel workers reweight it by their share of the discriminator's count
        # (`count`), so the generator's term is the whole batch's mean only as far as each worker's masked tokens
        # are in proportion to its labelled ones (in expectation; not to the digit).
        return gen_loss + self.config.discriminator_weight * disc_loss, sums

    def head_flops(self, model_cfg, batch, *, seq_len):
        # Which positions are replaced is drawn on the device (edit_input): counted here in expectation, over the
        # batch's real tokens.
        return self.expected_head_flops(self.config, model_cfg, self.tokenizer.vocab_size, seq_len=seq_len,
                                        rows=len(batch["attention_mask"]), tokens=int(batch["attention_mask"].sum()))

    @classmethod
    def expected_head_flops(cls, config, model_cfg, vocab_size, *, seq_len, rows, tokens):
        """The generator (an encoder of its own over every token, trained by its MLM loss) and its decoder on the
        `mask_prob` share of the candidates, and the discriminator's d x 2 on every candidate (taken as every real
        token)."""
        g = generator_config(config, model_cfg)
        d = model_cfg.hidden
        # The generator's layers as matrix weights per token; its attention's 12 L g T FLOPs as 2 L g T "weights".
        per_token = g.num_layers * (4 * g.hidden ** 2 + 2 * g.hidden * g.ffn) + 2 * g.num_layers * g.hidden * seq_len
        per_token += 2 * d + (d * g.hidden if config.tie_embeddings else 0)  # the discriminator; the input projection
        decoder = g.hidden * d + d * vocab_size if config.tie_embeddings else g.hidden ** 2 + g.hidden * vocab_size
        predicted = config.mask_prob * max(tokens - 3 * rows, 0)
        return matmul_flops(per_token, tokens) + matmul_flops(decoder, predicted)

    def finalize(self, sums: dict[str, float]) -> dict[str, float]:
        out = classification_metrics(sums)  # the discriminator's: every labelled token, original or replaced
        n_rep = float(sums.get("replaced", 0.0))
        out["replaced_fraction"] = n_rep / out["count"] if out["count"] else float("nan")
        out["replaced_recall"] = float(sums.get("replaced_correct", 0.0)) / n_rep if n_rep else float("nan")
        gen = classification_metrics({k[len("generator_"):]: v for k, v in sums.items() if k.startswith("generator_")})
        out.update({f"generator_{k}": v for k, v in gen.items()})
        return out
