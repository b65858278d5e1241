"""A BERT encoder (post-LN as vanilla BERT, or pre-LN: `ModelConfig.norm`) and the small heads the objectives put on top of it.

Shape legend: B batch, T time (tokens), H hidden, V vocabulary, C classes, N selected rows/positions.
A model is `AlignModel`: one shared encoder plus one head per objective, named by objective, so a
finetuning run can keep a pretrained head (CT from WHP's, AD from PAD's) or discard it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from alignlab.platform.encoder.model_config import ModelConfig


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`F.dropout`, with the CPU keep-mask drawn from raw 64-bit random words (two 32-bit uniforms each)
    instead of `bernoulli_`, which on CPU costs several times everything else dropout does. Drop
    probability p to within 2^-32, kept values scaled by 1/(1-p) as usual."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or not 0.0 < p < 1.0:
        return F.dropout(x, p, True)
    n = x.numel()
    bits = torch.empty((n + 1) // 2, dtype=torch.int64).random_(-(2**63), None).view(torch.int32)[:n]
    scale = (bits >= round(p * 2**32) - 2**31).view(x.shape).to(x.dtype).mul_(1.0 / (1.0 - p))
    return x * scale


class EncoderLayer(nn.Module):
    cpu_training_attention = "auto"
    """Which attention trains on CPU without dropout: "auto" (written out in bf16, SDPA in fp32; see `attend`),
    "sdpa" or "written_out". A class switch only so that benchmarks/throughput/attention_cpu.py can time the paths in one
    process; the engine never changes it."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads, self.head_dim, self.p = cfg.num_heads, cfg.head_dim, cfg.dropout
        self.pre_ln = cfg.norm == "pre"
        # One fused projection for q, k and v: one matmul instead of three.
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.attn_out = nn.Linear(cfg.hidden, cfg.hidden)
        self.ln1 = nn.LayerNorm(cfg.hidden, eps=1e-12)
        self.ffn_in = nn.Linear(cfg.hidden, cfg.ffn)
        self.ffn_out = nn.Linear(cfg.ffn, cfg.hidden)
        self.ln2 = nn.LayerNorm(cfg.hidden, eps=1e-12)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x_BTH: torch.Tensor, mask_B11T: torch.Tensor | None) -> torch.Tensor:
        p = self.drop.p
        if self.pre_ln:
            x_BTH = x_BTH + dropout(self.attend(self.ln1(x_BTH), mask_B11T), p, self.training)
            return x_BTH + dropout(self.ffn_out(F.gelu(self.ffn_in(self.ln2(x_BTH)))), p, self.training)
        x_BTH = self.ln1(x_BTH + dropout(self.attend(x_BTH, mask_B11T), p, self.training))
        return self.ln2(x_BTH + dropout(self.ffn_out(F.gelu(self.ffn_in(x_BTH))), p, self.training))

    def attend(self, x_BTH: torch.Tensor, mask_B11T: torch.Tensor | None) -> torch.Tensor:
        """Multi-head self-attention with its output projection (no residual, no norm)."""
        B, T, H = x_BTH.shape
        q, k, v = self.qkv(x_BTH).view(B, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        drop = self.training and self.p > 0
        if x_BTH.device.type == "cpu" and (drop or (q.requires_grad and self._write_out(q.dtype))):
            # Written out rather than SDPA, in two cases on CPU:
            # - with dropout, SDPA's only CPU kernel is its generic "math" path (scales q and k, a NaN-safe
            #   softmax, bernoulli dropout); this is the same attention with fewer passes;
            # - in bf16 with gradients: SDPA's CPU flash kernel is fast forward but its backward took ~3x this
            #   path's forward + backward at the mini model's shapes (benchmarks/throughput/attention_cpu.py). The scores
            #   and the softmax are in fp32, as in the flash kernel. fp32 training keeps SDPA, faster there.
            s = torch.matmul(q * self.head_dim**-0.5, k.transpose(-1, -2))
            if q.dtype == torch.bfloat16:
                s = s.float()
            if mask_B11T is not None and mask_B11T.dtype == torch.bool:
                s = s.masked_fill_(~mask_B11T, float("-inf"))
            elif mask_B11T is not None:  # an additive bias (alibi), -inf at padding
                s = s + mask_B11T
            a = torch.matmul(dropout(torch.softmax(s, -1), self.p, drop).to(v.dtype), v)
        else:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask_B11T,
                                               dropout_p=self.p if self.training else 0.0)
        return self.attn_out(a.transpose(1, 2).reshape(B, T, H))

    def _write_out(self, dtype: torch.dtype) -> bool:
        mode = self.cpu_training_attention
        return mode == "written_out" or (mode == "auto" and dtype == torch.bfloat16)


