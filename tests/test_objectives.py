"""On-the-fly labels (MLM, NSP) and the example mix, on hand-built rows with a real tiny tokenizer."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from alignlab.platform.encoder.batching import Collator
from alignlab.platform.encoder.registry import resolve_objectives
from alignlab.platform.encoder.tokenizer import Tokenizer, train_tokenizer

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega").split()


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, size=30)) for _ in range(300)]
    train_tokenizer(texts, d / "tokenizer.model", vocab_size=100)
    return Tokenizer(d / "tokenizer.model")


def _rows(tok, n=8, linked=True, seg_words=12):
    rng = np.random.default_rng(1)
    rows = {k: [] for k in ("doc_id", "kind", "a_ids", "b_ids", "has_next", "a_text", "b_text", "whp_a", "whp_b",
                            "pad_acronym", "pad_label")}
    for i in range(n):
        a_words, b_words = list(rng.choice(WORDS, seg_words)), list(rng.choice(WORDS, seg_words))
        a = [p for w in tok.encode_words(a_words) for p in w]
        b = [p for w in tok.encode_words(b_words) for p in w]
        rows["doc_id"].append(f"d{i}")
        rows["kind"].append("wiki" if linked else "web")
        rows["a_ids"].append(a)
        rows["b_ids"].append(b)
        rows["has_next"].append(True)
        rows["a_text"].append(" ".join(a_words))
        rows["b_text"].append(" ".join(b_words))
        rows["whp_a"].append([1] + [-100] * (len(a) - 1))
        rows["whp_b"].append([2] + [-100] * (len(b) - 1))
        rows["pad_acronym"].append("abg")
        rows["pad_label"].append(i % 2)
    return {k: np.asarray(v, dtype=object) for k, v in rows.items()}


def _objectives(tok, names, **mlm):
    cfgs = resolve_objectives(names)
    return [c.build(tok) for c in cfgs]


def test_mlm_masks_fifteen_percent_of_non_special_tokens_and_never_specials(tok):
    col = Collator(_objectives(tok, "mlm"), tok, max_len=64)
    rows = _rows(tok, n=32)
    before = col(rows, step=0)
    ids = before["input_ids"]
    assert before["mlm"].shape == ids.shape  # labels per row: a data-parallel worker takes its rows of them
    pos = torch.nonzero(before["mlm"].reshape(-1) != -100).squeeze(1)
    labels = before["mlm"].reshape(-1)[pos]
    real = before["attention_mask"] & ~torch.isin(ids, torch.tensor([tok.cls_id, tok.sep_id, tok.pad_id]))
    # What was drawn for prediction is never a special token, and about 15% of the real tokens.
    assert not torch.isin(labels, torch.as_tensor(tok.special_ids)).any()
    n_real = int(real.sum()) + int((ids.view(-1)[pos] == tok.mask_id).sum()) * 0
    assert 0.12 < len(pos) / n_real < 0.18
    flat = ids.view(-1)[pos]
    masked = (flat == tok.mask_id).float().mean().item()
    kept = (flat == labels).float().mean().item()
    assert 0.7 < masked < 0.9 and 0.04 < kept < 0.2


def test_mlm_masked_accuracy_counts_only_the_mask_positions_so_a_model_that_copies_its_input_scores_zero_there(tok):
    """Of the predicted positions, 10% show their own token: copying the input scores there without any context.
    The held-out `masked_accuracy` leaves those out (the mini models' ~10% MLM accuracy was exactly that copy)."""
    from alignlab.objectives.masked_lm import MaskedLMConfig

    obj = MaskedLMConfig().build(tok)
    b = Collator([obj], tok, max_len=64)(_rows(tok, n=64), step=0)
    copy = torch.nn.Identity().eval()  # logits = the one-hot input token: predicts what it sees
    hidden = torch.nn.functional.one_hot(b["input_ids"], tok.vocab_size).float()
    _, sums = obj.loss_and_sums(copy, hidden, b)
    out = obj.finalize({k: float(v) for k, v in sums.items()})
    assert 0.05 < out["accuracy"] < 0.15  # the kept ~10%
    assert out["masked_accuracy"] == 0.0 and 0.7 < sums["masked_count"] / sums["count"] < 0.9
    _, train_sums = obj.loss_and_sums(copy.train(), hidden, b)
    assert "masked_count" not in train_sums  # not computed during training steps


def test_mlm_draws_rare_tokens_more_often_than_frequent_ones(tok):
    counts = np.ones(tok.vocab_size, dtype=np.int64)
    rows = _rows(tok, n=64)
    ids = np.concatenate([np.asarray(a, dtype=np.int64) for a in rows["a_ids"]])
    frequent, rare = np.bincount(ids).argsort()[-1], np.bincount(ids).argsort()[-2]
    counts[frequent], counts[rare] = 10_000, 10
    tok.counts = counts
    try:
        col = Collator(_objectives(tok, "mlm"), tok, max_len=64)
        hits = {frequent: [0, 0], rare: [0, 0]}
        for step in range(20):
            b = col(rows, step=step)
            for t in hits:
                hits[t][0] += int((b["mlm"] == int(t)).sum())
        occurrences = {t: int(sum((np.asarray(a, dtype=np.int64) == t).sum() for a in rows["a_ids"])) for t in hits}
        rate = {t: hits[t][0] / max(1, occurrences[t]) for t in hits}
        assert rate[rare] > 3 * rate[frequent]
    finally:
        tok.counts = np.ones(tok.vocab_size, dtype=np.int64)


def test_nsp_keeps_about_half_the_true_next_segments_and_replaces_the_rest_from_other_documents(tok):
    col = Collator(_objectives(tok, "nsp"), tok, max_len=64)
    rows = _rows(tok, n=64)
    labels = []
    for step in range(10):
        b = col(rows, step=step)
        labels += b["nsp"].tolist()
        for i, lab in enumerate(b["nsp"].tolist()):
            seg = b["segment_ids"][i]
            b_part = b["input_ids"][i][(seg == 1) & b["attention_mask"][i]][:-1].tolist()
            own_next = [int(x) for x in rows["b_ids"][i]]
            assert (b_part == own_next[: len(b_part)]) == (lab == 1)
    assert 0.4 < np.mean(labels) < 0.6


def test_the_same_step_makes_the_same_batch_and_another_step_a_different_one(tok):
    col = Collator(_objectives(tok, "mlm,nsp"), tok, max_len=64)
    rows = _rows(tok)
    a, b, c = col(rows, step=3), col(rows, step=3), col(rows, step=4)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["input_ids"], c["input_ids"])


