"""The laptop-cramming recipe options (issue #15): each does what it says, and a model trained with all of them
still pretrains under Ray Train, finetunes, and serves through the fast inference path."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from alignlab.platform.config import MODEL_SIZES, PretrainConfig
from alignlab.platform.encoder.model import Encoder
from alignlab.platform.presets import Preset
from alignlab.platform.pretrain.pretrain import Pretrainer, lr_lambda, make_optimizer

from tiny_model import batches, tiny_pretrained, tiny_tokenizer

TINY = MODEL_SIZES["tiny"]


def _inputs(vocab=100, T=12, B=3):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (B, T), generator=g)
    return ids, torch.zeros_like(ids)


def _qkv_input(enc: Encoder, ids, seg) -> tuple[torch.Tensor, torch.Tensor]:
    """(what layer 0 was given, what its attention projection read)."""
    seen = {}

    def keep(key):
        def hook(module, args):
            seen.setdefault(key, args[0])  # returns None: the input is left as it is
        return hook

    enc.layers[0].register_forward_pre_hook(keep("x"))
    enc.layers[0].qkv.register_forward_pre_hook(keep("qkv"))
    enc.eval()(ids, seg)
    return seen["x"], seen["qkv"]


def test_a_pre_ln_block_normalizes_before_attention_and_a_post_ln_block_after():
    ids, seg = _inputs()
    torch.manual_seed(0)
    pre = Encoder(dataclasses.replace(TINY, norm="pre"), 100)
    x, q_in = _qkv_input(pre, ids, seg)
    assert torch.allclose(q_in, pre.layers[0].ln1(x), atol=1e-6)
    assert pre.final_ln is not None
    torch.manual_seed(0)
    post = Encoder(dataclasses.replace(TINY, norm="post"), 100)
    x, q_in = _qkv_input(post, ids, seg)
    assert torch.equal(q_in, x)  # the raw stream; its LayerNorms come after each residual sum
    assert post.final_ln is None


def test_a_pre_ln_encoders_output_is_its_final_layernorm_of_the_residual_stream():
    ids, seg = _inputs()
    enc = Encoder(dataclasses.replace(TINY, norm="pre", dropout=0.0), 100).eval()
    out = enc(ids, seg)
    # LayerNorm output with unit gain and zero bias: mean 0, variance 1 per token.
    assert torch.allclose(out.mean(-1), torch.zeros(out.shape[:2]), atol=1e-5)
    assert torch.allclose(out.var(-1, unbiased=False), torch.ones(out.shape[:2]), atol=1e-3)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_dropout_zero_gives_identical_outputs_in_train_and_eval_mode(norm):
    ids, seg = _inputs()
    enc = Encoder(dataclasses.replace(TINY, norm=norm, dropout=0.0), 100)
    assert torch.equal(enc.train()(ids, seg), enc.eval()(ids, seg))
    noisy = Encoder(dataclasses.replace(TINY, norm=norm, dropout=0.1), 100)
    assert not torch.equal(noisy.train()(ids, seg), noisy.eval()(ids, seg))


def _count_sdpa(monkeypatch) -> list:
    """Calls of SDPA from the model's attention (the real function still runs)."""
    import alignlab.platform.encoder.model as model_mod

    calls, real = [], torch.nn.functional.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(model_mod.F, "scaled_dot_product_attention", counted)
    return calls


@pytest.mark.parametrize("mask", ["none", "padding", "distance_bias"])
def test_bf16_training_attention_is_written_out_and_matches_sdpa_in_outputs_and_gradients(mask, monkeypatch):
    from alignlab.platform.encoder.model import EncoderLayer

    ids, seg = _inputs(T=16, B=3)
    cfg = dataclasses.replace(TINY, alibi=2.0 if mask == "distance_bias" else 0.0, dropout=0.0)
    keep = torch.ones(3, 16, dtype=torch.bool)
    if mask == "padding":
        keep[1, 10:] = False
    calls = _count_sdpa(monkeypatch)
    # A fixed random read-out: the squared norm of a LayerNorm output would be constant, with no gradient.
    readout = torch.randn(3, 16, cfg.hidden, generator=torch.Generator().manual_seed(1))
    got = {}
    for written_out in (True, False):
        monkeypatch.setattr(EncoderLayer, "cpu_training_attention", "auto" if written_out else "sdpa")
        torch.manual_seed(0)
        enc = Encoder(cfg, 100).train()
        before = len(calls)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = enc(ids, seg, keep)
        (out.float() * readout).sum().backward()
        got[written_out] = (out.float(), enc.layers[0].qkv.weight.grad.clone(), len(calls) - before)
    assert got[True][2] == 0 and got[False][2] == cfg.num_layers  # the bf16 training path never calls SDPA
    valid = keep[..., None]
    torch.testing.assert_close(got[True][0] * valid, got[False][0] * valid, atol=0.05, rtol=0.05)
    grad, ref = got[True][1], got[False][1]
    assert float(ref.abs().max()) > 0.1  # gradients of a size the comparison can see
    assert float((grad - ref).norm() / ref.norm()) < 0.02
    # Held-out evaluation (no gradients) and fp32 training without dropout keep SDPA, the faster path there.
    enc = Encoder(cfg, 100)
    before = len(calls)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        enc.eval()(ids, seg, keep)
    enc.train()(ids, seg, keep).sum().backward()
    assert len(calls) - before == 2 * cfg.num_layers


