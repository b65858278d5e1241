"""alignlab's encoder as a Hugging Face `transformers` model, for the encoders neither BERT nor RoBERTa-PreLayerNorm
can hold: those with a distance bias on attention (`ModelConfig.alibi` > 0, the `mini` preset's).

`alignlab export` copies this file into the exported folder as `modeling_alignlab.py` and names it in
config.json's `auto_map`, so the folder loads without alignlab installed:

    model = transformers.AutoModel.from_pretrained(folder, trust_remote_code=True)

It imports torch and transformers only (a test checks that). The architecture is alignlab's `Encoder`
(platform/encoder/model.py), written out again:

- embeddings: word + learned (or stored sinusoidal) absolute position 0..T-1 + token type, then LayerNorm;
- per layer, post-LN (`norm="post"`, BERT's order) or pre-LN (`norm="pre"`, a final LayerNorm after the last
  layer); exact-erf GELU; LayerNorm eps from the config;
- attention scores q.k / sqrt(head_dim) minus `alibi_slopes[h] * |i - j|` (the symmetric ALiBi of
  `ModelConfig.alibi`), with no bias on [CLS]'s row and column when `alibi_exempt_cls` (the model's own
  `ModelConfig.alibi_exempt_cls`), padding keys masked out, softmax in fp32;
- `pooler_output` = tanh(dense([CLS] of the last hidden states)), as BERT's.

Tensor names follow BertModel's (post-LN) and RobertaPreLayerNormModel's (pre-LN), so a reader who knows those
finds every weight where they expect it. Position ids are alignlab's (0..T-1, no RoBERTa offset).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPooling


class AlignlabEncoderConfig(PretrainedConfig):
    model_type = "alignlab-encoder"

    def __init__(self, vocab_size: int = 8000, hidden_size: int = 128, num_hidden_layers: int = 2,
                 num_attention_heads: int = 2, intermediate_size: int = 512, max_position_embeddings: int = 128,
                 type_vocab_size: int = 2, layer_norm_eps: float = 1e-12, norm: str = "pre",
                 alibi_slopes: list[float] | None = None, initializer_range: float = 0.02, pad_token_id: int | None = 0,
                 alibi_exempt_cls: bool = False, **kwargs):
        if norm not in ("post", "pre"):
            raise ValueError(f"norm must be 'post' or 'pre', got {norm!r}")
        slopes = list(alibi_slopes) if alibi_slopes is not None else [0.0] * num_attention_heads
        if len(slopes) != num_attention_heads:
            raise ValueError(f"alibi_slopes has {len(slopes)} entries for {num_attention_heads} heads")
        self.vocab_size, self.hidden_size, self.num_hidden_layers = vocab_size, hidden_size, num_hidden_layers
        self.num_attention_heads, self.intermediate_size = num_attention_heads, intermediate_size
        self.max_position_embeddings, self.type_vocab_size = max_position_embeddings, type_vocab_size
        self.layer_norm_eps, self.norm, self.alibi_slopes = layer_norm_eps, norm, slopes
        self.initializer_range, self.alibi_exempt_cls = initializer_range, bool(alibi_exempt_cls)
        super().__init__(pad_token_id=pad_token_id, **kwargs)


def _container(**children: nn.Module) -> nn.Module:
    m = nn.Module()
    for name, child in children.items():
        m.add_module(name, child)
    return m


class AlignlabLayer(nn.Module):
    """One encoder block. Post-LN: attention.output.LayerNorm after attention, output.LayerNorm after the FFN
    (BertLayer's names). Pre-LN: attention.LayerNorm before attention, intermediate.LayerNorm before the FFN
    (RobertaPreLayerNormLayer's names)."""

    def __init__(self, cfg: AlignlabEncoderConfig):
        super().__init__()
        H, eps = cfg.hidden_size, cfg.layer_norm_eps
        self.pre_ln, self.heads = cfg.norm == "pre", cfg.num_attention_heads
        self.head_dim = H // self.heads
        self_attn = _container(query=nn.Linear(H, H), key=nn.Linear(H, H), value=nn.Linear(H, H))
        if self.pre_ln:
            self.attention = _container(self=self_attn, output=_container(dense=nn.Linear(H, H)),
                                        LayerNorm=nn.LayerNorm(H, eps=eps))
            self.intermediate = _container(dense=nn.Linear(H, cfg.intermediate_size), LayerNorm=nn.LayerNorm(H, eps=eps))
            self.output = _container(dense=nn.Linear(cfg.intermediate_size, H))
        else:
            self.attention = _container(self=self_attn, output=_container(dense=nn.Linear(H, H),
                                                                          LayerNorm=nn.LayerNorm(H, eps=eps)))
            self.intermediate = _container(dense=nn.Linear(H, cfg.intermediate_size))
            self.output = _container(dense=nn.Linear(cfg.intermediate_size, H), LayerNorm=nn.LayerNorm(H, eps=eps))

    def attend(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        B, T, H = x.shape
        sa = self.attention.self

        def split(lin: nn.Linear) -> torch.Tensor:
            return lin(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = split(sa.query), split(sa.key), split(sa.value)
        s = torch.matmul(q * self.head_dim ** -0.5, k.transpose(-1, -2)).float() + bias
        a = torch.matmul(torch.softmax(s, -1).to(v.dtype), v)
        return self.attention.output.dense(a.transpose(1, 2).reshape(B, T, H))

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        if self.pre_ln:
            x = x + self.attend(self.attention.LayerNorm(x), bias)
            return x + self.output.dense(F.gelu(self.intermediate.dense(self.intermediate.LayerNorm(x))))
        x = self.attention.output.LayerNorm(x + self.attend(x, bias))
        return self.output.LayerNorm(x + self.output.dense(F.gelu(self.intermediate.dense(x))))


class AlignlabEncoderPreTrainedModel(PreTrainedModel):
    config_class = AlignlabEncoderConfig
    base_model_prefix = "alignlab"

    def _init_weights(self, module: nn.Module) -> None:
        # BERT's init (alignlab's "bert" init); loading a folder overwrites every weight.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(0.0, self.config.initializer_range)
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, nn.LayerNorm):
            module.weight.data.fill_(1.0)
            module.bias.data.zero_()


class AlignlabEncoderModel(AlignlabEncoderPreTrainedModel):
    def __init__(self, config: AlignlabEncoderConfig):
        super().__init__(config)
        H = config.hidden_size
        self.embeddings = _container(word_embeddings=nn.Embedding(config.vocab_size, H),
                                     position_embeddings=nn.Embedding(config.max_position_embeddings, H),
                                     token_type_embeddings=nn.Embedding(config.type_vocab_size, H),
                                     LayerNorm=nn.LayerNorm(H, eps=config.layer_norm_eps))
        self.encoder = _container(layer=nn.ModuleList(AlignlabLayer(config) for _ in range(config.num_hidden_layers)))
        if config.norm == "pre":
            self.LayerNorm = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.pooler = _container(dense=nn.Linear(H, H))
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    def distance_bias(self, T: int, device: torch.device, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """-slope_h * |i - j| as [1 or B, heads, T, T] in fp32 (0 on [CLS]'s row and column when
        `alibi_exempt_cls`), -inf at padding keys."""
        slopes = torch.tensor(self.config.alibi_slopes, dtype=torch.float32, device=device)
        pos = torch.arange(T, device=device)
        dist = (pos[None, :] - pos[:, None]).abs().float()
        if self.config.alibi_exempt_cls:
            dist[0, :] = 0.0
            dist[:, 0] = 0.0
        bias = (-slopes[:, None, None] * dist)[None]
        if attention_mask is not None:
            bias = bias.masked_fill(~attention_mask.bool()[:, None, None, :], float("-inf"))
        return bias

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, output_hidden_states: bool | None = None,
                return_dict: bool | None = None, **kwargs) -> BaseModelOutputWithPooling | tuple:
        B, T = input_ids.shape
        if T > self.config.max_position_embeddings:
            raise ValueError(f"input of {T} tokens is longer than max_position_embeddings "
                             f"({self.config.max_position_embeddings})")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        emb = self.embeddings
        pos = torch.arange(T, device=input_ids.device)
        x = emb.LayerNorm(emb.word_embeddings(input_ids) + emb.position_embeddings(pos)[None]
                          + emb.token_type_embeddings(token_type_ids))
        bias = self.distance_bias(T, input_ids.device, attention_mask)
        states = [x]
        for layer in self.encoder.layer:
            x = layer(x, bias)
            states.append(x)
        if self.config.norm == "pre":
            x = self.LayerNorm(x)
            states[-1] = x
        pooled = torch.tanh(self.pooler.dense(x[:, 0]))
        hidden = tuple(states) if output_hidden_states else None
        if return_dict is False:
            return (x, pooled) + ((hidden,) if hidden is not None else ())
        return BaseModelOutputWithPooling(last_hidden_state=x, pooler_output=pooled, hidden_states=hidden)