def test_acronym_examples_come_only_from_linked_rows_and_carry_the_pad_label(tok):
    objs = _objectives(tok, "mlm,pad")
    col = Collator(objs, tok, max_len=64, layout_fraction=1.0)
    b = col(_rows(tok, linked=True), step=0)
    assert (b["row_format"] == 1).all()
    acr_ids = tok.encode_spelled("abg")
    assert b["input_ids"][0, 1: 1 + len(acr_ids)].tolist() == acr_ids
    assert b["pad"].tolist() == [i % 2 for i in range(8)]
    web = col(_rows(tok, linked=False), step=0)
    assert (web["row_format"] == 0).all() and (web["pad"] == -100).all()


def test_without_pad_every_row_is_a_pair_example(tok):
    col = Collator(_objectives(tok, "mlm,nsp,whp"), tok, max_len=64, layout_fraction=1.0)
    assert (col(_rows(tok), step=0)["row_format"] == 0).all()


def test_whp_labels_sit_on_the_first_subword_of_each_word_in_both_segments(tok):
    col = Collator(_objectives(tok, "whp"), tok, max_len=64)
    b = col(_rows(tok), step=0)
    assert b["whp"][0, 0] == -100  # [CLS]
    assert b["whp"][0, 1] == 1
    first_b = int((b["segment_ids"][0] == 1).nonzero()[0])
    assert b["whp"][0, first_b] == 2


def test_subword_regularization_resamples_only_web_chunks(tok):
    col = Collator(_objectives(tok, "mlm"), tok, max_len=64, subword_alpha=0.1)
    web, wiki = _rows(tok, linked=False), _rows(tok, linked=True)
    seqs_web = {tuple(col(web, step=s)["input_ids"][0].tolist()) for s in range(8)}
    col_plain = Collator(_objectives(tok, "mlm"), tok, max_len=64, subword_alpha=0.0)
    assert len(seqs_web) > 1
    w1 = col(wiki, step=0)["input_ids"]
    w2 = col_plain(wiki, step=0)["input_ids"]
    assert torch.equal(w1, w2)


def _pad_examples(tok, batch, rows):
    """(acronym ids, chunk ids) of each acronym example of a collated batch."""
    out = []
    for i in range(batch["input_ids"].shape[0]):
        if int(batch["row_format"][i]) != 1:
            continue
        ids = batch["input_ids"][i][batch["attention_mask"][i]].tolist()
        first_sep = ids.index(tok.sep_id)
        out.append((ids[1:first_sep], ids[first_sep + 1:-1], str(rows["a_text"][i])))
    return out