def test_cosine_and_linear_schedules_end_at_zero_exactly_at_max_steps_after_warmup():
    base = dict(max_steps=100, warmup_steps=10)
    cos = lr_lambda(PretrainConfig(decay="cosine", **base))
    lin = lr_lambda(PretrainConfig(decay="linear", **base))
    const = lr_lambda(PretrainConfig(decay="constant", **base))
    assert cos(0) == pytest.approx(0.1 * 0.5 * (1 + math.cos(0)))  # warming up
    assert cos(50) == pytest.approx(0.5) and lin(50) == pytest.approx(0.5)
    assert cos(25) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert cos(100) == pytest.approx(0.0, abs=1e-12) and lin(100) == 0.0
    assert const(100) == 1.0


def test_weight_decay_switches_to_adamw_and_spares_biases_and_layernorms():
    enc = Encoder(TINY, 100)
    plain = make_optimizer(enc, PretrainConfig())
    assert type(plain) is torch.optim.Adam
    assert plain.defaults["betas"] == (0.9, 0.999) and plain.defaults["eps"] == 1e-8
    assert plain.defaults["fused"] is True  # one kernel, not a Python loop over the parameters
    opt = make_optimizer(enc, PretrainConfig(weight_decay=0.01, adam_betas=(0.9, 0.98), adam_eps=1e-6))
    assert type(opt) is torch.optim.AdamW and opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-6
    assert opt.defaults["fused"] is True
    decayed, spared = opt.param_groups
    assert decayed["weight_decay"] == 0.01 and spared["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decayed["params"]) and all(p.dim() == 1 for p in spared["params"])
    ids = {id(p) for g in opt.param_groups for p in g["params"]}
    assert ids == {id(p) for p in enc.parameters()}
    # With no gradient signal, decay alone shrinks a matrix and leaves a LayerNorm gain alone.
    w, ln = enc.layers[0].qkv.weight, enc.layers[0].ln1.weight
    w0, ln0 = w.detach().clone(), ln.detach().clone()
    for p in enc.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    assert torch.allclose(w, w0 * (1 - 1e-4 * 0.01)) and torch.equal(ln, ln0)


def test_a_short_then_long_schedule_trains_short_examples_first_and_nsp_pairs_keep_both_chunks(tmp_path):
    tok = tiny_tokenizer(tmp_path)
    cfg = dataclasses.replace(Preset.named("smoke").pretrain, objectives="mlm,nsp", max_steps=10, short_seq_len=16,
                              short_seq_fraction=0.3, precision="fp32")
    assert [cfg.seq_len_at(s) for s in range(10)] == [16] * 3 + [TINY.max_len] * 7
    tr = Pretrainer(cfg, tok)
    rows = batches(tok)[0]
    short = tr.collate(rows, step=0, max_len=cfg.seq_len_at(0))
    long = tr.collate(rows, step=5, max_len=cfg.seq_len_at(5))
    assert short["input_ids"].shape[1] <= 16 < long["input_ids"].shape[1]
    # Every NSP example still has a first and a second segment, and the masks sit inside the example.
    has_b = short["segment_ids"].amax(1) == 1
    assert bool(has_b.all())
    masked = short["mlm"] != -100
    assert bool(short["attention_mask"][masked].all()) and bool(masked.any())
    # The full-length collation is what it was without a schedule.
    plain = Pretrainer(dataclasses.replace(cfg, short_seq_len=0, short_seq_fraction=0.0), tok)
    assert torch.equal(plain.collate(rows, step=5)["input_ids"], long["input_ids"])


def test_the_masking_curriculum_draws_uniform_masks_first_then_mlms_own_and_evaluation_keeps_mlms_own(tmp_path):
    import numpy as np
    from tiny_model import real_texts

    from alignlab.objectives.masked_lm import MaskedLMConfig
    from alignlab.platform.encoder.tokenizer import Tokenizer

    tok = tiny_tokenizer(tmp_path)  # then the corpus's token counts next to it, as a corpus build saves them
    counts = np.bincount([i for t in real_texts() for i in tok.sp.encode(t)], minlength=tok.vocab_size)
    np.save(tmp_path / "token_counts.npy", counts)
    tok = Tokenizer(tmp_path / "tokenizer.model")
    cfg = dataclasses.replace(Preset.named("smoke").pretrain, objectives="mlm,nsp", max_steps=10, curriculum_fraction=0.3,
                              precision="fp32")
    assert [cfg.curriculum_at(s) for s in range(10)] == [True] * 3 + [False] * 7
    tr = Pretrainer(cfg, tok)
    rare = Pretrainer(dataclasses.replace(cfg, curriculum_fraction=0.0), tok)  # MLM's own alpha, 0.5
    bert_mlm = (MaskedLMConfig(alpha=0.0), "nsp")
    bert = Pretrainer(dataclasses.replace(cfg, curriculum_fraction=0.0, objectives=bert_mlm), tok)
    rows = batches(tok)[0]
    early, late = tr.batch(rows, step=1)["mlm"], tr.batch(rows, step=5)["mlm"]
    rare_early = rare.batch(rows, step=1)["mlm"]
    assert torch.equal(early, bert.batch(rows, step=1)["mlm"]) and not torch.equal(early, rare_early)
    assert torch.equal(late, rare.batch(rows, step=5)["mlm"])
    # Uniform masks land on frequent tokens more often than the rare-weighted ones of the same step.
    assert counts[early[early != -100].numpy()].mean() > counts[rare_early[rare_early != -100].numpy()].mean()
    # Held-out evaluation scores MLM's own (rare-weighted) masks at every step of the curriculum.
    assert torch.equal(tr.collate(rows, step=1)["mlm"], rare_early)


def test_the_masking_curriculum_names_another_model_only_when_it_is_on():
    from alignlab.platform.pretrain.models import model_id

    paper = Preset.named("paper").pretrain
    # The paper preset's id, pinned: the field leaves it alone when off (it moved only when PRETRAIN_CODE_VERSION
    # and the device kind entered every model id, issue #43, the per-rank split of its 4 workers, issue #42, and
    # when it went to one worker, issue #56).
    assert model_id("bundled-dabc0247e631", paper) == "768x3-mlm-f5f199592455"
    curriculum = dataclasses.replace(paper, curriculum_fraction=0.5)
    assert model_id("bundled-dabc0247e631", curriculum) != model_id("bundled-dabc0247e631", paper)


@pytest.mark.parametrize("bad, match", [
    (dict(decay="triangle"), "decay"), (dict(adam_betas=(0.9, 1.0)), "adam_betas"), (dict(adam_eps=0.0), "adam_eps"),
    (dict(weight_decay=float("nan")), "weight_decay"), (dict(seq_len=8), "seq_len"), (dict(seq_len=10_000), "seq_len"),
    (dict(short_seq_len=16), "together"), (dict(short_seq_fraction=1.0, short_seq_len=16), "short_seq_fraction"),
    (dict(curriculum_fraction=1.0), "curriculum_fraction"),
    (dict(curriculum_fraction=-0.1), "curriculum_fraction"),
    (dict(objectives="nsp", curriculum_fraction=0.5), "needs an objective with a curriculum; these objectives are nsp"),
])
def test_bad_recipe_values_are_refused_naming_the_field(bad, match):
    with pytest.raises(ValueError, match=match):
        PretrainConfig(**bad)
    with pytest.raises(ValueError, match="norm"):
        dataclasses.replace(TINY, norm="sandwich")


def test_sinusoidal_positions_are_the_scaled_sinusoids_and_no_training_step_moves_them():
    from alignlab.platform.encoder.model import sinusoids

    tok = tiny_tokenizer_for_recipe()
    cfg = dataclasses.replace(Preset.named("smoke").pretrain, objectives="mlm,nsp", precision="fp32", lr=1e-2,
                              model=dataclasses.replace(TINY, position="sinusoidal", dropout=0.0))
    tr = Pretrainer(cfg, tok)
    pos = tr.model.encoder.pos.weight
    table = sinusoids(TINY.max_len, TINY.hidden)
    scale = float(tr.model.encoder.tok.weight.std()) * 2**0.5  # the same size per dimension as a token's vector
    torch.testing.assert_close(pos.detach(), table * scale)
    assert not pos.requires_grad
    before = pos.detach().clone()
    for step, b in enumerate(batches(tok)[:3]):
        tr.train_step(tr.collate(b, step=step))
    assert torch.equal(pos.detach(), before)
    learned = Pretrainer(dataclasses.replace(cfg, model=dataclasses.replace(TINY, dropout=0.0)), tok)
    assert learned.model.encoder.pos.weight.requires_grad
    with pytest.raises(ValueError, match="position"):
        dataclasses.replace(TINY, position="rotary")


def test_the_position_kind_names_another_model_only_when_it_is_not_the_default_learned_table():
    from alignlab.platform.pretrain.models import model_id

    paper = Preset.named("paper").pretrain
    # The paper preset's id, pinned: the field leaves it alone at its default (it moved only when
    # PRETRAIN_CODE_VERSION and the device kind entered every model id, issue #43, the per-rank split of its 4
    # workers, issue #42, and when it went to one worker, issue #56).
    assert model_id("bundled-dabc0247e631", paper) == "768x3-mlm-f5f199592455"
    sin = dataclasses.replace(paper, model=dataclasses.replace(paper.model, position="sinusoidal"))
    assert model_id("bundled-dabc0247e631", sin) != model_id("bundled-dabc0247e631", paper)
    alibi = dataclasses.replace(paper, model=dataclasses.replace(paper.model, alibi=0.5))
    assert model_id("bundled-dabc0247e631", alibi) not in (model_id("bundled-dabc0247e631", paper),
                                                           model_id("bundled-dabc0247e631", sin))


def test_the_distance_bias_subtracts_each_heads_slope_times_the_distance_and_masks_padding():
    cfg = dataclasses.replace(TINY, alibi=2.0, dropout=0.0)
    assert cfg.alibi_slopes() == [2.0, 2.0 * 2**-4]  # 2 heads: 2^(-8h/2)
    enc = Encoder(cfg, 100)
    keep = torch.tensor([[True] * 4 + [False] * 2])[:, None, None, :]
    bias = enc.distance_bias(6, torch.float32, torch.device("cpu"), keep)
    assert bias.shape == (1, 2, 6, 6)
    assert float(bias[0, 0, 1, 3]) == -4.0 and float(bias[0, 1, 3, 1]) == -0.25 and float(bias[0, 1, 2, 2]) == 0.0
    assert bool(torch.isinf(bias[..., 4:]).all()) and bool(torch.isfinite(bias[..., :4]).all())
    with pytest.raises(ValueError, match="alibi"):
        dataclasses.replace(TINY, alibi=-1.0)


def test_an_exempt_cls_has_no_distance_bias_on_its_row_or_column_and_every_other_pair_keeps_its_own():
    cfg = dataclasses.replace(TINY, alibi=2.0, dropout=0.0)
    keep = torch.tensor([[True] * 5 + [False]])[:, None, None, :]
    biased = Encoder(cfg, 100).distance_bias(6, torch.float32, torch.device("cpu"), keep)
    exempt = Encoder(dataclasses.replace(cfg, alibi_exempt_cls=True), 100).distance_bias(
        6, torch.float32, torch.device("cpu"), keep)
    assert float(biased[0, 0, 0, 4]) == -8.0 and float(biased[0, 1, 3, 0]) == -0.375
    assert bool((exempt[0, :, 0, :5] == 0).all()) and bool((exempt[0, :, :, 0] == 0).all())
    assert bool(torch.isinf(exempt[..., 5]).all())  # padding stays masked, [CLS]'s row too
    torch.testing.assert_close(exempt[0, :, 1:, 1:], biased[0, :, 1:, 1:])


def test_a_fresh_mini_model_lets_cls_read_past_position_16_in_every_layer_and_head():
    from alignlab.platform.encoder.model import query_attention
    from alignlab.platform.presets import Preset

    mini = Preset.named("mini").pretrain.model
    assert mini.alibi > 0 and mini.alibi_exempt_cls
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 1000, (4, mini.max_len), generator=gen)
    seg = torch.zeros_like(ids)
    seg[:, 20:] = 1  # a pair input: the second segment stands for AD's snippet
    reach = {}
    for exempt in (True, False):
        torch.manual_seed(0)
        enc = Encoder(dataclasses.replace(mini, alibi_exempt_cls=exempt), 1000).eval()
        attn = query_attention(enc, ids, seg)  # [layers, B, heads, T]
        torch.testing.assert_close(attn.sum(-1), torch.ones(attn.shape[:-1]))
        reach[exempt] = attn[..., 16:].sum(-1).mean(1)  # [layers, heads]
    # At init the logits are near 0, so the bias decides: an exempt [CLS] reads every position about evenly
    # (112 of 128 lie past 16); a biased one keeps ~e^-4 of the shallow head's attention past 16, none of the steep one's.
    assert bool((reach[True] > 0.8).all()), reach[True]
    assert bool((reach[False] < 0.05).all()), reach[False]


