"""Export a pretrained model as a Hugging Face `transformers` folder (`alignlab export --model ID OUT_DIR`).

Three architectures, picked by `ModelConfig.norm` and `alibi`; all exact (hidden states equal alignlab's encoder's):

- **post-LN** (`norm="post"`, vanilla BERT) → `BertModel` (model_type "bert"). alignlab's encoder *is* BERT's
  (post-LN, exact-erf GELU, LayerNorm eps 1e-12, learned absolute positions, two token types), so the export
  is a renaming of tensors plus the one reshaping BERT needs: alignlab fuses q, k and v in one `qkv` projection
  whose output rows are ordered (q | k | v) x (head, head_dim), and BertModel keeps three.
- **pre-LN** (`norm="pre"`) → `RobertaPreLayerNormModel` (model_type "roberta-prelayernorm"), transformers'
  pre-LN BERT: the embeddings' LayerNorm (alignlab's `ln`), per layer `attention.LayerNorm` before
  self-attention (`ln1`) and `intermediate.LayerNorm` before the FFN (`ln2`), residuals without a norm, and the
  model's `LayerNorm` after the last layer (`final_ln`); same GELU, eps, q/k/v split and two token types. One
  difference is bridged in the weights: RoBERTa numbers positions from the input ids, counting the non-pad
  tokens from `pad_token_id + 1` (pad tokens get `pad_token_id`), where alignlab uses 0..T-1. The position
  table therefore has `max_len + pad_id + 1` rows: row `pad_id + 1 + t` is alignlab's position t, rows
  0..pad_id are zeros. A right-padded batch (the tokenizer's default) gives exactly alignlab's positions at
  every real token; `position_ids`, if passed by hand, are alignlab's plus `pad_id + 1`.

What the folder holds:

    config.json                  BertConfig (model_type "bert") or RobertaPreLayerNormConfig (model_type
                                 "roberta-prelayernorm"): sizes, vocab, max positions, eps, hidden_act "gelu"
    model.safetensors            the model's weights, named as transformers names them (pooler included)
    tokenizer.json, tokenizer_config.json, special_tokens_map.json
                                 a PreTrainedTokenizerFast converted from the sentencepiece model (offline, by
                                 transformers' own SpmConverter); `[CLS] A [SEP] B [SEP]` with token types 0/1
    alignlab_heads.safetensors   every objective's pretrained head ("<objective>.<param>"; the MLM decoder's
                                 tied embedding is the encoder's word embedding and is not repeated)
    alignlab_heads.json          what each head is: objective, config, module, input, classes, tensor shapes
    alignlab_export.json         where it came from: model id, pretraining config, the pooler's source; a pre-LN
                                 folder also names its "architecture" (a folder without that key is BertModel)

The pooler: BERT's pooler (dense + tanh on [CLS]) is the one its NSP head starts with. An objective whose head
carries BERT's pooler says so (`Objective.bert_pooler`, NSP's does), and its `pool` layer becomes the model's
pooler. A model pretrained without such an objective gets an identity pooler (weight I, bias 0), so
`pooler_output` is tanh of the [CLS] vector: a documented, deterministic choice rather than random weights
that would differ at every load (`alignlab_export.json` says which one a folder has). Both architectures
apply the pooler to the last hidden states (for pre-LN: after the final LayerNorm, as alignlab's heads see them).

- **a distance bias** (`alibi` > 0, the `mini` preset's, either norm) → `AlignlabEncoderModel`, transformers custom
  code: neither BERT nor RoBERTa-PreLayerNorm biases attention by distance, so the folder carries its own model
  file (`modeling_alignlab.py`, copied from platform/pretrain/hf/, torch and transformers only) named in config.json's
  `auto_map`. `AutoModel.from_pretrained(folder, trust_remote_code=True)` loads it without alignlab. Its tensor
  names are BertModel's (post-LN) or RobertaPreLayerNormModel's (pre-LN), positions alignlab's (0..T-1).

If the encoder has a tensor the target architecture lacks (or lacks one it has), exact export is impossible
and `export_model` refuses with a ValueError naming them. The folder is written under a temporary name and
renamed last.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import types
from pathlib import Path

import torch

from alignlab.platform.config import pretrain_from_dict, to_dict
from alignlab.platform.encoder.model_config import ModelConfig
from alignlab.platform.encoder.model import Encoder, AlignModel
from alignlab.platform.encoder.registry import objective_class
from alignlab.platform.encoder.tokenizer import CLS, MASK, PAD, SEP, UNK, Tokenizer
from alignlab.platform.storage.root import read_json, write_json, folder_finished

HEADS_FILE = "alignlab_heads.safetensors"
HEADS_JSON = "alignlab_heads.json"
EXPORT_JSON = "alignlab_export.json"

_LAYER_MAP = {
    "attn_out": "attention.output.dense",
    "ln1": "attention.output.LayerNorm",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
    "ln2": "output.LayerNorm",
}
# Pre-LN (RobertaPreLayerNormModel): ln1 sits before self-attention, ln2 before the FFN (in `intermediate`).
_PRE_LAYER_MAP = {
    "ln1": "attention.LayerNorm",
    "attn_out": "attention.output.dense",
    "ln2": "intermediate.LayerNorm",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
}
# The transformers class each `ModelConfig.norm` exports as, and the name refusals call it by.
ARCHITECTURES = {"post": "BertModel", "pre": "RobertaPreLayerNormModel"}
_ARCH_NAMES = {"post": "BERT", "pre": "RoBERTa-PreLayerNorm"}
# A distance-biased encoder (alibi > 0) exports as this custom-code model, whatever its norm.
CUSTOM_ARCHITECTURE = "AlignlabEncoderModel"
MODELING_FILE = Path(__file__).parent / "hf" / "modeling_alignlab.py"


def bert_config(cfg: ModelConfig, vocab_size: int, pad_id: int) -> dict:
    """The `BertConfig` of an alignlab encoder, as plain JSON."""
    return {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": vocab_size,
        "hidden_size": cfg.hidden,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.ffn,
        "hidden_act": "gelu",  # alignlab uses F.gelu, the exact erf form; HF's "gelu" is the same function
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.dropout,
        "max_position_embeddings": cfg.max_len,
        "type_vocab_size": 2,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-12,
        "pad_token_id": pad_id,
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
    }


def pre_layernorm_config(cfg: ModelConfig, vocab_size: int, pad_id: int, cls_id: int, sep_id: int) -> dict:
    """The `RobertaPreLayerNormConfig` of a pre-LN alignlab encoder, as plain JSON. RoBERTa's position ids start
    at pad_id + 1 (see the module docstring), so the table has pad_id + 1 rows more than alignlab's max_len."""
    return {
        "architectures": ["RobertaPreLayerNormModel"],
        "model_type": "roberta-prelayernorm",
        "vocab_size": vocab_size,
        "hidden_size": cfg.hidden,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.ffn,
        "hidden_act": "gelu",  # alignlab uses F.gelu, the exact erf form; HF's "gelu" is the same function
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.dropout,
        "max_position_embeddings": cfg.max_len + pad_id + 1,
        "type_vocab_size": 2,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-12,
        "pad_token_id": pad_id,
        "bos_token_id": cls_id,  # RoBERTa's <s> and </s> are what alignlab calls [CLS] and [SEP]
        "eos_token_id": sep_id,
        "torch_dtype": "float32",
    }