class Encoder(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int):
        super().__init__()
        self.cfg, self.vocab_size = cfg, vocab_size
        self.tok = nn.Embedding(vocab_size, cfg.hidden)
        self.pos = nn.Embedding(cfg.max_len, cfg.hidden)
        self.seg = nn.Embedding(2, cfg.hidden)
        self.ln = nn.LayerNorm(cfg.hidden, eps=1e-12)
        self.drop = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.num_layers))
        # Pre-LN blocks leave the residual stream unnormalized; one LayerNorm after the last block puts the heads'
        # input back on the scale post-LN gives them.
        self.final_ln = nn.LayerNorm(cfg.hidden, eps=1e-12) if cfg.norm == "pre" else None
        self.apply(init_weights if cfg.init == "bert" else init_fan_in)
        if cfg.position == "sinusoidal":
            with torch.no_grad():
                self.pos.weight.copy_(sinusoids(cfg.max_len, cfg.hidden) * float(self.tok.weight.std()) * 2**0.5)
            self.pos.weight.requires_grad_(False)

    def fixed_parameters(self) -> list[nn.Parameter]:
        """Parameters no training may change: the sinusoidal position table (`ModelConfig.position`)."""
        return [self.pos.weight] if self.cfg.position == "sinusoidal" else []

    def embed(self, input_ids: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
        T = input_ids.shape[1]
        pos = torch.arange(T, device=input_ids.device)
        return dropout(self.ln(self.tok(input_ids) + self.pos(pos)[None] + self.seg(segment_ids)), self.drop.p,
                       self.training)

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None, layers: str = "last") -> torch.Tensor:
        """The last layer's hidden states [B, T, H]; with layers="all" (`head_input.HeadInput`), the embedding output
        and every layer's output side by side [B, T, (num_layers + 1) * H]: each layer-normalised (without
        weights), the last as the heads see it."""
        x = self.embed(input_ids, segment_ids)
        mask = None
        # An all-ones mask is dropped where asking costs nothing (on the host); on a device the question would make
        # the host wait, so a given mask is used there (the pretraining step passes none for an unpadded batch).
        # Under torch.compile the question would break the graph: the mask is used as given.
        if attention_mask is not None and (attention_mask.device.type != "cpu" or torch.compiler.is_compiling()
                                           or not bool(attention_mask.all())):
            mask = attention_mask[:, None, None, :]
        if self.cfg.alibi > 0:
            mask = self.distance_bias(input_ids.shape[1], x.dtype, x.device, mask)
        states = [x] if layers == "all" else None
        for layer in self.layers:
            x = layer(x, mask)
            if states is not None:
                states.append(x)
        x = self.final_ln(x) if self.final_ln is not None else x
        if states is None:
            return x
        # A pre-LN block's output is the raw residual stream, whose scale grows with depth: normalised, every
        # layer reaches a head on one scale (post-LN outputs are normalised already, so this changes little there).
        H = x.shape[-1]
        return torch.cat([F.layer_norm(s, (H,)) for s in states[:-1]] + [x], -1)

    def distance_bias(self, T: int, dtype: torch.dtype, device: torch.device,
                      keep_B11T: torch.Tensor | None) -> torch.Tensor:
        """The additive attention bias of `ModelConfig.alibi`: -slope_h * |i - j| [1 or B, heads, T, T], with -inf on
        the keys `keep_B11T` masks out (padding); with `alibi_exempt_cls`, 0 on [CLS]'s row and column."""
        slopes = torch.tensor(self.cfg.alibi_slopes(), dtype=torch.float32, device=device)
        dist = distances(T, device, self.cfg.alibi_exempt_cls)
        bias = (-slopes[:, None, None] * dist)[None]
        if keep_B11T is not None:
            bias = bias.masked_fill(~keep_B11T, float("-inf"))
        return bias.to(dtype)