def test_a_strong_distance_bias_makes_a_tokens_output_blind_to_far_tokens_and_padding_changes_nothing():
    ids, seg = _inputs(T=12, B=1)
    far = ids.clone()
    far[0, -1] = (int(ids[0, -1]) + 7) % 95 + 5  # another token, 11 positions from the first
    out = {}
    for alibi in (0.0, 60.0):
        torch.manual_seed(0)
        enc = Encoder(dataclasses.replace(TINY, alibi=alibi, dropout=0.0), 100).eval()
        with torch.no_grad():
            out[alibi] = float((enc(ids, seg)[0, 0] - enc(far, seg)[0, 0]).abs().max())
            # Padding the batch with a second, shorter row changes nothing at the first row's tokens.
            two = torch.cat([ids, ids]), torch.cat([seg, seg])
            mask = torch.ones(2, 12, dtype=torch.bool)
            mask[1, 8:] = False
            torch.testing.assert_close(enc(*two, mask)[0], enc(ids, seg)[0])
            torch.testing.assert_close(enc(*two, mask)[1, :8], enc(ids[:, :8], seg[:, :8])[0])
    assert out[0.0] > 1e-3  # without the bias the first token sees the last
    assert out[60.0] < 1e-4 * out[0.0]


@pytest.mark.parametrize("norm", ["post", "pre", "pre_cls_exempt"])
def test_the_fast_encoder_applies_the_distance_bias_like_the_module_forward(norm):
    from alignlab.platform.fel.inference import FastEncoder

    ids, seg = _inputs(T=12, B=1)
    torch.manual_seed(0)
    enc = Encoder(dataclasses.replace(TINY, norm=norm.split("_")[0], alibi=3.0, dropout=0.0, num_layers=2,
                                      alibi_exempt_cls=norm.endswith("exempt")), 100).eval()
    fast = FastEncoder(enc, backend="aten")
    with torch.no_grad():
        want = enc(ids, seg)[0]
        torch.testing.assert_close(fast(ids[0], seg[0]), want, atol=1e-5, rtol=1e-4)
        rows = torch.tensor([0, 5, 11])
        torch.testing.assert_close(fast(ids[0], seg[0], rows=rows), want[rows], atol=1e-5, rtol=1e-4)
        every = enc(ids, seg, layers="all")[0]  # what a finetuned head reading every layer gets (FinetuneConfig)
        assert every.shape[-1] == (enc.cfg.num_layers + 1) * enc.cfg.hidden
        torch.testing.assert_close(fast(ids[0], seg[0], None, "all"), every, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(fast(ids[0], seg[0], rows, "all"), every[rows], atol=1e-4, rtol=1e-4)
        # The same weights without the bias give other outputs: the comparison above can see a missing bias.
        enc.cfg = dataclasses.replace(enc.cfg, alibi=0.0)
        assert float((enc(ids, seg)[0] - want).abs().max()) > 1e-3


def tiny_tokenizer_for_recipe():
    import tempfile
    from pathlib import Path

    return tiny_tokenizer(Path(tempfile.mkdtemp(prefix="tok-")))


CRAMMED = dict(model=dataclasses.replace(TINY, norm="pre", dropout=0.0, alibi=1.0), decay="cosine", weight_decay=0.01,
               adam_betas=(0.9, 0.98), adam_eps=1e-6, short_seq_len=32, short_seq_fraction=0.5,
               curriculum_fraction=0.25)


def test_a_crammed_model_finetunes_and_its_fast_predictor_matches_the_module_forward(tmp_path):
    from alignlab.platform.fel.finetune import finetune_calculation, load_pretrained, save_finetuned
    from alignlab.platform.fel.inference import Predictor
    from alignlab.platform.presets import Preset
    from alignlab.platform.tasks.task import load_examples
    from alignlab.platform.tasks.task_data import SHIPPED_TASK_DATA

    mdir = tiny_pretrained(tmp_path, steps=4, **CRAMMED)
    pre = load_pretrained(mdir)
    assert pre.model_cfg.norm == "pre" and any(k.startswith("encoder.final_ln") for k in pre.state)
    examples = load_examples("ct", SHIPPED_TASK_DATA / "ct_pool.jsonl")
    cfg = dataclasses.replace(Preset.named("smoke").finetune, task="ct", budget=40)
    result = finetune_calculation(pre, cfg, examples[:30], examples[40:60], val=examples[30:40])
    assert 0.0 <= result.row["accuracy"] <= 1.0
    fdir = save_finetuned(tmp_path, pre, cfg, result)
    pred = Predictor.load(fdir)
    model = pred.ft.model.eval()
    from alignlab.platform.tasks.task_kinds import query_input as ct_input

    words = list(examples[60].tokens)
    ids, first = ct_input(pred.tok, words, model.cfg.max_len)
    with torch.no_grad():
        h = model.encoder(torch.tensor([ids]), torch.zeros(1, len(ids), dtype=torch.long))[0]
        want = model.heads["ct"](h[torch.tensor(first)]).argmax(-1).tolist()
    from alignlab.objectives.hyperlink import TAGS as WHP_TAGS

    assert pred.tag(words)[: len(first)] == [WHP_TAGS[t] for t in want]


@pytest.mark.ray
def test_a_crammed_recipe_from_corpus_embeddings_pretrains_under_ray_train_and_its_id_names_both(smoke_corpus, tmp_path):
    """One Ray Train run for two things that travel to the workers: the crammed recipe (its id and saved config name
    it) and word embeddings from the corpus's co-occurrences (`PretrainConfig.corpus_embeddings`: the driver writes
    the table once, before the workers start, and they start from it)."""
    import json

    import numpy as np

    from alignlab.platform.corpus.corpus import load_manifest
    from alignlab.platform.corpus.corpus_embeddings import WORD_EMBEDDINGS
    from alignlab.platform.encoder.tokenizer import Tokenizer
    from alignlab.platform.pretrain.driver import pretrain
    from alignlab.platform.pretrain.models import model_id

    cfg = dataclasses.replace(Preset.named("smoke").pretrain, objectives="mlm,nsp,whp,pad", max_steps=4,
                              checkpoint_every=4, precision="fp32", corpus_embeddings=0.1, **CRAMMED)
    mdir = pretrain(smoke_corpus, cfg, tmp_path)
    cid = load_manifest(smoke_corpus)["corpus_id"]
    assert mdir.name == model_id(cid, cfg) != model_id(cid, dataclasses.replace(cfg, model=TINY))
    assert model_id(cid, cfg) != model_id(cid, dataclasses.replace(cfg, corpus_embeddings=0.0))
    ev = json.loads((mdir / "final" / "eval.json").read_text())
    assert ev["step"] == 4 and all(math.isfinite(ev[f"eval/{n}/perplexity"]) for n in ("mlm", "nsp", "whp", "pad"))
    saved = json.loads((mdir / "final" / "model_config.json").read_text())
    assert saved["model"]["norm"] == "pre" and saved["pretrain"]["decay"] == "cosine"
    assert saved["pretrain"]["curriculum_fraction"] == 0.25
    table = np.load(mdir / WORD_EMBEDDINGS)
    assert table.shape == (Tokenizer(smoke_corpus / "tokenizer.model").vocab_size, cfg.model.hidden)
    assert not list(mdir.glob("*.tmp*"))
    trained = torch.load(mdir / "final" / "model.pt", weights_only=True)["encoder.tok.weight"].numpy()
    # Four small steps move each entry a little: the trained embeddings are still the table's, a random init (std
    # 0.02, unrelated) would correlate ~0.
    assert np.corrcoef(trained.ravel(), table.ravel())[0, 1] > 0.9
    made = (mdir / WORD_EMBEDDINGS).stat().st_mtime_ns
    assert pretrain(smoke_corpus, cfg, tmp_path) == mdir and (mdir / WORD_EMBEDDINGS).stat().st_mtime_ns == made