def alignlab_config(cfg: ModelConfig, vocab_size: int, pad_id: int | None) -> dict:
    """The config.json of a distance-biased encoder: `AlignlabEncoderConfig` (platform/pretrain/hf/modeling_alignlab.py),
    loaded through `auto_map` with trust_remote_code."""
    return {
        "architectures": [CUSTOM_ARCHITECTURE],
        "model_type": "alignlab-encoder",
        "auto_map": {"AutoConfig": "modeling_alignlab.AlignlabEncoderConfig",
                     "AutoModel": "modeling_alignlab.AlignlabEncoderModel"},
        "vocab_size": vocab_size,
        "hidden_size": cfg.hidden,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.ffn,
        "max_position_embeddings": cfg.max_len,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "norm": cfg.norm,
        "alibi_slopes": cfg.alibi_slopes(),
        "alibi_exempt_cls": cfg.alibi_exempt_cls,
        "initializer_range": 0.02,
        "pad_token_id": pad_id,
        "torch_dtype": "float32",
    }


def _check_encoder(cfg: ModelConfig, vocab_size: int, enc: dict[str, torch.Tensor]) -> None:
    """Refuse (ValueError) unless the encoder's tensors are exactly the ones the target architecture (BERT for
    post-LN, RoBERTa-PreLayerNorm for pre-LN) has, with its shapes and eps."""
    arch, name = ARCHITECTURES[cfg.norm], _ARCH_NAMES[cfg.norm]
    if cfg.alibi > 0:
        arch, name = CUSTOM_ARCHITECTURE, f"alignlab's {cfg.norm}-LN encoder"
    ref = Encoder(cfg, vocab_size)
    eps = {m.eps for m in ref.modules() if isinstance(m, torch.nn.LayerNorm)}
    if eps != {1e-12}:
        raise ValueError(f"cannot export exactly: alignlab's LayerNorm eps {sorted(eps)} is not one {name} value")
    want = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    have = {k: tuple(v.shape) for k, v in enc.items()}
    expected = {"tok.weight", "pos.weight", "seg.weight", "ln.weight", "ln.bias"}
    if cfg.norm == "pre":
        expected |= {"final_ln.weight", "final_ln.bias"}
    for i in range(cfg.num_layers):
        for part in ("qkv", *(_PRE_LAYER_MAP if cfg.norm == "pre" else _LAYER_MAP)):
            expected |= {f"layers.{i}.{part}.weight", f"layers.{i}.{part}.bias"}
    extra, missing = sorted(set(have) - expected), sorted(expected - set(have))
    if extra or missing or set(want) != expected:
        raise ValueError(f"cannot export exactly as a transformers {arch}: the encoder's tensors differ from "
                         f"{name}'s (not in {name}: {extra or sorted(set(want) - expected)}; missing: {missing})")
    bad = {k: (have[k], want[k]) for k in expected if have[k] != want[k]}
    if bad:
        raise ValueError(f"cannot export: tensor shapes differ from the model config: {bad}")