def test_pad_subword_regularization_resamples_the_chunk_but_keeps_its_words_and_is_keyed_by_step(tok):
    from alignlab.objectives.pseudo_acronym import PseudoAcronymConfig

    rows = _rows(tok, n=16)
    plain = Collator([PseudoAcronymConfig().build(tok)], tok, max_len=64, layout_fraction=1.0)
    sampled = Collator([PseudoAcronymConfig(subword_alpha=0.1).build(tok)], tok, max_len=64, layout_fraction=1.0)
    base = _pad_examples(tok, plain(rows, step=3), rows)
    once, again = (_pad_examples(tok, sampled(rows, step=3), rows) for _ in range(2))
    later = _pad_examples(tok, sampled(rows, step=4), rows)
    assert len(base) == len(once) == 16
    assert once == again, "the same (seed, rank, step) must give the same pieces (exact resume)"
    assert once != later, "a new step draws new segmentations"
    assert any(o[1] != b[1] for o, b in zip(once, base)), "sampling changed no chunk's pieces"
    for (acr, chunk, text), (acr0, _, _) in zip(once, base):
        assert acr == acr0 and tok.decode(chunk) == text  # the words are the same, only their pieces differ


def test_pad_pairs_are_the_stored_ones_on_the_first_pass_and_drawn_afresh_on_later_passes(tok):
    from alignlab.objectives.pseudo_acronym import PseudoAcronymConfig
    from alignlab.platform.sources.text import initials

    rows = _rows(tok, n=16)
    col = Collator([PseudoAcronymConfig().build(tok)], tok, max_len=64, layout_fraction=1.0)
    first = col(rows, step=3, epoch=0)
    assert first["pad"].tolist() == [i % 2 for i in range(16)]
    stored = _pad_examples(tok, first, rows)
    assert all(acr == tok.encode_spelled("abg") for acr, _, _ in stored)
    later = [col(rows, step=s, epoch=1) for s in (40, 41)]
    assert torch.equal(col(rows, step=40, epoch=1)["input_ids"], later[0]["input_ids"])  # keyed: exact resume
    drawn = [_pad_examples(tok, b, rows) for b in later]
    assert drawn[0] != stored and drawn[0] != drawn[1], "a later pass must draw new pairs, each step its own"
    for batch, examples in zip(later, drawn):
        labels = batch["pad"].tolist()
        assert sorted(labels) == [0] * 8 + [1] * 8  # half positives, half negatives among the batch's examples
        for label, (acr, _, text) in zip(labels, examples):
            words = text.split()
            spans = {initials(words[i:i + n]) for n in range(2, 7) for i in range(len(words) - n + 1)}
            letters = tok.decode(acr).replace(" ", "")
            assert (letters in spans) == bool(label), (label, letters, text)


@pytest.mark.parametrize("form", ["letters", "text"])
def test_a_pad_label_holds_for_the_words_its_example_shows_when_the_chunk_is_cut_to_a_shorter_length(tok, form):
    from alignlab.objectives.pseudo_acronym import PseudoAcronymConfig
    from alignlab.platform.sources.text import initials

    # 40-word chunks do not fit 32 tokens: the short-sequence phase cuts them, and a stored positive's span may be
    # in the part cut off. Every label must hold for the words the example shows.
    rows = _rows(tok, n=16, seg_words=40)
    col = Collator([PseudoAcronymConfig(acronym_form=form).build(tok)], tok, max_len=32, layout_fraction=1.0)
    labels, flips = [], 0
    for step in range(6):
        batch = col(rows, step=step)
        assert batch["input_ids"].shape[1] <= 32
        for label, (acr, chunk, _) in zip(batch["pad"].tolist(), _pad_examples(tok, batch, rows)):
            words = tok.decode(chunk).split()
            spans = {initials(words[i:i + n]) for n in range(2, 7) for i in range(len(words) - n + 1)}
            letters = tok.decode(acr).replace(" ", "")
            assert (letters in spans) == bool(label), (label, letters, words)
            labels.append(label)
        flips += batch["pad"].tolist() != [i % 2 for i in range(16)]
    assert flips == 6, "cut chunks keep their stored pairs"
    assert 0.4 < sum(labels) / len(labels) < 0.6  # drawn by make_pad_pairs: half positives
    whole = Collator([PseudoAcronymConfig(acronym_form=form).build(tok)], tok, max_len=128, layout_fraction=1.0)
    assert whole(rows, step=0)["pad"].tolist() == [i % 2 for i in range(16)], "chunks that fit keep their pairs"


