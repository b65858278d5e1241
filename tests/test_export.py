"""`alignlab export`: a pretrained model as a transformers BertModel folder (post-LN) or RobertaPreLayerNormModel
folder (pre-LN), equal to alignlab's encoder."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="export needs transformers: pip install -e '.[bench]'")

from tiny_model import real_texts, tiny_pretrained  # noqa: E402

from alignlab.platform.cli import main  # noqa: E402
from alignlab.platform.encoder.model import Encoder  # noqa: E402
from alignlab.platform.fel.finetune import load_pretrained  # noqa: E402


def _encoder(mdir):
    pre = load_pretrained(mdir)
    enc = Encoder(pre.model_cfg, pre.vocab_size)
    enc.load_state_dict({k[len("encoder."):]: v for k, v in pre.state.items() if k.startswith("encoder.")})
    return enc.eval(), pre


def _assert_the_pooler_is_nsps(pooler_output, ref, pre):
    """`pooler_output` is NSP's pooler (dense + tanh) on the [CLS] vector of alignlab's last hidden states `ref`."""
    pooled = torch.tanh(torch.nn.functional.linear(ref[:, 0], pre.state["heads.nsp.pool.weight"],
                                                   pre.state["heads.nsp.pool.bias"]))
    torch.testing.assert_close(pooler_output, pooled, rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    mdir = tiny_pretrained(root, "mlm,nsp,whp,pad", steps=3)
    out = tmp_path_factory.mktemp("hf") / "bert"
    assert main(["export", "--model", mdir.name, str(out), "--storage", str(root)]) == 0
    return mdir, out


def test_the_exported_bert_gives_alignlabs_hidden_states_and_token_ids_on_real_text(exported):
    mdir, out = exported
    enc, pre = _encoder(mdir)
    bert = transformers.BertModel.from_pretrained(str(out)).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(out))
    texts = real_texts()[100:116]
    pairs = list(zip(texts[::2], texts[1::2]))
    # The tokenizer: alignlab's word-wise sentencepiece ids, with [CLS] A [SEP] B [SEP] and token types 0/1.
    rows = []
    for a, b in pairs:
        a_ids = [p for w in pre.tok.encode_words(a.split()) for p in w]
        b_ids = [p for w in pre.tok.encode_words(b.split()) for p in w]
        rows.append(([pre.tok.cls_id, *a_ids, pre.tok.sep_id, *b_ids, pre.tok.sep_id],
                     [0] * (len(a_ids) + 2) + [1] * (len(b_ids) + 1)))
    got = hf_tok([a for a, _ in pairs], [b for _, b in pairs])
    assert got["input_ids"] == [r[0] for r in rows]
    assert got["token_type_ids"] == [r[1] for r in rows]
    assert hf_tok(texts[0])["input_ids"] == [pre.tok.cls_id, *[p for w in pre.tok.encode_words(texts[0].split())
                                                                for p in w], pre.tok.sep_id]
    # Hidden states on a padded batch of those pairs, compared at the real tokens.
    batch = hf_tok([a for a, _ in pairs], [b for _, b in pairs], padding=True, truncation=True, return_tensors="pt")
    assert batch["input_ids"].shape[1] <= pre.model_cfg.max_len
    with torch.no_grad():
        ref = enc(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"].bool())
        hf = bert(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    assert bool((~real).any()), "the batch should include padding"
    torch.testing.assert_close(hf[real], ref[real], rtol=0, atol=1e-5)
    # The pooler is NSP's (dense + tanh on [CLS]).
    with torch.no_grad():
        pooled = torch.tanh(torch.nn.functional.linear(ref[:, 0], pre.state["heads.nsp.pool.weight"],
                                                       pre.state["heads.nsp.pool.bias"]))
        torch.testing.assert_close(bert(**batch).pooler_output, pooled, rtol=0, atol=1e-5)


def test_the_config_and_the_aligned_heads_are_written_beside_the_weights(exported):
    from safetensors.torch import load_file

    mdir, out = exported
    pre = load_pretrained(mdir)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "bert" and cfg["hidden_act"] == "gelu" and cfg["layer_norm_eps"] == 1e-12
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"], cfg["max_position_embeddings"]) == \
        (pre.model_cfg.hidden, pre.model_cfg.num_layers, pre.vocab_size, pre.model_cfg.max_len)
    info = json.loads((out / "alignlab_heads.json").read_text())["heads"]
    assert set(info) == {"mlm", "nsp", "whp", "pad"}
    assert info["whp"]["num_classes"] == 4 and info["pad"]["num_classes"] == 2 and info["nsp"]["num_classes"] == 2
    assert info["mlm"]["num_classes"] == pre.vocab_size and info["mlm"]["tied"]
    heads = load_file(str(out / "alignlab_heads.safetensors"))
    assert torch.equal(heads["pad.out.weight"], pre.state["heads.pad.out.weight"])
    assert torch.equal(heads["whp.out.bias"], pre.state["heads.whp.out.bias"])
    assert not any(k.startswith("mlm.tok_embedding") for k in heads)
    export_info = json.loads((out / "alignlab_export.json").read_text())
    assert export_info["pooler_from"] == "nsp"
    assert "architecture" not in export_info  # the BERT folder is as before: no key means BertModel
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")], "the temp folder was renamed"


def test_without_nsp_the_pooler_is_the_documented_identity_and_a_used_folder_is_refused(tmp_path):
    mdir = tiny_pretrained(tmp_path, "mlm,whp", steps=1)
    out = tmp_path / "bert"
    main(["export", "--model", mdir.name, str(out), "--storage", str(tmp_path)])
    bert = transformers.BertModel.from_pretrained(str(out))
    assert torch.equal(bert.pooler.dense.weight, torch.eye(bert.config.hidden_size))
    assert "identity" in json.loads((out / "alignlab_export.json").read_text())["pooler"]
    assert main(["export", "--model", mdir.name, str(out), "--storage", str(tmp_path)]) == 2  # not empty
    assert main(["export", "--model", "no-such-model", str(tmp_path / "x"), "--storage", str(tmp_path)]) == 2


def test_an_encoder_with_a_tensor_bert_lacks_is_refused(tmp_path):
    from alignlab.platform.pretrain import export

    mdir = tiny_pretrained(tmp_path, "mlm", steps=1)
    sd = torch.load(mdir / "final" / "model.pt", weights_only=True)
    sd["encoder.layers.0.extra_gate.weight"] = torch.zeros(2)
    torch.save(sd, mdir / "final" / "model.pt")
    from alignlab.platform.storage.root import write_marker

    write_marker(mdir / "final")  # a whole model (its marker matches), but one with a tensor BERT lacks
    with pytest.raises(ValueError, match="cannot export exactly.*extra_gate"):
        export.export_model(mdir, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# Pre-LN: exported as transformers' RobertaPreLayerNormModel.

def _pre_ln_model():
    from alignlab.platform.config import MODEL_SIZES

    return dataclasses.replace(MODEL_SIZES["tiny"], norm="pre", num_layers=2)


@pytest.fixture(scope="module")
def exported_pre(tmp_path_factory):
    root = tmp_path_factory.mktemp("root_pre")
    mdir = tiny_pretrained(root, "mlm,nsp,whp,pad", steps=3, model=_pre_ln_model())
    # A few steps barely move the LayerNorms from (1, 0); move them far apart, so that a LayerNorm mapped to the
    # wrong place (ln1/ln2, embeddings/final) changes the hidden states well beyond the tolerance.
    sd = torch.load(mdir / "final" / "model.pt", weights_only=True)
    gen = torch.Generator().manual_seed(0)
    lns = [k for k in sd if k.startswith("encoder.") and k.split(".")[-2] in ("ln", "ln1", "ln2", "final_ln")]
    assert len(lns) == 2 * (2 + 2 * 2)
    for k in lns:
        sd[k] = sd[k] + 0.3 * torch.randn(sd[k].shape, generator=gen)
    torch.save(sd, mdir / "final" / "model.pt")
    out = tmp_path_factory.mktemp("hf_pre") / "prelayernorm"
    assert main(["export", "--model", mdir.name, str(out), "--storage", str(root)]) == 0
    return mdir, out


def test_the_exported_pre_ln_model_gives_alignlabs_hidden_states_on_a_padded_batch_with_token_types(exported_pre):
    mdir, out = exported_pre
    enc, pre = _encoder(mdir)
    assert pre.model_cfg.norm == "pre" and enc.final_ln is not None
    model, loading = transformers.AutoModel.from_pretrained(str(out), output_loading_info=True)
    model.eval()
    assert type(model).__name__ == "RobertaPreLayerNormModel"
    assert not loading["missing_keys"] and not loading["unexpected_keys"], loading
    assert torch.equal(model.embeddings.word_embeddings.weight, enc.tok.weight)  # the pad row too: nothing zeroed
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(out))
    texts = real_texts()[100:116]
    pairs = list(zip(texts[::2], texts[1::2]))
    pairs.append((" ".join(texts[:6]), " ".join(texts[6:12])))  # truncated to max_len: the last position row
    batch = hf_tok([a for a, _ in pairs], [b for _, b in pairs], padding=True, truncation=True, return_tensors="pt")
    real = batch["attention_mask"].bool()
    assert batch["input_ids"].shape[1] == pre.model_cfg.max_len and bool(real[-1].all())
    assert bool((~real).any()), "the batch should include padding"
    assert set(batch["token_type_ids"][real].tolist()) == {0, 1}
    with torch.no_grad():
        ref = enc(batch["input_ids"], batch["token_type_ids"], real)
        got = model(**batch)
    torch.testing.assert_close(got.last_hidden_state[real], ref[real], rtol=0, atol=1e-5)
    # The pooler is NSP's, on the final LayerNorm's output, as alignlab's NSP head sees it.
    _assert_the_pooler_is_nsps(got.pooler_output, ref, pre)


def test_the_pre_ln_config_names_its_architecture_and_shifts_the_positions_past_the_pad_id(exported_pre):
    mdir, out = exported_pre
    pre = load_pretrained(mdir)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "roberta-prelayernorm" and cfg["architectures"] == ["RobertaPreLayerNormModel"]
    assert cfg["hidden_act"] == "gelu" and cfg["layer_norm_eps"] == 1e-12 and cfg["type_vocab_size"] == 2
    assert cfg["pad_token_id"] == pre.tok.pad_id
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"], cfg["max_position_embeddings"]) == \
        (pre.model_cfg.hidden, pre.model_cfg.num_layers, pre.vocab_size, pre.model_cfg.max_len + pre.tok.pad_id + 1)
    from safetensors.torch import load_file

    weights = load_file(str(out / "model.safetensors"))
    shift = pre.tok.pad_id + 1
    assert torch.equal(weights["embeddings.position_embeddings.weight"][shift:], pre.state["encoder.pos.weight"])
    assert not weights["embeddings.position_embeddings.weight"][:shift].any()
    assert torch.equal(weights["LayerNorm.weight"], pre.state["encoder.final_ln.weight"])
    export_info = json.loads((out / "alignlab_export.json").read_text())
    assert export_info["architecture"] == "RobertaPreLayerNormModel" and export_info["pooler_from"] == "nsp"
    assert set(json.loads((out / "alignlab_heads.json").read_text())["heads"]) == {"mlm", "nsp", "whp", "pad"}
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")], "the temp folder was renamed"


def test_a_pre_ln_encoder_without_its_final_layernorm_is_refused(tmp_path):
    from alignlab.platform.pretrain import export

    mdir = tiny_pretrained(tmp_path, "mlm", steps=1, model=_pre_ln_model())
    sd = torch.load(mdir / "final" / "model.pt", weights_only=True)
    del sd["encoder.final_ln.weight"], sd["encoder.final_ln.bias"]
    torch.save(sd, mdir / "final" / "model.pt")
    from alignlab.platform.storage.root import write_marker

    write_marker(mdir / "final")  # a whole model (its marker matches), but one without the final LayerNorm
    with pytest.raises(ValueError, match="cannot export exactly as a transformers RobertaPreLayerNormModel.*final_ln"):
        export.export_model(mdir, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# A distance bias (alibi > 0, the mini preset's): exported as custom code, AlignlabEncoderModel.

# The pre-LN case exempts [CLS] from the bias, as the mini preset does.
@pytest.fixture(scope="module", params=[("post", "learned", False), ("pre", "sinusoidal", True)],
                ids=["post_ln", "pre_ln_cls_exempt"])
def exported_alibi(request, tmp_path_factory):
    from alignlab.platform.config import MODEL_SIZES

    norm, position, exempt = request.param
    model = dataclasses.replace(MODEL_SIZES["tiny"], norm=norm, position=position, alibi=4.0, dropout=0.0,
                                num_layers=2, alibi_exempt_cls=exempt)
    root = tmp_path_factory.mktemp(f"root_alibi_{norm}")
    mdir = tiny_pretrained(root, "mlm,nsp,whp,pad", steps=3, model=model)
    # Move the LayerNorms far from (1, 0), as for the pre-LN export above: one mapped to the wrong place shows.
    sd = torch.load(mdir / "final" / "model.pt", weights_only=True)
    gen = torch.Generator().manual_seed(1)
    for k in [k for k in sd if k.startswith("encoder.") and k.split(".")[-2] in ("ln", "ln1", "ln2", "final_ln")]:
        sd[k] = sd[k] + 0.3 * torch.randn(sd[k].shape, generator=gen)
    torch.save(sd, mdir / "final" / "model.pt")
    out = tmp_path_factory.mktemp(f"hf_alibi_{norm}") / "alignlab"
    assert main(["export", "--model", mdir.name, str(out), "--storage", str(root)]) == 0
    return mdir, out


def test_a_distance_biased_model_exports_as_custom_code_that_gives_alignlabs_hidden_states(exported_alibi):
    mdir, out = exported_alibi
    enc, pre = _encoder(mdir)
    assert pre.model_cfg.alibi == 4.0
    model, loading = transformers.AutoModel.from_pretrained(str(out), trust_remote_code=True,
                                                            output_loading_info=True)
    model.eval()
    assert type(model).__name__ == "AlignlabEncoderModel"
    assert not loading["missing_keys"] and not loading["unexpected_keys"], loading
    # AutoTokenizer reads config.json, whose AutoConfig is the custom code: it takes the same flag.
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(out), trust_remote_code=True)
    texts = real_texts()[100:116]
    pairs = list(zip(texts[::2], texts[1::2]))
    pairs.append((" ".join(texts[:6]), " ".join(texts[6:12])))  # truncated to max_len: every position row
    batch = hf_tok([a for a, _ in pairs], [b for _, b in pairs], padding=True, truncation=True, return_tensors="pt")
    real = batch["attention_mask"].bool()
    assert batch["input_ids"].shape[1] == pre.model_cfg.max_len and bool((~real).any())
    with torch.no_grad():
        ref = enc(batch["input_ids"], batch["token_type_ids"], real)
        ref_all = enc(batch["input_ids"], batch["token_type_ids"], real, layers="all")
        got = model(**batch, output_hidden_states=True)
        # Without the bias the same weights give other states: the comparison can see a missing or wrong bias.
        biased = enc.cfg
        enc.cfg = dataclasses.replace(biased, alibi=0.0)
        assert float((enc(batch["input_ids"], batch["token_type_ids"], real)[real] - ref[real]).abs().max()) > 1e-2
        # [CLS]'s exemption shows too: flipped, [CLS]'s states change.
        enc.cfg = dataclasses.replace(biased, alibi_exempt_cls=not biased.alibi_exempt_cls)
        assert float((enc(batch["input_ids"], batch["token_type_ids"], real)[:, 0] - ref[:, 0]).abs().max()) > 1e-2
        enc.cfg = biased
    torch.testing.assert_close(got.last_hidden_state[real], ref[real], rtol=0, atol=1e-5)
    # Every layer's output, as the `all` head input reads them (layer-normalised without weights, the last as is).
    H = pre.model_cfg.hidden
    assert len(got.hidden_states) == pre.model_cfg.num_layers + 1
    hf_all = torch.cat([torch.nn.functional.layer_norm(s, (H,)) for s in got.hidden_states[:-1]]
                       + [got.hidden_states[-1]], -1)
    torch.testing.assert_close(hf_all[real], ref_all[real], rtol=0, atol=1e-4)
    _assert_the_pooler_is_nsps(got.pooler_output, ref, pre)


def test_the_custom_code_folder_names_its_bias_and_needs_nothing_of_alignlab_to_load(exported_alibi):
    import ast

    mdir, out = exported_alibi
    pre = load_pretrained(mdir)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "alignlab-encoder" and cfg["architectures"] == ["AlignlabEncoderModel"]
    assert cfg["auto_map"]["AutoModel"] == "modeling_alignlab.AlignlabEncoderModel"
    assert cfg["alibi_slopes"] == pre.model_cfg.alibi_slopes() and cfg["norm"] == pre.model_cfg.norm
    assert cfg["alibi_exempt_cls"] == pre.model_cfg.alibi_exempt_cls
    assert cfg["max_position_embeddings"] == pre.model_cfg.max_len  # alignlab's positions, no RoBERTa offset
    tree = ast.parse((out / "modeling_alignlab.py").read_text())
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    roots |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert roots <= {"__future__", "torch", "transformers"}, roots
    export_info = json.loads((out / "alignlab_export.json").read_text())
    assert export_info["architecture"] == "AlignlabEncoderModel" and export_info["alibi"] == 4.0
    assert export_info["alibi_exempt_cls"] == pre.model_cfg.alibi_exempt_cls
    assert "trust_remote_code=True" in export_info["load"]
    assert set(json.loads((out / "alignlab_heads.json").read_text())["heads"]) == {"mlm", "nsp", "whp", "pad"}
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")], "the temp folder was renamed"