@torch.no_grad()
def query_attention(encoder: Encoder, input_ids: torch.Tensor, segment_ids: torch.Tensor,
                    attention_mask: torch.Tensor | None = None, query: int = 0) -> torch.Tensor:
    """The attention probabilities of position `query` (0: [CLS]) on every key, in each layer and head
    [layers, B, heads, T], as the encoder computes them in eval mode (bias and padding included). For measuring
    how far a position reads (benchmarks/probes/cls_reach.py), not for training."""
    x = encoder.embed(input_ids, segment_ids)
    mask = attention_mask[:, None, None, :].bool() if attention_mask is not None else None
    if encoder.cfg.alibi > 0:
        mask = encoder.distance_bias(input_ids.shape[1], torch.float32, x.device, mask)
    out = []
    for layer in encoder.layers:
        h = layer.ln1(x) if layer.pre_ln else x
        B, T, H = h.shape
        q, k, _ = layer.qkv(h).view(B, T, 3, layer.num_heads, layer.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        s = torch.matmul(q[:, :, query:query + 1].float() * layer.head_dim**-0.5, k.float().transpose(-1, -2))
        if mask is not None and mask.dtype == torch.bool:
            s = s.masked_fill(~mask, float("-inf"))
        elif mask is not None:
            s = s + mask[:, :, query:query + 1]
        out.append(torch.softmax(s, -1)[:, :, 0])
        x = layer(x, mask if mask is None or mask.dtype == torch.bool else mask.to(x.dtype))
    return torch.stack(out)


def distances(T: int, device: torch.device, exempt_cls: bool) -> torch.Tensor:
    """|i - j| [T, T] in fp32; with `exempt_cls`, 0 wherever the query or the key is position 0 ([CLS])."""
    pos = torch.arange(T, device=device)
    dist = (pos[None, :] - pos[:, None]).abs().float()
    if exempt_cls:
        dist[0, :] = 0.0
        dist[:, 0] = 0.0
    return dist


def sinusoids(num_positions: int, dim: int) -> torch.Tensor:
    """The Transformer's position table: sin and cos of position / 10000^(2i/dim), interleaved; each column has
    RMS 1/sqrt(2)."""
    pos = torch.arange(num_positions, dtype=torch.float64)[:, None]
    freq = torch.pow(10000.0, -torch.arange(0, dim, 2, dtype=torch.float64) / dim)[None]
    out = torch.zeros(num_positions, dim, dtype=torch.float64)
    out[:, 0::2] = torch.sin(pos * freq)
    out[:, 1::2] = torch.cos(pos * freq[:, : dim // 2])
    return out.float()


def init_weights(m: nn.Module) -> None:
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=0.02)
    if isinstance(m, nn.Linear) and m.bias is not None:
        nn.init.zeros_(m.bias)
    if isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)


def init_fan_in(m: nn.Module) -> None:
    """Normal with std 1/sqrt(fan-in) (an embedding's fan-in taken as its width), so that attention
    logits start at order 1 whatever the model's width; see `ModelConfig.init`."""
    init_weights(m)
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=m.weight.shape[1] ** -0.5)


class TokenHead(nn.Module):
    """Per-token classes (WHP, CT)."""

    def __init__(self, hidden: int, num_classes: int, dropout: float):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(hidden, num_classes)
        self.apply(init_weights)

    def forward(self, h_NH: torch.Tensor) -> torch.Tensor:
        return self.out(self.drop(h_NH))


class SequenceHead(nn.Module):
    """Classes of a whole input from its [CLS] vector (NSP, PAD, AD): BERT's tanh pooler + linear."""

    def __init__(self, hidden: int, num_classes: int, dropout: float):
        super().__init__()
        self.pool = nn.Linear(hidden, hidden)
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(hidden, num_classes)
        self.apply(init_weights)

    def forward(self, cls_NH: torch.Tensor) -> torch.Tensor:
        return self.out(self.drop(torch.tanh(self.pool(cls_NH))))


class MaskedLMHead(nn.Module):
    """Transform + decoder tied to the input embeddings, applied only to the rows it is given."""

    def __init__(self, hidden: int, tok_embedding: nn.Embedding):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.ln = nn.LayerNorm(hidden, eps=1e-12)
        self.bias = nn.Parameter(torch.zeros(tok_embedding.num_embeddings))
        self.apply(init_weights)
        self.tok_embedding = tok_embedding  # registered as a submodule, but its weight is the encoder's

    def transform(self, h_NH: torch.Tensor) -> torch.Tensor:
        """The rows as the decoder reads them (dense, GELU, LayerNorm): what a chunked loss decodes itself
        (`linear_cross_entropy`)."""
        return self.ln(F.gelu(self.dense(h_NH)))

    def forward(self, h_NH: torch.Tensor) -> torch.Tensor:
        return F.linear(self.transform(h_NH), self.tok_embedding.weight, self.bias)


class AlignModel(nn.Module):
    """Shared encoder + heads by objective name."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, objectives: dict | None = None):
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg, vocab_size)
        self.heads = nn.ModuleDict()
        for name, obj in (objectives or {}).items():
            self.heads[name] = obj.build_head(cfg, self.encoder)

    def head_state(self, name: str) -> dict[str, torch.Tensor]:
        """A head's own weights (the tied embedding excluded)."""
        return {k: v for k, v in self.heads[name].state_dict().items() if not k.startswith("tok_embedding.")}