def test_pad_letter_distribution_for_later_passes_comes_from_the_token_counts(tok):
    from alignlab.objectives.pseudo_acronym import PseudoAcronymConfig

    p = PseudoAcronymConfig().build(tok).letter_probs
    assert p.shape == (26,) and abs(p.sum() - 1) < 1e-9
    starts = {w[0] for w in WORDS}
    assert all(p[ord(c) - 97] == 0 for c in "abcdefghijklmnopqrstuvwxyz" if c not in starts)  # no word starts so
    assert p[ord("a") - 97] > 0 and p[ord("p") - 97] > 0  # alpha; pi, phi, psi


def test_acronym_letters_are_word_initial_pieces_where_the_vocabulary_has_them(tok):
    ids = tok.encode_spelled("abg", "letters")
    pieces = [tok.sp.id_to_piece(i) for i in ids]
    assert len(ids) == 3 and tok.unk_id not in ids
    assert all(p in (f"\u2581{c}", c) for p, c in zip(pieces, "abg"))
    for c, i in tok._letter_ids.items():
        if tok.sp.piece_to_id(f"\u2581{c}") != tok.unk_id:
            assert tok.sp.id_to_piece(i) == f"\u2581{c}"


def test_importing_one_objective_module_first_still_registers_them_all():
    import subprocess
    import sys

    code = ("import alignlab.objectives.masked_lm; from alignlab.platform.encoder.registry import registered; "
            "print(sorted(registered()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "['mlm', 'nsp', 'pad', 'rtd', 'whp']", out.stderr[-2000:]


def test_precision_auto_means_bf16_on_gpus_and_on_cpus_where_bf16_trains_faster():
    from alignlab.platform.config import PretrainConfig
    from alignlab.platform.pretrain.pretrain import use_bf16
    from alignlab.platform.runtime.precision import cpu_prefers_bf16

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert use_bf16("auto", cuda) and use_bf16("bf16", cpu) and not use_bf16("fp32", cuda)
    assert use_bf16("auto", cpu) == cpu_prefers_bf16()
    with pytest.raises(ValueError, match="precision"):
        PretrainConfig(precision="fp16")


def test_cpus_train_in_bf16_only_with_amx_or_amd_avx512_bf16():
    from alignlab.platform.runtime.precision import bf16_is_faster

    avx512 = {"avx512f", "avx512_vnni", "avx_vnni"}
    assert bf16_is_faster("GenuineIntel", avx512 | {"avx512_bf16", "amx_bf16", "amx_tile"})
    assert bf16_is_faster("AuthenticAMD", avx512 | {"avx512_bf16"})
    # An Intel CPU with AVX512-BF16 and no AMX multiplies bf16 no faster than fp32; the casts make the step slower.
    assert not bf16_is_faster("GenuineIntel", avx512 | {"avx512_bf16"})
    assert not bf16_is_faster("AuthenticAMD", avx512)
    assert not bf16_is_faster("", set())


def test_labelled_rows_pad_each_head_to_a_multiple_of_32_rows_and_change_no_loss_gradient_or_metric(tok, monkeypatch):
    """MLM's and WHP's heads run on a batch's labelled positions only, a different count every step; they are padded
    to a multiple of 32 rows (few matmul shapes, so oneDNN's kernel cache holds them), and the padding counts nowhere."""
    import dataclasses

    from alignlab.platform.encoder import registry
    from alignlab.platform.presets import Preset
    from alignlab.platform.pretrain.pretrain import Pretrainer, forward_objectives

    labels = torch.tensor([4, 5, -100, 7, 9])  # position 0 labelled too: a padded row repeats it, unlabelled
    pos, target = registry.labelled_rows(labels)
    assert pos.tolist() == [0, 1, 3, 4] + [0] * 28 and target.tolist() == [4, 5, 7, 9] + [-100] * 28
    assert registry.labelled_rows(torch.arange(64))[0].tolist() == list(range(64))  # a multiple already: as is

    smoke = Preset.named("smoke").pretrain  # without dropout, so that a training step is the same function twice
    cfg = dataclasses.replace(smoke, model=dataclasses.replace(smoke.model, dropout=0.0), objectives="mlm,nsp,whp",
                              precision="fp32")
    torch.manual_seed(0)
    tr = Pretrainer(cfg, tok)
    batch = tr.collate(_rows(tok, n=15), step=0)
    assert int((batch["mlm"] != -100).sum()) % 32 and int((batch["whp"] != -100).sum()) % 32  # padding happens

    def run(multiple: int, train: bool):
        monkeypatch.setattr(registry, "LABELLED_ROW_MULTIPLE", multiple)
        tr.model.train(train)
        tr.model.zero_grad()
        out = forward_objectives(tr.model, tr.objectives, batch)
        sum(loss for loss, _ in out.values()).backward()
        grads = [p.grad.clone() for p in tr.model.parameters() if p.grad is not None]
        return {k: (float(loss), {m: float(v) for m, v in sums.items()}) for k, (loss, sums) in out.items()}, grads

    for train in (True, False):
        (plain, g1), (padded, g32) = run(1, train), run(32, train)
        assert plain.keys() == padded.keys() == {"mlm", "nsp", "whp"}
        for name in plain:
            assert padded[name][0] == pytest.approx(plain[name][0], rel=1e-5)
            assert padded[name][1] == pytest.approx(plain[name][1], rel=1e-5)  # counts, correct, [MASK] counts
        assert len(g1) == len(g32) and all(torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(g1, g32))
    assert "masked_count" in padded["mlm"][1]


def _whp_rows(tok, **kw):
    rows = _rows(tok, n=16, **kw)
    rows["whp_a"] = np.asarray([[j % 4 for j in range(len(a))] for a in rows["a_ids"]], dtype=object)
    return rows


@pytest.mark.parametrize("max_len", [128, 32])
def test_an_acronym_example_keeps_its_chunks_whp_tags_only_when_pad_chunk_labels_is_on(tok, max_len):
    from alignlab.objectives.pseudo_acronym import PseudoAcronymConfig

    # 40-word chunks at 32 tokens are cut to whole words (PAD's fit_to_length): the tags of the words kept stay.
    rows = _whp_rows(tok, seg_words=12 if max_len == 128 else 40)
    objs = lambda **pad: [c.build(tok) for c in resolve_objectives(["mlm", "whp", PseudoAcronymConfig(**pad)])]
    off = Collator(objs(), tok, max_len=max_len, layout_fraction=1.0)(rows, step=0)
    on = Collator(objs(chunk_labels=True), tok, max_len=max_len, layout_fraction=1.0)(rows, step=0)
    assert (on["row_format"] == 1).all() and torch.equal(on["input_ids"], off["input_ids"])
    assert (off["whp"] == -100).all(), "off (the paper's reading before the field): PAD alone in its examples"
    for i in range(16):
        chunk = (on["segment_ids"][i] == 1) & on["attention_mask"][i]
        chunk[int(chunk.nonzero()[-1])] = False  # the last [SEP]
        n = int(chunk.sum())
        assert on["whp"][i][chunk].tolist() == [j % 4 for j in range(n)]
        assert (on["whp"][i][~chunk] == -100).all(), "no tag on [CLS], the acronym or a [SEP]"
    assert (on["mlm"] == -100).all() and torch.equal(on["pad"], off["pad"]), "MLM never predicts in an acronym example"


def test_a_pad_chunk_resegmented_by_subword_regularization_keeps_no_tags(tok):
    from alignlab.objectives.pseudo_acronym import PseudoAcronymConfig

    rows = _whp_rows(tok)
    pad = PseudoAcronymConfig(chunk_labels=True, subword_alpha=0.1)
    batch = Collator([c.build(tok) for c in resolve_objectives(["whp", pad])], tok, max_len=128,
                     layout_fraction=1.0)(rows, step=3)
    tagged = []
    for i in range(16):
        chunk = batch["input_ids"][i][(batch["segment_ids"][i] == 1) & batch["attention_mask"][i]].tolist()[:-1]
        tagged.append(bool((batch["whp"][i] != -100).any()))
        assert tagged[-1] == (chunk == list(rows["a_ids"][i])), i
    assert not all(tagged), "sampling changed no chunk"


def test_pad_chunk_labels_is_left_out_of_the_config_at_its_default_so_earlier_model_ids_hold():
    from alignlab.objectives.pseudo_acronym import PseudoAcronymConfig
    from alignlab.platform.config import config_hash, to_dict

    assert "chunk_labels" not in to_dict(PseudoAcronymConfig())
    assert to_dict(PseudoAcronymConfig(chunk_labels=True))["chunk_labels"] is True
    assert config_hash(PseudoAcronymConfig()) != config_hash(PseudoAcronymConfig(chunk_labels=True))
