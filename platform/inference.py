"""Serving a finetuned model: CT tagging of one query and AD scoring of one (acronym, snippet) pair, fast.

The predictor runs batch 1 with no padding, in `torch.inference_mode()`, on a dedicated forward
(`FastEncoder`) that reads the very tensors of the trained `model.Encoder` but skips what serving
does not need:
- no nn.Module dispatch, dropout, attention masks or batch dimension: plain `addmm`/`layer_norm`/SDPA
  calls on (T, H) rows;
- the last layer computes its queries, attention output and FFN only for the rows a head reads
  (each word's first piece for CT, [CLS] for AD) -- its keys and values still cover every token;
- no MLM decoder (the saved model has none) and only the head that is asked for.
Its outputs equal `model.Encoder`'s in eval mode to float rounding (a test keeps it so).

Tags become brackets as in paper §4.1: "[" before an S word, "]" after an E word, "[w]" around an
SE word, N words bare; each word's tag is printed as predicted, so an ill-formed sequence (S S E)
shows as the paper's nested brackets rather than being repaired.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from alignlab.platform.aligned_labels import WHP_TAGS
from alignlab.platform.finetune import Finetuned, ad_input, ct_input, load_finetuned
from alignlab.platform.model import Encoder


def tags_to_brackets(words: Sequence[str], tags: Sequence[str]) -> str:
    """`when was the first [super mario] released` from words and their S/E/SE/N tags (paper §4.1)."""
    if len(words) != len(tags):
        raise ValueError(f"{len(tags)} tags for {len(words)} words")
    out = []
    for w, t in zip(words, tags):
        if t == "S":
            out.append("[" + w)
        elif t == "E":
            out.append(w + "]")
        elif t == "SE":
            out.append("[" + w + "]")
        elif t == "N":
            out.append(w)
        else:
            raise ValueError(f"unknown tag {t!r} (expected one of {', '.join(WHP_TAGS)})")
    return " ".join(out)


class FastEncoder:
    """`model.Encoder`'s eval-mode forward for one unpadded sequence, on the encoder's own weight tensors."""

    def __init__(self, encoder: Encoder):
        cfg = encoder.cfg
        self.H, self.num_heads, self.head_dim = cfg.hidden, cfg.num_heads, cfg.head_dim
        self.max_len = cfg.max_len
        self.tok = encoder.tok.weight.detach()
        self.pos = encoder.pos.weight.detach()
        self.seg = encoder.seg.weight.detach()
        # Position + segment-0 rows precomputed: a CT query (all segment 0) needs one add less.
        self.pos_seg0 = (self.pos + self.seg[0]).contiguous()
        self.ln = (encoder.ln.weight.detach(), encoder.ln.bias.detach(), encoder.ln.eps)
        # Weights transposed once so every projection is one addmm(bias, x, W^T) with a contiguous W^T.
        self.layers = []
        for layer in encoder.layers:
            w = lambda lin: (lin.weight.detach().t().contiguous(), lin.bias.detach())  # noqa: E731
            self.layers.append((w(layer.qkv), w(layer.attn_out), (layer.ln1.weight.detach(), layer.ln1.bias.detach()),
                                w(layer.ffn_in), w(layer.ffn_out), (layer.ln2.weight.detach(), layer.ln2.bias.detach()),
                                layer.ln1.eps, layer.ln2.eps))

    def __call__(self, ids_T: torch.Tensor, seg_T: torch.Tensor | None = None,
                 rows: torch.Tensor | None = None) -> torch.Tensor:
        """Final hidden states (T, H), or (len(rows), H) for just `rows` (computed only there in the last layer)."""
        T, H, nh, d = ids_T.shape[0], self.H, self.num_heads, self.head_dim
        if seg_T is None:
            x = self.tok.index_select(0, ids_T) + self.pos_seg0[:T]
        else:
            x = self.tok.index_select(0, ids_T) + self.pos[:T] + self.seg.index_select(0, seg_T)
        x = F.layer_norm(x, (H,), *self.ln)
        last = len(self.layers) - 1
        for i, ((qkv_w, qkv_b), (ao_w, ao_b), ln1, (fi_w, fi_b), (fo_w, fo_b), ln2, eps1, eps2) in enumerate(self.layers):
            if i == last and rows is not None:
                kv = torch.addmm(qkv_b[H:], x, qkv_w[:, H:]).view(T, 2, nh, d).permute(1, 2, 0, 3)
                k, v = kv[0], kv[1]
                x = x.index_select(0, rows)
                q = torch.addmm(qkv_b[:H], x, qkv_w[:, :H]).view(-1, nh, d).transpose(0, 1)
            else:
                q, k, v = torch.addmm(qkv_b, x, qkv_w).view(T, 3, nh, d).permute(1, 2, 0, 3)
            a = F.scaled_dot_product_attention(q, k, v).transpose(0, 1).reshape(-1, H)
            x = F.layer_norm(torch.addmm(ao_b, a, ao_w).add_(x), (H,), *ln1, eps1)
            f = F.gelu(torch.addmm(fi_b, x, fi_w))
            x = F.layer_norm(torch.addmm(fo_b, f, fo_w).add_(x), (H,), *ln2, eps2)
        return x


class Predictor:
    """CT tags / AD scores of one input from a finetuned model (never the MLM decoder, never padding)."""

    def __init__(self, ft: Finetuned):
        self.ft, self.tok = ft, ft.tok
        self.max_len = ft.model.cfg.max_len
        self.acronym_form = ft.cfg.acronym_form
        self.enc = FastEncoder(ft.model.encoder)
        self.heads = {name: _head_tensors(head) for name, head in ft.model.heads.items()}

    @classmethod
    def load(cls, fdir: str | Path) -> "Predictor":
        return cls(load_finetuned(fdir))

    def _need(self, head: str) -> None:
        if head not in self.heads:
            raise ValueError(f"finetuned model {self.ft.fid} has no {head!r} head (it has {', '.join(self.heads)})")

    def tag(self, words: Sequence[str], head: str = "ct") -> list[str]:
        """One tag per word; words past the model's max length (never scored) are N."""
        self._need(head)
        ids, first = ct_input(self.tok, words, self.max_len)
        if not first:
            return ["N"] * len(words)
        w, b = self.heads[head]
        with torch.inference_mode():
            h = self.enc(torch.tensor(ids), None, torch.tensor(first))
            pred = torch.addmm(b, h, w).argmax(-1).tolist()
        return [WHP_TAGS[t] for t in pred] + ["N"] * (len(words) - len(first))

    def bracket(self, query: str, head: str = "ct") -> str:
        words = query.split()
        return tags_to_brackets(words, self.tag(words, head))

    def acronym_score(self, acronym: str, snippet: str, head: str = "ad") -> float:
        """Softmax probability that `acronym` matches an entity (AD) / a span (PAD) of `snippet`."""
        self._need(head)
        ids, seg = ad_input(self.tok, acronym, snippet, self.max_len, self.acronym_form)
        pool_w, pool_b, w, b = self.heads[head]
        with torch.inference_mode():
            h = self.enc(torch.tensor(ids), torch.tensor(seg), torch.zeros(1, dtype=torch.long))
            logits = torch.addmm(b, torch.tanh(torch.addmm(pool_b, h, pool_w)), w)[0].tolist()
        return 1.0 / (1.0 + math.exp(logits[0] - logits[1]))

    def acronym_scores(self, acronym: str, snippet: str) -> dict[str, float]:
        """AD's score, and PAD's when the model carries the pretrained PAD head (paper §4.1's pair)."""
        out = {"ad": self.acronym_score(acronym, snippet, "ad")}
        if "pad" in self.heads:
            out["pad"] = self.acronym_score(acronym, snippet, "pad")
        return out


def _head_tensors(head: torch.nn.Module) -> tuple[torch.Tensor, ...]:
    """(W^T, b) of a TokenHead; (pool W^T, pool b, W^T, b) of a SequenceHead (dropout is off at inference)."""
    t = lambda lin: (lin.weight.detach().t().contiguous(), lin.bias.detach())  # noqa: E731
    return (*t(head.pool), *t(head.out)) if hasattr(head, "pool") else t(head.out)
