"""The encoder's shape: `ModelConfig`, frozen and validated (docs/architecture.md#configs).

It sits in the encoder's layer, beside the model it shapes (`model.py`), so that the model imports its config from
its own layer and never from `platform/config.py` above it; the configs of the stages, the paper's sizes
(`config.MODEL_SIZES`) and the dict round-trip and hash of every config stay there. Plain Python: no torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

NORMS = ("post", "pre")
POSITIONS = ("learned", "sinusoidal")


def _positive(obj: Any, *names: str) -> None:
    for n in names:
        v = getattr(obj, n)
        if v is None or v <= 0:
            raise ValueError(f"{type(obj).__name__}.{n} must be > 0, got {v!r}")


def _choice(obj: Any, name: str, choices: tuple[str, ...]) -> None:
    v = getattr(obj, name)
    if v not in choices:
        raise ValueError(f"{type(obj).__name__}.{name} must be one of {choices}, got {v!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    """A BERT encoder's shape (the paper: hidden 256/512/768 x 1/2/3 layers, 64-dim heads, FFN 3072)."""

    hidden: int = 768
    num_layers: int = 3
    head_dim: int = 64
    ffn: int = 3072
    max_len: int = 128
    """Longest input sequence in tokens, specials included."""
    dropout: float = 0.1
    """Dropout of the encoder (embeddings, attention probabilities, residual branches) during pretraining; FEL
    sets its own (`FinetuneConfig.dropout`). Cramming (Geiping & Goldstein 2022) trains without it: under a short
    budget the model underfits, and dropout only slows learning (and costs time on CPU)."""
    norm: str = "post"
    """Where each block's LayerNorm sits. "post" (vanilla BERT, the paper): x = LN(x + f(x)). "pre": x = x + f(LN(x)),
    with one final LayerNorm after the last block; pre-LN keeps the residual path an identity, so it trains stably
    at high learning rates without long warmup (Xiong et al. 2020; cramming's first choice)."""
    init: str = "bert"
    """Encoder weight init. "bert" (vanilla BERT): normal with std 0.02 everywhere. "fan_in": normal with
    std 1/sqrt(fan-in) per matrix, so attention logits start at order 1 at any width (at 128 wide, 0.02 starts
    with near-uniform attention). "bert" stays the default because fan_in did not help real PAD or CT at mini
    scale (benchmarks/probes/match_probe.py; docs/journal/mini-study.md)."""

    position: str = "learned"
    """Position embeddings. "learned" (BERT, the paper): a trained table, random at the start. "sinusoidal": the
    original Transformer's fixed sinusoids (Vaswani et al. 2017), scaled to the token embeddings' init size and
    not trained, so positions differ in a way attention can use from the first step (offsets are linear maps of
    each other). Stored in the same table, so FEL, serving and `alignlab export` (BERT's learned absolute
    positions) take either."""
    alibi: float = 0.0
    """Distance bias on attention logits (after ALiBi, Press et al. 2022, made symmetric for an encoder): head h
    subtracts `alibi * 2^(-8h/num_heads) * |i - j|` from the logit of query i on key j, so the first head looks at
    its neighbours from the first step and the last almost everywhere. 0 (BERT, the paper) turns it off. Issue #15:
    a small encoder whose attention starts uniform spends thousands of steps predicting masks from token
    frequencies alone before attention finds the neighbours; the bias hands it local context at step 0
    (docs/journal/round-03.md). FEL and serving use it; `alignlab export` writes such a model as
    transformers custom code (BERT and RoBERTa have no such bias; platform/pretrain/hf/modeling_alignlab.py)."""
    alibi_exempt_cls: bool = False
    """With `alibi` > 0: [CLS] (position 0) neither pays nor costs distance, so its query row and its key column
    carry no bias. Without it the steep head sees [CLS]'s neighbours only and the shallow one fades with distance,
    so [CLS] reads almost nothing past the first few words, and PAD, NSP and every sentence-level FEL head read
    [CLS] (issue #65: the last layer's [CLS] put <= 0.0006 of its attention on an AD snippet). Off by default, so
    a distance-biased model saved before the field existed runs as it was trained; the mini preset turns it on
    (benchmarks/probes/cls_reach.py measures the reach)."""

    def __post_init__(self) -> None:
        _positive(self, "hidden", "num_layers", "head_dim", "ffn", "max_len")
        _choice(self, "init", ("fan_in", "bert"))
        _choice(self, "position", POSITIONS)
        _choice(self, "norm", NORMS)
        if self.hidden % self.head_dim:
            raise ValueError(f"ModelConfig.hidden ({self.hidden}) must be a multiple of head_dim ({self.head_dim})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"ModelConfig.dropout must be in [0, 1), got {self.dropout}")
        if self.max_len < 16:
            raise ValueError(f"ModelConfig.max_len must be >= 16, got {self.max_len}")
        if not (self.alibi >= 0.0 and math.isfinite(self.alibi)):
            raise ValueError(f"ModelConfig.alibi must be a finite number >= 0, got {self.alibi!r}")

    def alibi_slopes(self) -> list[float]:
        """Each head's distance slope (all 0 when `alibi` is off)."""
        return [self.alibi * 2.0 ** (-8.0 * h / self.num_heads) for h in range(self.num_heads)]

    @property
    def num_heads(self) -> int:
        return self.hidden // self.head_dim

    @property
    def label(self) -> str:
        return f"{self.hidden}x{self.num_layers}"