def _hf_state_dict(cfg: ModelConfig, enc: dict[str, torch.Tensor], layer_map: dict[str, str],
                   pos: torch.Tensor) -> dict[str, torch.Tensor]:
    """alignlab encoder tensors (keys without "encoder.") → a transformers encoder's names, one per `layer_map`;
    q, k, v split from `qkv`; `pos` is the position table as the target numbers positions."""
    out = {
        "embeddings.word_embeddings.weight": enc["tok.weight"],
        "embeddings.position_embeddings.weight": pos,
        "embeddings.token_type_embeddings.weight": enc["seg.weight"],
        "embeddings.LayerNorm.weight": enc["ln.weight"],
        "embeddings.LayerNorm.bias": enc["ln.bias"],
    }
    for i in range(cfg.num_layers):
        p, q = f"layers.{i}.", f"encoder.layer.{i}."
        # qkv's output features are laid out (3, heads, head_dim): the first `hidden` rows are q, then k, then v.
        for part, w, b in zip(("query", "key", "value"), enc[p + "qkv.weight"].chunk(3, 0), enc[p + "qkv.bias"].chunk(3, 0)):
            out[f"{q}attention.self.{part}.weight"], out[f"{q}attention.self.{part}.bias"] = w, b
        for src, dst in layer_map.items():
            out[f"{q}{dst}.weight"], out[f"{q}{dst}.bias"] = enc[p + src + ".weight"], enc[p + src + ".bias"]
    return out


def _fp32(out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to(torch.float32).contiguous().clone() for k, v in out.items()}


