"""Which parameters a finetuning scheme trains (paper Table 3), for post-LN and pre-LN encoders alike.

Split from finetune.py so the rule sits in one place a test can read against the model's parts.
"""
from __future__ import annotations

import torch

from alignlab.platform.encoder.model import AlignModel

MULTITASK = "mt:pred+trm"
TRAINS_TRANSFORMER = ("pred+trm", MULTITASK, "pred+trm+emb")
TRAINS_EMBEDDINGS = ("pred+trm+emb",)


def trainable_parameters(model: AlignModel, scheme: str, tasks: tuple[str, ...]) -> list[torch.nn.Parameter]:
    """The parameters `scheme` trains (requires_grad on), every other one frozen:
    - `pred`: the task heads only (the encoder's outputs are computed once and cached, `finetune._Features`).
    - `pred+trm`, `mt:pred+trm`: the heads, every Transformer layer, and a pre-LN encoder's final LayerNorm. That
      norm is the top of the encoder, what the heads read: a post-LN layer carries its own output norm (`ln2`)
      and trains it with the layer, and a pre-LN stack moves that norm after the last layer, so a scheme that
      trains the layers trains it too, or the top of a pre-LN model stays fixed while a post-LN one learns.
    - `pred+trm+emb`: all of that and the embeddings (tokens, positions, segments, their LayerNorm), except
      what the encoder declares fixed (`Encoder.fixed_parameters`: a sinusoidal position table is a formula,
      not a weight; training it would make it a learned table the config does not describe)."""
    for p in model.parameters():
        p.requires_grad_(False)
    enc = model.encoder
    groups = [model.heads[t] for t in tasks]
    if scheme in TRAINS_TRANSFORMER:
        groups += [enc.layers] + ([enc.final_ln] if enc.final_ln is not None else [])
    if scheme in TRAINS_EMBEDDINGS:
        groups += [enc.tok, enc.pos, enc.seg, enc.ln]
    fixed = {id(p) for p in enc.fixed_parameters()}
    params = list({id(p): p for g in groups for p in g.parameters() if id(p) not in fixed}.values())
    for p in params:
        p.requires_grad_(True)
    return params
