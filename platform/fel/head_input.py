"""What a finetuned task head reads from the encoder (`FinetuneConfig.feature_layers`, `word_pooling`), and how
such a head is made: fresh, or widened from a pretrained aligned head so that it starts as that head.

The paper's head (and BERT's) reads the last layer at a word's first piece. A head may instead read every layer
side by side (`Encoder.forward(layers="all")`) and a word's pieces averaged (`task.word_means`). A head built for
another input than the default carries it as its `reads` attribute, which scoring (`task_scoring.unit_vectors`)
and serving (`inference.Predictor.unit_vectors`) read; a saved model rebuilds it from its FinetuneConfig.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from alignlab.platform.encoder.model_config import ModelConfig
from alignlab.platform.fel.finetune_config import FinetuneConfig
from alignlab.platform.tasks.task import TokenTask


@dataclass(frozen=True)
class HeadInput:
    """What a task head reads from the encoder at each scored unit (`FinetuneConfig.feature_layers`,
    `word_pooling`). The default is the paper's and BERT's: the last layer at a word's first piece."""

    layers: str = "last"
    """"last": the encoder's output; "all": the embedding output and every layer's, side by side (the
    feature-based use of BERT, Devlin et al. 2019 §5.3, and ELMo's)."""
    pooling: str = "first"
    """A word's vector: "first", its first piece's; "mean", the mean of its pieces'. Sequence tasks read [CLS]."""

    def width(self, cfg: ModelConfig) -> int:
        return cfg.hidden * (cfg.num_layers + 1 if self.layers == "all" else 1)


LAST_LAYER_FIRST_PIECE = HeadInput()


def head_input(head: nn.Module) -> HeadInput:
    """What `head` reads: the `HeadInput` it was built for (a finetuned task head), else the default."""
    return getattr(head, "reads", LAST_LAYER_FIRST_PIECE)


def reads_of(cfg: FinetuneConfig) -> HeadInput:
    """What a calculation's task heads read from the encoder."""
    return HeadInput(cfg.feature_layers, cfg.word_pooling)


class LinearHead(nn.Module):
    """A task's classes as one linear map of what it reads (`FinetuneConfig.head="logistic"`): the form of a
    logistic regression fitted on frozen features (`finetune.fit_logistic_head`)."""

    def __init__(self, width: int, num_classes: int):
        super().__init__()
        self.out = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x)


def task_head(t, cfg: ModelConfig, dropout: float, reads: HeadInput, kind: str = "trained") -> torch.nn.Module:
    """A fresh head of task `t` that reads `reads` (a sequence task's unit, [CLS], has no pieces to pool); `kind`:
    `FinetuneConfig.head`, the task's own head or a `LinearHead`."""
    reads = reads if isinstance(t, TokenTask) else dataclasses.replace(reads, pooling="first")
    head = t.make_head(reads.width(cfg), dropout) if kind == "trained" else LinearHead(reads.width(cfg), t.num_classes)
    if reads != LAST_LAYER_FIRST_PIECE:
        head.reads = reads
    return head


def fits(pretrained: dict[str, torch.Tensor], fresh: dict[str, torch.Tensor]) -> bool:
    """Whether a pretrained head's weights fit a fresh head (`widened` can place them): the same weights, each no
    larger than the fresh one's and with its class count (a weight's first dimension at the output layer)."""
    if set(pretrained) != set(fresh):
        return False
    for k, v in pretrained.items():
        f = fresh[k]
        if f.dim() != v.dim() or f.dim() > 2 or any(a < b for a, b in zip(f.shape, v.shape)):
            return False
        if k.startswith("out.") and f.shape[0] != v.shape[0]:
            return False
    return True


def widened(pretrained: dict[str, torch.Tensor], fresh: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A pretrained head's weights in a head that reads every layer, which starts out computing what the pretrained
    head computed. The last layer's features are the trailing block of the wider input, so each wider weight keeps
    its fresh values except in its trailing rows (as many as the pretrained weight has): those are zero but in their
    trailing columns, which hold the pretrained weight. For a token head that is its output layer; a sequence head's
    pooler keeps fresh extra units, which its output layer reads with zero weights at first."""
    out = {}
    for k, v in pretrained.items():
        f = fresh[k]
        if f.shape == v.shape:
            out[k] = v
            continue
        if f.dim() != v.dim() or f.dim() > 2 or any(a < b for a, b in zip(f.shape, v.shape)):
            raise ValueError(f"pretrained head weight {k} {tuple(v.shape)} does not fit a head of shape {tuple(f.shape)}")
        w = f.clone()
        if v.dim() == 1:
            w[-v.shape[0]:] = v
        else:
            w[-v.shape[0]:] = 0
            w[-v.shape[0]:, -v.shape[1]:] = v
        out[k] = w
    return out