def bert_state_dict(cfg: ModelConfig, enc: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """alignlab encoder tensors (keys without "encoder.") → BertModel's names; q, k, v split from `qkv`."""
    return _fp32(_hf_state_dict(cfg, enc, _LAYER_MAP, enc["pos.weight"]))


def alignlab_state_dict(cfg: ModelConfig, enc: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """alignlab encoder tensors → AlignlabEncoderModel's names: BertModel's for post-LN, RobertaPreLayerNormModel's
    for pre-LN, with alignlab's own position table (positions 0..T-1)."""
    pre = cfg.norm == "pre"
    out = _hf_state_dict(cfg, enc, _PRE_LAYER_MAP if pre else _LAYER_MAP, enc["pos.weight"])
    if pre:
        out["LayerNorm.weight"], out["LayerNorm.bias"] = enc["final_ln.weight"], enc["final_ln.bias"]
    return _fp32(out)


def pre_layernorm_state_dict(cfg: ModelConfig, enc: dict[str, torch.Tensor], pad_id: int) -> dict[str, torch.Tensor]:
    """alignlab pre-LN encoder tensors (keys without "encoder.") → RobertaPreLayerNormModel's names; q, k, v split
    from `qkv`; the position table shifted by pad_id + 1 rows (zeros) to RoBERTa's position numbering."""
    pos = enc["pos.weight"]
    out = _hf_state_dict(cfg, enc, _PRE_LAYER_MAP, torch.cat([pos.new_zeros(pad_id + 1, pos.shape[1]), pos]))
    out["LayerNorm.weight"], out["LayerNorm.bias"] = enc["final_ln.weight"], enc["final_ln.bias"]
    return _fp32(out)


def hf_tokenizer(model_path: str | Path, max_len: int):
    """A `PreTrainedTokenizerFast` converted offline from the sentencepiece model by transformers' SpmConverter
    (unigram pieces and scores, the model's own precompiled normalizer -- case folding included -- and
    Metaspace pre-tokenization), with BERT's `[CLS] A [SEP] B [SEP]` template and token types 0/1."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import SpmConverter

    tok = Tokenizer(model_path)
    # SpmConverter only reads `vocab_file` (and the prefix-space flags) from the "slow" tokenizer it is given.
    fast = SpmConverter(types.SimpleNamespace(vocab_file=str(model_path), add_prefix_space=True, legacy=False)).converted()
    fast.post_processor = processors.TemplateProcessing(
        single=f"{CLS} $A {SEP}", pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
        special_tokens=[(CLS, tok.cls_id), (SEP, tok.sep_id)])
    return PreTrainedTokenizerFast(tokenizer_object=fast, cls_token=CLS, sep_token=SEP, pad_token=PAD, unk_token=UNK,
                                   mask_token=MASK, model_max_length=max_len,
                                   model_input_names=["input_ids", "token_type_ids", "attention_mask"])


def _head_info(name: str, state: dict[str, torch.Tensor], module: str, config: dict, num_classes: int | None) -> dict:
    kind = {"TokenHead": "per token", "SequenceHead": "[CLS] vector", "MaskedLMHead": "masked positions"}
    return {"objective": name, "module": f"alignlab.platform.encoder.model.{module}" if module else None,
            "input": kind.get(module, "see module"),
            "num_classes": num_classes,
            "config": config, "tensors": {k: list(v.shape) for k, v in state.items()},
            **({"tied": {"tok_embedding.weight": "embeddings.word_embeddings.weight"}} if module == "MaskedLMHead" else {})}


def export_model(mdir: str | Path, out_dir: str | Path) -> Path:
    """Write the HF folder of the finished model at `mdir` (a `<root>/models/<id>` folder) to `out_dir`:
    a BertModel for a post-LN encoder, a RobertaPreLayerNormModel for a pre-LN one, an AlignlabEncoderModel (custom
    code) for one with a distance bias."""
    mdir, out_dir = Path(mdir), Path(out_dir)
    final = mdir / "final"

    if not folder_finished(final, legacy="model.pt", announce="eval.json"):
        raise ValueError(f"{mdir}: not a finished pretrained model (final/ missing or incomplete)")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ValueError(f"{out_dir}: exists and is not empty; choose a new folder")
    info = read_json(final / "model_config.json")
    cfg = ModelConfig(**info["model"])
    try:
        from safetensors.torch import save_file
        import transformers  # noqa: F401
    except ImportError as e:
        raise ValueError(f"export needs transformers and safetensors ({e}); install them with "
                         "pip install -e \".[bench]\"") from e
    vocab = int(info["vocab_size"])
    state = torch.load(final / "model.pt", map_location="cpu", weights_only=True)
    enc = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
    _check_encoder(cfg, vocab, enc)
    pre = pretrain_from_dict(info["pretrain"])
    objectives = {c.name: c for c in pre.objectives}
    tok = Tokenizer(final / "tokenizer.model")
    if tok.vocab_size != vocab:
        raise ValueError(f"{final}: tokenizer has {tok.vocab_size} pieces but the model {vocab}")
    pre_ln, custom = cfg.norm == "pre", cfg.alibi > 0
    if pre_ln and not custom and tok.pad_id < 0:
        raise ValueError("cannot export exactly as a transformers RobertaPreLayerNormModel: its position ids count "
                         "from the pad id, and the tokenizer has none")

    if custom:
        weights = alignlab_state_dict(cfg, enc)
    else:
        weights = pre_layernorm_state_dict(cfg, enc, tok.pad_id) if pre_ln else bert_state_dict(cfg, enc)
    pooler_from = None
    for name in info["heads"]:
        if name in objectives and getattr(objective_class(objectives[name]), "bert_pooler", False):
            pooler_from = name
            weights["pooler.dense.weight"] = state[f"heads.{name}.pool.weight"].float().clone()
            weights["pooler.dense.bias"] = state[f"heads.{name}.pool.bias"].float().clone()
            break
    if pooler_from is None:
        weights["pooler.dense.weight"] = torch.eye(cfg.hidden)
        weights["pooler.dense.bias"] = torch.zeros(cfg.hidden)

    # Head modules by name, to describe each head (a throwaway model built with the objectives' own verbs).
    built = {n: c.build(tok) for n, c in objectives.items() if n in info["heads"]}
    modules = {n: type(m).__name__ for n, m in AlignModel(cfg, vocab, built).heads.items()}
    heads, heads_info = {}, {}
    for name in info["heads"]:
        prefix = f"heads.{name}."
        hs = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        hs = {k: v for k, v in hs.items() if not k.startswith("tok_embedding.")}  # tied: the word embedding
        try:
            num_classes = int(built[name].num_classes) if name in built else None
        except NotImplementedError:
            num_classes = None
        heads.update({f"{name}.{k}": v.float().contiguous().clone() for k, v in hs.items()})
        heads_info[name] = _head_info(name, hs, modules.get(name, ""),
                                      to_dict(objectives[name]) if name in objectives else {}, num_classes)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        if custom:
            # The custom model numbers positions itself, so the pad id is only metadata: None when there is none.
            hf_cfg = alignlab_config(cfg, vocab, tok.pad_id if tok.pad_id >= 0 else None)
            shutil.copy(MODELING_FILE, tmp / MODELING_FILE.name)
        else:
            hf_cfg = (pre_layernorm_config(cfg, vocab, tok.pad_id, tok.cls_id, tok.sep_id) if pre_ln else
                      bert_config(cfg, vocab, tok.pad_id))
        (tmp / "config.json").write_text(json.dumps(hf_cfg, indent=2, sort_keys=True) + "\n")
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        hf_tokenizer(final / "tokenizer.model", cfg.max_len).save_pretrained(str(tmp))
        shutil.copy(final / "tokenizer.model", tmp / "spiece.model")
        if heads:
            save_file(heads, str(tmp / HEADS_FILE), metadata={"format": "pt"})
        write_json(tmp / HEADS_JSON, {"heads": heads_info, "tensors_file": HEADS_FILE if heads else None,
                                      "key_format": "<objective>.<parameter of the head module>"})
        note = "hidden states equal alignlab's encoder's (fp32, eval mode); token ids equal alignlab's tokenizer's"
        # The BERT folder's file is as it always was (no "architecture" key: a folder without one is BertModel).
        arch = {"architecture": ARCHITECTURES[cfg.norm], "norm": cfg.norm} if pre_ln else {}
        if custom:
            arch = {"architecture": CUSTOM_ARCHITECTURE, "norm": cfg.norm, "alibi": cfg.alibi,
                    "alibi_exempt_cls": cfg.alibi_exempt_cls,
                    "load": "transformers.AutoModel.from_pretrained(folder, trust_remote_code=True), and AutoTokenizer "
                            "with the same flag"}
            note += ("; custom code (modeling_alignlab.py): attention scores minus alibi_slopes[h] * |i - j|"
                     + (" (0 where i or j is [CLS], position 0)" if cfg.alibi_exempt_cls else "") + ", "
                     "positions 0..T-1 as alignlab's")
        elif pre_ln:
            note += (f"; positions as RoBERTa numbers them: non-pad tokens from pad_id + 1 = {tok.pad_id + 1}, so a "
                     "right-padded batch gives alignlab's positions 0..T-1 (explicit position_ids: alignlab's + "
                     f"{tok.pad_id + 1})")
        write_json(tmp / EXPORT_JSON, {
            "model_id": mdir.name, **arch, "pretrain": info["pretrain"],
            "pooler": (f"the pooler of the {pooler_from!r} head" if pooler_from else
                       "identity (weight I, bias 0): no objective of this model has BERT's pooler"),
            "pooler_from": pooler_from,
            "note": note})
        if out_dir.exists():
            out_dir.rmdir()  # empty (checked above)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
