"""One FEL calculation on a tiny pretrained model built in-process (no Ray): metrics, backprop schemes,
kept/discarded heads, honest selection, multitask, save -> evaluate round trip, and the predictor."""
from __future__ import annotations

import dataclasses
import json
import math
import shutil

import pytest
import torch

from alignlab.tasks.acronym_detection import pair_input as ad_input
from alignlab.tasks.ad_data import ADExample
from alignlab.tasks.concept_tagging import tags_to_brackets
from alignlab.tasks.ct_data import CTExample
from alignlab.objectives.hyperlink import TAGS as WHP_TAGS
from alignlab.platform.cli import main
from alignlab.platform.config import MODEL_SIZES
from alignlab.platform.encoder.model import AlignModel
from alignlab.platform.encoder.registry import resolve_objectives
from alignlab.platform.encoder.tokenizer import Tokenizer, train_tokenizer
from alignlab.platform.fel.finetune import (Calculation, build_task_model, finetune_calculation, finetuned_dir,
                                            load_finetuned, load_pretrained, save_finetuned)
from alignlab.platform.fel.finetune_config import FinetuneConfig
from alignlab.platform.fel.inference import FastEncoder, Predictor, _mkl_linear_ok, _mkldnn_linear_ok
from alignlab.platform.fel.task_scoring import encode_examples, evaluate_examples
from alignlab.platform.storage.root import write_json
from alignlab.platform.tasks.task_files import write_jsonl
from alignlab.platform.tasks.task_kinds import query_input as ct_input, word_pieces
from alignlab.platform.tasks.task import task as task_named

CT, AD = task_named("ct"), task_named("ad")  # the task objects a caller resolves once and passes down

MODEL_ID = "tiny-mlm+nsp+whp+pad-test"

# ------------------------------------------------------------------------------------------- fixtures

CONCEPTS = ["paris", "super mario", "world of warcraft", "london", "alan turing", "new york city", "python",
            "red river", "mount everest", "the beatles", "france", "rome", "star wars", "albert einstein",
            "amazon river", "tokyo", "moon", "grand canyon", "black sea", "jazz", "chess", "iron man"]
PATTERNS = ["when was {} founded", "where is {}", "how big is {}", "what is the history of {}", "who made {}",
            "{} facts", "is {} older than 100 years"]
NAMES = ["world health organization", "national football league", "united nations", "european space agency",
         "british broadcasting corporation", "north atlantic treaty organization", "central intelligence agency",
         "new york times", "international monetary fund", "federal bureau of investigation", "world trade center",
         "royal air force", "national basketball association", "united states navy", "general electric",
         "international business machines", "world wide web", "rapid eye movement", "compact disc player",
         "personal computer", "american broadcasting company", "london stock exchange", "south china sea"]
FILLERS = ["said on monday that the plan was ready", "was mentioned in the report of the year",
           "opened a new office near the river", "published the results after a long delay"]


def _concept_tags(n: int) -> list[str]:
    return ["SE"] if n == 1 else ["S"] + ["N"] * (n - 2) + ["E"]


def _ct_examples(start: int, n: int) -> list[CTExample]:
    out = []
    for i in range(start, start + n):
        pattern, concept = PATTERNS[i % len(PATTERNS)], CONCEPTS[i % len(CONCEPTS)].split()
        tokens, tags = [], []
        for w in pattern.split():
            if w == "{}":
                tokens += concept
                tags += _concept_tags(len(concept))
            else:
                tokens.append(w)
                tags.append("N")
        out.append(CTExample(tuple(tokens), tuple(tags)))
    return out


def _ad_examples(start: int, n_snippets: int) -> list[ADExample]:
    out = []
    for i in range(start, start + n_snippets):
        name = NAMES[i % len(NAMES)]
        snippet = f"the {name} {FILLERS[i % len(FILLERS)]} number {i}"
        acr = "".join(w[0] for w in name.split())
        neg = acr[:-1] + ("z" if acr[-1] != "z" else "q")
        out += [ADExample(acr, snippet, 1), ADExample(neg, snippet, 0)]
    return out


# Unit counts differ between splits (CT words: see the asserts), so a hook can tell which split was scored.
CT_TRAIN, CT_VAL, CT_TEST = _ct_examples(0, 24), _ct_examples(24, 8), _ct_examples(40, 11)
AD_TRAIN, AD_VAL, AD_TEST = _ad_examples(0, 12), _ad_examples(12, 4), _ad_examples(17, 5)
DATA = {"ct": (CT_TRAIN, CT_VAL, CT_TEST), "ad": (AD_TRAIN, AD_VAL, AD_TEST)}


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    """A storage root holding one tiny pretrained model (mlm, nsp, whp, pad) written as `models.export_final` does."""
    from alignlab.platform.sources.sources import read_bundled

    root = tmp_path_factory.mktemp("ft-storage")
    final = root / "models" / MODEL_ID / "final"
    final.mkdir(parents=True)
    docs = list(read_bundled(("en",), max_docs_per_lang=200))
    train_tokenizer([d.text for d in docs], final / "tokenizer.model", vocab_size=500)
    tok = Tokenizer(final / "tokenizer.model")
    cfg = MODEL_SIZES["tiny"]
    torch.manual_seed(123)
    objectives = {c.name: c.build(tok) for c in resolve_objectives("mlm,nsp,whp,pad")}
    model = AlignModel(cfg, tok.vocab_size, objectives)
    torch.save(model.state_dict(), final / "model.pt")
    write_json(final / "model_config.json", {"model": dataclasses.asdict(cfg), "vocab_size": tok.vocab_size,
                                             "heads": list(model.heads.keys()), "pretrain": {}})
    write_json(final / "eval.json", {"step": 0})
    write_json(root / "models" / MODEL_ID / "config.json", {"model_id": MODEL_ID})
    return root


@pytest.fixture(scope="module")
def pre(storage):
    return load_pretrained(storage / "models" / MODEL_ID)


def _cfg(task: str, **kw) -> FinetuneConfig:
    base = dict(task=task, budget=10, max_epochs=3, patience=5, batch_size=8, lr=1e-2, selection="honest")
    return FinetuneConfig(**{**base, **kw})


def _run(pre, task: str, **kw) -> Calculation:
    train, val, test = DATA[task]
    cfg = _cfg(task, **kw)
    other = DATA["ad" if task == "ct" else "ct"][0] if cfg.scheme == "mt:pred+trm" else None
    return finetune_calculation(pre, cfg, train, test, val=val if cfg.selection == "honest" else None,
                           other_task_train=other)


def _enc_state(model_or_state) -> dict[str, torch.Tensor]:
    sd = model_or_state.state_dict() if hasattr(model_or_state, "state_dict") else model_or_state
    prefix = "" if hasattr(model_or_state, "state_dict") else "encoder."
    return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}


def _head_state(state: dict, name: str) -> dict[str, torch.Tensor]:
    return {k[len(f"heads.{name}."):]: v for k, v in state.items() if k.startswith(f"heads.{name}.")}


def _same(a: dict, b: dict) -> bool:
    assert a.keys() == b.keys() and a
    return all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------------- metrics


def _by_hand(model: AlignModel, tok: Tokenizer, task: str, examples) -> dict[str, float]:
    """Each example alone (no padding), its own input built here, then mean CE over words / pairs."""
    model.eval()
    nlls, hits = [], []
    with torch.no_grad():
        for ex in examples:
            if task == "ct":
                ids, first = [tok.cls_id], []
                for word in ex.tokens:
                    first.append(len(ids))
                    ids += tok.sp.encode(word) or [tok.unk_id]
                ids.append(tok.sep_id)
                h = model.encoder(torch.tensor([ids]), torch.zeros(1, len(ids), dtype=torch.long))[0]
                logp = torch.log_softmax(model.heads["ct"](h[first]), -1)
                gold = [WHP_TAGS.index(t) for t in ex.tags]
            else:
                acr = [tok._letter_ids[c] for c in ex.acronym]
                snip = [p for w in ex.snippet.split() for p in tok.sp.encode(w)]
                ids = [tok.cls_id, *acr, tok.sep_id, *snip, tok.sep_id]
                seg = [0] * (len(acr) + 2) + [1] * (len(snip) + 1)
                h = model.encoder(torch.tensor([ids]), torch.tensor([seg]))[0]
                logp = torch.log_softmax(model.heads["ad"](h[:1]), -1)
                gold = [ex.label]
            for row, g in zip(logp, gold):
                nlls.append(-row[g].item())
                hits.append(int(row.argmax().item() == g))
    return {"accuracy": sum(hits) / len(hits), "perplexity": math.exp(sum(nlls) / len(nlls)), "count": len(hits)}


@pytest.mark.parametrize("task", ["ct", "ad"])
def test_metrics_equal_a_hand_computation_over_words_for_ct_and_pairs_for_ad(pre, task):
    model = build_task_model(pre, task, keep_head=True, dropout=0.1, seed=0)
    test = DATA[task][2]
    hand = _by_hand(model, pre.tok, task, test)
    assert hand["count"] == (sum(len(e.tokens) for e in test) if task == "ct" else len(test))
    got = evaluate_examples(model, task_named(task), test, pre.tok, batch_size=4)  # batches of 4: padding must not matter
    assert got["count"] == hand["count"]
    assert got["accuracy"] == pytest.approx(hand["accuracy"], abs=1e-6)
    assert got["perplexity"] == pytest.approx(hand["perplexity"], rel=1e-5)
    assert 1.0 < got["perplexity"] < 10.0


@pytest.mark.parametrize("task", ["ct", "ad"])
def test_a_calculation_reports_the_test_metrics_of_the_best_perplexity_model_it_returns(pre, task):
    res = _run(pre, task, scheme="pred+trm")
    hand = _by_hand(res.model, pre.tok, task, DATA[task][2])
    assert res.row["accuracy"] == pytest.approx(hand["accuracy"], abs=1e-6)
    assert res.row["perplexity"] == pytest.approx(hand["perplexity"], rel=1e-5)
    assert res.row["num_test"] == len(DATA[task][2])


# ------------------------------------------------------------------------------------------- schemes


def test_pred_scheme_leaves_every_encoder_weight_unchanged(pre):
    res = _run(pre, "ct", scheme="pred")
    assert _same(_enc_state(res.model.encoder), _enc_state(pre.state))
    assert not _same(res.model.heads["ct"].state_dict(), _head_state(pre.state, "whp")), "the head must learn"


def _split_encoder(state: dict) -> tuple[dict, dict]:
    emb = {k: v for k, v in state.items() if not k.startswith("layers.")}
    layers = {k: v for k, v in state.items() if k.startswith("layers.")}
    return emb, layers


@pytest.mark.parametrize("task", ["ct", "ad"])
def test_pred_trm_changes_the_transformer_layers_but_not_the_embeddings(pre, task):
    res = _run(pre, task, scheme="pred+trm")
    emb, layers = _split_encoder(_enc_state(res.model.encoder))
    emb0, layers0 = _split_encoder(_enc_state(pre.state))
    assert {k.split(".")[0] for k in emb} == {"tok", "pos", "seg", "ln"}
    assert _same(emb, emb0)
    assert all(not torch.equal(layers[k], layers0[k]) for k in layers if k.endswith(".weight")), \
        "every transformer weight matrix and layer norm should have moved"


def test_pred_trm_emb_changes_the_embeddings_too(pre):
    res = _run(pre, "ct", scheme="pred+trm+emb")
    emb, layers = _split_encoder(_enc_state(res.model.encoder))
    emb0, layers0 = _split_encoder(_enc_state(pre.state))
    for name in ("tok.weight", "pos.weight", "ln.weight"):
        assert not torch.equal(emb[name], emb0[name]), f"{name} did not change"
    assert not _same(layers, layers0)


def test_mt_scheme_trains_both_task_heads_while_single_task_leaves_the_other_head_alone(pre):
    init = build_task_model(pre, "ct", keep_head=True, dropout=0.1, seed=0)
    mt = _run(pre, "ct", scheme="mt:pred+trm").model
    single = _run(pre, "ct", scheme="pred+trm").model
    for t in ("ct", "ad"):
        assert not _same(mt.heads[t].state_dict(), init.heads[t].state_dict()), f"mt did not train the {t} head"
    assert not _same(single.heads["ct"].state_dict(), init.heads["ct"].state_dict())
    assert _same(single.heads["ad"].state_dict(), init.heads["ad"].state_dict())


def test_a_task_object_other_than_the_one_the_config_names_is_refused(pre):
    with pytest.raises(ValueError, match="the task object is 'ad', the config names 'ct'"):
        finetune_calculation(pre, _cfg("ct"), CT_TRAIN, CT_TEST, val=CT_VAL, task=AD)


def test_mt_scheme_without_the_other_tasks_examples_is_a_value_error(pre):
    with pytest.raises(ValueError, match="other_task_train"):
        finetune_calculation(pre, _cfg("ct", scheme="mt:pred+trm"), CT_TRAIN, CT_TEST, val=CT_VAL)


def _training_batches(pre, task: str, seed: int) -> list[tuple[int, ...]]:
    """The training examples of each batch, in the order a calculation trained on them (encoder forwards
    of training rows, recorded by a hook; scheme pred+trm runs the encoder on every batch)."""
    train, val, test = DATA[task]
    enc = encode_examples(task_named(task), train, pre.tok, pre.model_cfg.max_len)
    rows = {tuple(r.tolist()): i for i, r in enumerate(enc.input_ids)}
    with _EncoderCalls() as calls:
        finetune_calculation(pre, _cfg(task, scheme="pred+trm", max_epochs=2, seed=seed), train, test, val=val)
    batches = [tuple(rows.get(tuple(r.tolist()), -1) for r in x) for x in calls.inputs
               if x.shape[1] == enc.input_ids.shape[1]]
    return [b for b in batches if -1 not in b]


@pytest.mark.parametrize("task", ["ct", "ad"])
def test_the_seed_changes_the_initialisation_and_the_batch_order_of_the_same_examples(pre, task):
    """The other half of the protocol's seeds (tests/test_protocol.py: a seed never changes the examples)."""
    fresh = [build_task_model(pre, task, keep_head=False, dropout=0.1, seed=s).heads[task].state_dict() for s in (0, 1)]
    assert all(not torch.equal(fresh[0][k], fresh[1][k]) for k in fresh[0] if k.endswith("weight"))
    order0, order1 = _training_batches(pre, task, 0), _training_batches(pre, task, 1)
    n = len(DATA[task][0])
    for order in (order0, order1):  # two epochs, each every training example exactly once
        assert sorted(i for b in order for i in b) == sorted(list(range(n)) * 2)
    assert order0 != order1, "seed 1 must visit the same examples in another order"
    assert order0 == _training_batches(pre, task, 0), "the same seed gives the same order"


def test_a_seeds_randomness_is_its_own_in_every_fold_so_the_folds_are_independent_replicates(pre, monkeypatch):
    """The report's decision treats the five folds as independent replicates of the finetuning randomness: a seed
    must not initialise every fold's head alike (a lucky initialisation would then lift all five folds together,
    which nothing in the folds' spread could show)."""
    from alignlab.platform.fel import finetune as ft

    heads = {}
    real = ft.build_task_model

    def recording(*args, **kw):
        model = real(*args, **kw)
        heads.setdefault(kw["seed"], {k: v.clone() for k, v in model.heads["ct"].state_dict().items()})
        return model

    monkeypatch.setattr(ft, "build_task_model", recording)
    train, val, test = DATA["ct"]
    for fold in (0, 1):
        finetune_calculation(pre, _cfg("ct", max_epochs=1, seed=0, fold=fold, keep_head=False), train, test, val=val)
    assert len(heads) == 2, "seed 0 of fold 0 and seed 0 of fold 1 draw their own heads"
    a, b = heads.values()
    assert all(not torch.equal(a[k], b[k]) for k in a if k.endswith("weight"))


# ------------------------------------------------------------------------------------------- heads


@pytest.mark.parametrize("task,aligned", [("ct", "whp"), ("ad", "pad")])
def test_keep_head_loads_the_pretrained_aligned_head_and_discard_reinitialises_it(pre, task, aligned):
    pretrained = _head_state(pre.state, aligned)
    kept = build_task_model(pre, task, keep_head=True, dropout=0.1, seed=0).heads[task].state_dict()
    fresh = build_task_model(pre, task, keep_head=False, dropout=0.1, seed=0).heads[task].state_dict()
    assert _same(kept, pretrained)
    assert all(not torch.equal(fresh[k], pretrained[k]) for k in fresh if k.endswith("weight"))
    # A model pretrained without the aligned objective has nothing to keep: the head is fresh either way.
    without = dataclasses.replace(pre, heads=[h for h in pre.heads if h != aligned])
    assert _same(build_task_model(without, task, keep_head=True, dropout=0.1, seed=0).heads[task].state_dict(), fresh)


# ------------------------------------------------------------------------------------------- selection


class _EncoderCalls:
    """Records the input_ids of every Encoder forward (a global torch hook, removed on exit)."""

    def __enter__(self):
        from alignlab.platform.encoder.model import Encoder

        self.inputs = []
        self.handle = torch.nn.modules.module.register_module_forward_hook(
            lambda m, args, out: self.inputs.append(args[0].clone()) if isinstance(m, Encoder) else None)
        return self

    def __exit__(self, *exc):
        self.handle.remove()

    def count(self, enc) -> int:
        return sum(x.shape == enc.input_ids.shape and torch.equal(x, enc.input_ids) for x in self.inputs)


@pytest.mark.parametrize("task", ["ct", "ad"])
def test_honest_selection_scores_val_every_epoch_and_the_test_set_only_for_the_two_selected_epochs(pre, task):
    train, val, test = DATA[task]
    cfg = _cfg(task, scheme="pred+trm", max_epochs=4)
    seen = []
    with _EncoderCalls() as calls:
        res = finetune_calculation(pre, cfg, train, test, val=val, on_epoch=lambda e, m: seen.append(m))
    L, t = pre.model_cfg.max_len, task_named(task)
    enc_test, enc_val = encode_examples(t, test, pre.tok, L), encode_examples(t, val, pre.tok, L)
    assert res.row["epochs_run"] == len(seen) == 4
    assert calls.count(enc_val) == 4, "validation is scored once per epoch"
    assert calls.count(enc_test) == 2, "the test set is scored only at the best-perplexity and best-accuracy epochs"
    # What on_epoch saw at the selected epoch is the kept model's score on val, not on test.
    at_best = seen[res.row["epochs"] - 1]
    model = res.model
    assert at_best["perplexity"] == pytest.approx(evaluate_examples(model, t, val, pre.tok)["perplexity"], rel=1e-6)
    assert res.row["perplexity"] == pytest.approx(evaluate_examples(model, t, test, pre.tok)["perplexity"], rel=1e-6)
    assert res.row["perplexity"] != pytest.approx(at_best["perplexity"], rel=1e-6)


def test_paper_selection_scores_the_test_set_every_epoch_and_honest_requires_a_validation_split(pre):
    train, _, test = DATA["ct"]
    with _EncoderCalls() as calls:
        res = finetune_calculation(pre, _cfg("ct", scheme="pred+trm", selection="paper", max_epochs=3), train, test)
    assert calls.count(encode_examples(CT, test, pre.tok, pre.model_cfg.max_len)) == res.row["epochs_run"] == 3
    with pytest.raises(ValueError, match="validation split"):
        finetune_calculation(pre, _cfg("ct"), train, test, val=[])


# Selection metrics scripted per epoch: perplexity is best at epoch 2 and then worsens (overconfidence), while
# accuracy keeps improving until epoch 7 -- the case where stopping on perplexity alone cut the best-accuracy
# column short.
SCRIPTED = [(0.60, 2.0), (0.62, 1.8), (0.63, 1.9), (0.64, 2.0), (0.65, 2.1), (0.66, 2.2), (0.70, 2.3),
            (0.69, 2.4), (0.68, 2.5), (0.67, 2.6), (0.66, 2.7), (0.65, 2.8)]


def test_training_goes_on_until_neither_best_perplexity_nor_best_accuracy_improved_for_patience_epochs(pre, monkeypatch):
    import alignlab.platform.fel.finetune as ft

    train, val, test = DATA["ct"]
    n_val_units = sum(len(e.tokens) for e in val)
    assert n_val_units != sum(len(e.tokens) for e in test)
    real, script = ft.metrics_from_logits, iter(SCRIPTED)

    def scripted(logits, labels):  # the validation split's score each epoch; the test set's is real
        if labels.numel() != n_val_units:
            return real(logits, labels)
        acc, ppl = next(script)
        return {"accuracy": acc, "perplexity": ppl}

    monkeypatch.setattr(ft, "metrics_from_logits", scripted)
    seen = []
    res = finetune_calculation(pre, _cfg("ct", scheme="pred", max_epochs=len(SCRIPTED), patience=2), train, test, val=val,
                          on_epoch=lambda e, m: seen.append(m))
    assert res.row["epochs"] == 2, "best validation perplexity"
    assert res.row["best_accuracy_epoch"] == 7, "the best validation accuracy, five epochs after the best perplexity"
    assert res.row["epochs_run"] == len(seen) == 9, "stopped 2 (patience) epochs after the later of the two, not at epoch 4"
    # And a run whose accuracy stops improving first still runs to the perplexity's patience.
    script = iter([(0.7, 2.0), (0.6, 1.9), (0.6, 1.8), (0.6, 1.7), (0.6, 1.8), (0.6, 1.9), (0.6, 2.0)])
    res = finetune_calculation(pre, _cfg("ct", scheme="pred", max_epochs=7, patience=2), train, test, val=val)
    assert (res.row["epochs"], res.row["best_accuracy_epoch"], res.row["epochs_run"]) == (4, 1, 6)


@pytest.mark.parametrize("selection", ["honest", "paper"])
@pytest.mark.parametrize("task,scheme", [("ct", "pred+trm"), ("ad", "pred+trm"), ("ct", "pred")])
def test_best_accuracy_is_never_below_the_accuracy_at_the_best_perplexity_epoch(pre, task, scheme, selection):
    """What is asserted, on the selection split's terms (validation in honest mode, the test set in paper mode):
    the selection accuracy at the best-accuracy epoch >= the selection accuracy at the best-perplexity epoch,
    both epochs are the first best over every epoch run, and the run stopped only when neither had improved for
    `patience` epochs (or at max_epochs). In honest mode the two reported *test* accuracies may legitimately be
    in either order -- each is the test score of an epoch chosen on validation -- so they are not compared."""
    train, val, test = DATA[task]
    seen, patience, max_epochs = [], 2, 25
    res = finetune_calculation(pre, _cfg(task, scheme=scheme, max_epochs=max_epochs, patience=patience, selection=selection),
                          train, test, val=val if selection == "honest" else None, on_epoch=lambda e, m: seen.append(m))
    acc = [m["accuracy"] for m in seen]
    ppl = [m["perplexity"] for m in seen]
    assert res.row["best_accuracy_epoch"] == acc.index(max(acc)) + 1
    assert res.row["epochs"] == ppl.index(min(ppl)) + 1
    assert acc[res.row["best_accuracy_epoch"] - 1] >= acc[res.row["epochs"] - 1]
    run = res.row["epochs_run"]
    assert run == len(seen)
    assert run == max_epochs or (run - res.row["epochs"] >= patience and run - res.row["best_accuracy_epoch"] >= patience)
    assert run == max_epochs or (run - res.row["epochs"] == patience or run - res.row["best_accuracy_epoch"] == patience), \
        "stopped at the first epoch where both had stopped improving"
    if selection == "paper":  # selected on the test set itself: the reported columns obey the same order
        assert res.row["best_accuracy"] >= res.row["accuracy"]


# ------------------------------------------------------------------------------------------- save, evaluate, predict


@pytest.mark.parametrize("task,scheme", [("ad", "pred"), ("ct", "pred+trm")])
def test_save_then_evaluate_gives_the_same_accuracy_and_perplexity(storage, pre, task, scheme):
    cfg = _cfg(task, scheme=scheme)
    train, val, test = DATA[task]
    res = finetune_calculation(pre, cfg, train, test, val=val)
    fdir = save_finetuned(storage, pre, cfg, res)
    assert fdir == finetuned_dir(storage, fdir.name) and fdir.name.startswith(f"{task}-")
    assert {p.name for p in fdir.iterdir()} == {"model.pt", "tokenizer.model", "model_config.json", "finetune.json",
                                                "metrics.json", "_finished.json"}
    ft = load_finetuned(fdir)
    assert ft.cfg == cfg and ft.task_heads == (task,) and ft.pretrained_heads == ("whp", "pad")
    assert _same(ft.model.heads["pad"].state_dict(), _head_state(pre.state, "pad")), "pretrained PAD head kept as is"
    again = evaluate_examples(ft.model, task_named(task), test, ft.tok)
    assert again["accuracy"] == pytest.approx(res.row["accuracy"], abs=1e-6)
    assert again["perplexity"] == pytest.approx(res.row["perplexity"], rel=1e-6)
    # Saving the same calculation again names the same model and replaces it whole.
    assert save_finetuned(storage, pre, cfg, res) == fdir
    assert not [p for p in fdir.parent.iterdir() if p.name.startswith(".")], "no temporary folders left behind"


def test_the_fast_predictor_matches_the_module_forward(storage, pre):
    cfg = _cfg("ad", scheme="pred+trm")
    res = finetune_calculation(pre, cfg, AD_TRAIN, AD_TEST, val=AD_VAL)
    ft = load_finetuned(save_finetuned(storage, pre, cfg, res))
    model, tok = ft.model, ft.tok
    enc = encode_examples(AD, AD_TEST[:1], tok, model.cfg.max_len)
    backends = ["aten"] + (["mkldnn"] if _mkldnn_linear_ok() else []) + (["mkl"] if _mkl_linear_ok() else [])
    from alignlab.platform.fel.inference import default_backend

    # The predictor takes the backend this CPU runs fastest (timed once): MKL on Intel, oneDNN on AMD.
    assert Predictor(ft).enc.backend == default_backend() and default_backend() in backends
    if len(backends) == 3:
        assert default_backend() != "aten", "a packed backend was available but not taken"
    with torch.no_grad():
        ref = model.encoder(enc.input_ids, enc.segment_ids)[0]
        for backend in backends:
            fast = FastEncoder(model.encoder, backend)
            torch.testing.assert_close(fast(enc.input_ids[0], enc.segment_ids[0]), ref, rtol=1e-4, atol=1e-5)
            rows = torch.tensor([0, 3])
            torch.testing.assert_close(fast(enc.input_ids[0], enc.segment_ids[0], rows), ref[rows], rtol=1e-4,
                                       atol=1e-5)
            ct_ids = encode_examples(CT, CT_TEST[:1], tok, model.cfg.max_len).input_ids[0]
            torch.testing.assert_close(fast(ct_ids), model.encoder(ct_ids[None], torch.zeros_like(ct_ids)[None])[0],
                                       rtol=1e-4, atol=1e-5)
            every = model.encoder(enc.input_ids, enc.segment_ids, layers="all")[0]  # a head reading every layer
            torch.testing.assert_close(fast(enc.input_ids[0], enc.segment_ids[0], None, "all"), every, rtol=1e-4,
                                       atol=1e-4)
            torch.testing.assert_close(fast(enc.input_ids[0], enc.segment_ids[0], rows, "all"), every[rows],
                                       rtol=1e-4, atol=1e-4)
        p = torch.softmax(model.heads["ad"](ref[:1]), -1)[0, 1].item()
        p_pad = torch.softmax(model.heads["pad"](ref[:1]), -1)[0, 1].item()
    scores = Predictor(ft).acronym_scores(AD_TEST[0].acronym, AD_TEST[0].snippet)
    assert scores["ad"] == pytest.approx(p, abs=1e-5) and scores["pad"] == pytest.approx(p_pad, abs=1e-5)


def test_predicted_tags_are_the_ct_heads_argmax_at_each_words_first_piece(storage, pre):
    cfg = _cfg("ct", scheme="pred+trm")
    res = finetune_calculation(pre, cfg, CT_TRAIN, CT_TEST, val=CT_VAL)
    ft = load_finetuned(save_finetuned(storage, pre, cfg, res))
    ex = CT_TEST[0]
    enc = encode_examples(CT, [ex], ft.tok, ft.model.cfg.max_len)
    with torch.no_grad():
        h = ft.model.encoder(enc.input_ids, enc.segment_ids)[0]
        want = [WHP_TAGS[i] for i in ft.model.heads["ct"](h[enc.labels[0] != -100]).argmax(-1).tolist()]
    pred = Predictor(ft)
    assert pred.tag(ex.tokens) == want
    assert pred.bracket(" ".join(ex.tokens)) == tags_to_brackets(ex.tokens, want)
    with pytest.raises(ValueError, match="no 'ad' head"):
        pred.acronym_score("wow", "world of warcraft")


@pytest.mark.parametrize("text", ["when was the first super mario released",
                                  "Zoë's café ☃ 100% naïve x​ y ＡＢＣ ﬁsh l'été",  # accents, unknown, NFKC
                                  "​ lone zero width word"])
def test_word_pieces_from_one_encode_equal_encoding_word_by_word(pre, text):
    words = text.split()
    assert word_pieces(pre.tok, words) == [pre.tok.sp.encode(w) for w in words]
    ids, first = ct_input(pre.tok, words, 64)
    assert len(first) == len(words) and ids[0] == pre.tok.cls_id and ids[-1] == pre.tok.sep_id
    assert ad_input(pre.tok, "wow", text, 64, "letters")[0][5:-1] == [p for w in words for p in pre.tok.sp.encode(w)]


def test_tags_become_brackets_as_in_the_papers_case_study():
    words = "when was the first super mario released".split()
    assert tags_to_brackets(words, ["N", "N", "N", "N", "S", "E", "N"]) == "when was the first [super mario] released"
    # WHP's independent per-word tags can nest; they are printed as predicted (paper §4.1).
    nested = tags_to_brackets(words, ["S", "N", "S", "N", "S", "E", "E"])
    assert nested == "[when was [the first [super mario] released]"
    assert tags_to_brackets("skyrim 100% completion".split(), ["SE", "S", "E"]) == "[skyrim] [100% completion]"
    with pytest.raises(ValueError):
        tags_to_brackets(["a", "b"], ["N"])


# ------------------------------------------------------------------------------------------- the command line


@pytest.mark.parametrize("head_input", [[], ["--feature-layers", "all", "--word-pooling", "mean"]])
def test_cli_finetune_save_then_evaluate_and_predict(storage, tmp_path, capsys, head_input):
    tdir = tmp_path / "tasks"
    write_jsonl(tdir / "ad.jsonl", AD_TRAIN + AD_VAL + AD_TEST)
    write_jsonl(tdir / "ct_pool.jsonl", CT_TRAIN + CT_VAL)
    write_jsonl(tdir / "ct_test.jsonl", CT_TEST)
    common = ["--storage", str(storage)]
    assert main(["finetune", "--preset", "smoke", "--model", MODEL_ID, "--task", "ct", "--budget", "20",
                 "--scheme", "pred+trm", "--tasks-dir", str(tdir), "--save", *head_input, *common]) == 0
    out = capsys.readouterr().out
    row = json.loads(out.splitlines()[0])
    assert row["head_input"] == ("all:mean" if head_input else "last:first")
    fid = out.split("Finetuned model: ")[1].split()[0]
    assert (storage / "finetuned" / fid / "model.pt").exists()

    assert main(["evaluate", "--model", fid, "--task", "ct", str(tdir / "ct_test.jsonl"),
                 "--json", str(tmp_path / "m.json"), *common]) == 0
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["accuracy"] == pytest.approx(row["accuracy"], abs=1e-4)
    assert m["perplexity"] == pytest.approx(row["perplexity"], abs=1e-4)
    assert f"accuracy {m['accuracy']:.4f}" in capsys.readouterr().out

    assert main(["predict", "--model", fid, "when was the first super mario released", *common]) == 0
    line = capsys.readouterr().out.strip()
    assert line.replace("[", "").replace("]", "") == "when was the first super mario released"

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"tokens": ["a", "b"], "tags": ["N", "N"]}\n{"tokens": ["x"], "tags": ["Q"]}\n')
    assert main(["evaluate", "--model", fid, "--task", "ct", str(bad), *common]) == 2
    assert f"{bad}:2: unknown tag 'Q'" in capsys.readouterr().err
    assert main(["predict", "--model", "ct-nope", "a query", *common]) == 2
    assert main(["predict", "--model", fid, "--acronym", "wow", "--snippet", "world of warcraft", *common]) == 2
    assert "no 'ad' head" in capsys.readouterr().err
    shutil.rmtree(storage / "finetuned" / fid)


# ------------------------------------------------------------------------------------------- devices

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (and a torch built for it)")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]


def _forward_devices(fn):
    """Run `fn`; returns its value and {device: names of the modules whose forward saw a tensor input or a
    parameter there}, from a global forward pre-hook (the calculation builds its model inside)."""
    seen: dict[torch.device, set[str]] = {}

    def hook(module, args):
        for t in [*(a for a in args if torch.is_tensor(a)), *module.parameters(recurse=False)]:
            seen.setdefault(t.device, set()).add(type(module).__name__)

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        return fn(), seen
    finally:
        handle.remove()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("task,scheme,head", [("ct", "pred", "TokenHead"), ("ad", "mt:pred+trm", "SequenceHead")])
def test_a_calculation_runs_its_encoder_heads_features_and_batches_on_the_device_it_is_given(pre, device, task,
                                                                                               scheme, head):
    train, val, test = DATA[task]
    cfg = _cfg(task, scheme=scheme)
    other = DATA["ad" if task == "ct" else "ct"][0] if scheme == "mt:pred+trm" else None
    res, seen = _forward_devices(lambda: finetune_calculation(pre, cfg, train, test, val=val, other_task_train=other,
                                                             device=device))
    # `pred` trains the head on the cached encoder features: the head's inputs are those features.
    assert {d.type for d in seen} == {device}, f"tensors met modules on {seen}"
    assert {"Encoder", head} <= seen[next(iter(seen))]
    assert res.row["device"] == device
    assert {p.device.type for p in res.model.parameters()} == {device}


@CUDA
@pytest.mark.parametrize("task,scheme", [("ct", "pred"), ("ad", "pred"), ("ct", "pred+trm"), ("ad", "mt:pred+trm")])
def test_a_calculation_on_cuda_gives_the_cpu_numbers_and_its_saved_model_loads_and_serves_on_the_cpu(storage, pre,
                                                                                                    task, scheme):
    # No dropout: its masks come from the CPU or the CUDA generator, which draw differently; without it the two
    # devices differ only by float rounding.
    cfg = _cfg(task, scheme=scheme, dropout=0.0)
    train, val, test = DATA[task]
    other = DATA["ad" if task == "ct" else "ct"][0] if scheme == "mt:pred+trm" else None
    on_cpu, on_cuda = (finetune_calculation(pre, cfg, train, test, val=val, other_task_train=other, device=d)
                       for d in ("cpu", "cuda"))
    assert on_cuda.row["device"] == "cuda" and next(on_cuda.model.parameters()).is_cuda
    units = on_cpu.row["num_test"] if task == "ad" else sum(len(e.tokens) for e in test)
    for k in ("epochs", "epochs_run", "best_accuracy_epoch"):
        assert on_cuda.row[k] == on_cpu.row[k], k
    for k in ("accuracy", "best_accuracy"):
        assert on_cuda.row[k] == pytest.approx(on_cpu.row[k], abs=1.01 / units), k  # at most one unit flips
    for k in ("perplexity", "perplexity_at_best_accuracy"):
        assert on_cuda.row[k] == pytest.approx(on_cpu.row[k], rel=1e-3), k
    # The kept model is scored where it is (a study's extra test sets), and its test numbers are the row's.
    on_gpu = evaluate_examples(on_cuda.model, task_named(task), test, pre.tok)
    assert on_gpu["perplexity"] == pytest.approx(on_cuda.row["perplexity"], rel=1e-5)
    # Saved from CUDA, loaded where there may be no GPU: the weights are on the CPU and score as they did.
    ft = load_finetuned(save_finetuned(storage, pre, cfg, on_cuda))
    assert {p.device.type for p in ft.model.parameters()} == {"cpu"}
    again = evaluate_examples(ft.model, task_named(task), test, ft.tok)
    assert again["perplexity"] == pytest.approx(on_cuda.row["perplexity"], rel=1e-4)
    assert Predictor(ft).enc is not None
    shutil.rmtree(ft.fdir)


@pytest.mark.ray
@pytest.mark.parametrize("gpus", [0, pytest.param(0.5, marks=CUDA)])
def test_an_fel_trial_runs_on_cuda_exactly_when_ray_gave_it_a_gpu(ray_session, gpus):
    from alignlab.platform.study.grid import trial_device

    # Ray sets the trial's CUDA_VISIBLE_DEVICES to its own GPU, which torch then calls cuda:0.
    assert ray_session.get(ray_session.remote(trial_device).options(num_gpus=gpus).remote()) == \
        ("cuda:0" if gpus else "cpu")


# ------------------------------------------------------------------------------------------- refit on the whole budget


@pytest.mark.parametrize("scheme", ["pred", "pred+trm"])
def test_refit_trains_the_selected_epochs_again_on_training_and_validation_examples_and_keeps_that_model(pre, scheme):
    from alignlab.platform.fel.finetune import _Fit

    cfg = _cfg("ct", scheme=scheme, max_epochs=6, patience=6, refit=True)
    plain = finetune_calculation(pre, dataclasses.replace(cfg, refit=False), CT_TRAIN, CT_TEST, val=CT_VAL)
    refit = finetune_calculation(pre, cfg, CT_TRAIN, CT_TEST, val=CT_VAL)
    # The epochs are selected by the same run on the validation split; then trained again on train + val.
    assert (refit.row["epochs"], refit.row["best_accuracy_epoch"]) == (plain.row["epochs"], plain.row["best_accuracy_epoch"])
    assert refit.row["refit"] and refit.row["num_train"] == len(CT_TRAIN) + len(CT_VAL) == plain.row["num_train"] + len(CT_VAL)
    by_hand = _Fit(pre, cfg, (CT,), encode_examples(CT, CT_TRAIN + CT_VAL, pre.tok, pre.model_cfg.max_len), None, "cpu")
    for _ in range(plain.row["epochs"]):
        by_hand.epoch()
    kept, manual = refit.model.state_dict(), by_hand.model.state_dict()
    assert all(torch.equal(kept[k], manual[k]) for k in kept), "the kept model is not the refit one"
    assert any(not torch.equal(v, plain.model.state_dict()[k]) for k, v in kept.items())
    assert refit.row["accuracy"] == pytest.approx(evaluate_examples(refit.model, CT, CT_TEST, pre.tok)["accuracy"])


def test_refit_is_refused_on_the_examples_it_trains_on_and_with_paper_selection(pre):
    with pytest.raises(ValueError, match="cannot be scored on it"):
        finetune_calculation(pre, _cfg("ct", refit=True), CT_TRAIN, CT_VAL, val=CT_VAL)
    with pytest.raises(ValueError, match="refit needs honest selection"):
        _cfg("ct", refit=True, selection="paper")


def test_refit_off_leaves_a_configs_dict_and_ids_as_they_were_before_the_field():
    from alignlab.platform.config import config_hash, to_dict
    from alignlab.platform.fel.finetune import finetuned_id
    from alignlab.platform.presets import Preset

    off, on = _cfg("ct"), _cfg("ct", refit=True)
    assert "refit" not in to_dict(off) and to_dict(on)["refit"] is True
    assert finetuned_id("m", off) == f"ct-{config_hash('m', {f: v for f, v in to_dict(on).items() if f != 'refit'})}"
    assert finetuned_id("m", on) != finetuned_id("m", off)
    assert Preset.named("mini").finetune.refit and not Preset.named("smoke").finetune.refit


# ------------------------------------------------------------------------------------------- what a head reads


def _multi_piece_example(tok) -> CTExample:
    """A CT test example with a word of several pieces (mean pooling must differ from the first piece there)."""
    for ex in CT_TEST:
        if any(len(p) > 1 for p in word_pieces(tok, ex.tokens)):
            return ex
    raise AssertionError("no CT test example has a word of several pieces in the tiny vocabulary")


def test_reading_every_layer_gives_the_head_each_layers_normalised_output_side_by_side(pre):
    model = build_task_model(pre, "ct", keep_head=False, dropout=0.0, seed=0).eval()
    enc = encode_examples(CT, CT_TEST[:3], pre.tok, pre.model_cfg.max_len)
    e = model.encoder
    with torch.no_grad():
        x = e.embed(enc.input_ids, enc.segment_ids)
        mask = e.distance_bias(x.shape[1], x.dtype, x.device, enc.attention_mask[:, None, None, :]) \
            if e.cfg.alibi else enc.attention_mask[:, None, None, :]
        states = [x]
        for layer in e.layers:
            states.append(layer(states[-1], mask))
        H = x.shape[-1]
        last = e(enc.input_ids, enc.segment_ids, enc.attention_mask)
        want = torch.cat([torch.nn.functional.layer_norm(s, (H,)) for s in states[:-1]] + [last], -1)
        got = e(enc.input_ids, enc.segment_ids, enc.attention_mask, layers="all")
    assert got.shape[-1] == (pre.model_cfg.num_layers + 1) * H
    torch.testing.assert_close(got, want)


def test_mean_pooling_gives_each_word_the_mean_of_its_pieces_and_first_pooling_its_first_piece(pre):
    from alignlab.platform.fel.head_input import HeadInput
    from alignlab.platform.fel.task_scoring import unit_vectors

    ex = _multi_piece_example(pre.tok)
    ids, first = ct_input(pre.tok, ex.tokens, pre.model_cfg.max_len)
    bounds = first + [len(ids) - 1]  # a word runs to the next word's first piece, the last one to [SEP]
    for reads in (HeadInput("last", "mean"), HeadInput("all", "mean"), HeadInput("all", "first")):
        model = build_task_model(pre, "ct", keep_head=False, dropout=0.0, seed=0, reads=reads).eval()
        with torch.no_grad():
            h = model.encoder(torch.tensor([ids]), torch.zeros(1, len(ids), dtype=torch.long), layers=reads.layers)[0]
            got, labels = unit_vectors(model, CT, encode_examples(CT, [ex, *CT_TEST[:2]], pre.tok, 64))
        want = torch.stack([h[a:b].mean(0) if reads.pooling == "mean" else h[a] for a, b in zip(bounds, bounds[1:])])
        torch.testing.assert_close(got[: len(first)], want, rtol=1e-5, atol=1e-5)  # padded beside longer rows
        assert model.heads["ct"].out.in_features == reads.width(pre.model_cfg)
        if reads.pooling == "mean":  # else no word has several pieces, and the test would prove nothing
            assert not torch.allclose(want, h[torch.tensor(first)])


def test_a_kept_pretrained_head_widened_to_every_layer_starts_as_the_pretrained_head(pre):
    from alignlab.platform.fel.head_input import HeadInput
    from alignlab.platform.fel.task_scoring import logits_and_labels

    for task, aligned in (("ct", "whp"), ("ad", "pad")):
        t = task_named(task)
        enc = encode_examples(t, DATA[task][2][:4], pre.tok, pre.model_cfg.max_len)
        plain = build_task_model(pre, task, keep_head=True, dropout=0.0, seed=0).eval()
        wide = build_task_model(pre, task, keep_head=True, dropout=0.0, seed=0, reads=HeadInput("all", "first")).eval()
        with torch.no_grad():
            torch.testing.assert_close(logits_and_labels(wide, t, enc)[0], logits_and_labels(plain, t, enc)[0])
        assert _same(plain.heads[task].state_dict(), _head_state(pre.state, aligned))


@pytest.mark.parametrize("scheme", ["pred", "pred+trm"])
def test_a_saved_model_reading_every_layer_with_mean_pooling_serves_what_it_was_scored_with(storage, pre, scheme):
    from alignlab.platform.fel.head_input import head_input
    from alignlab.platform.fel.task_scoring import logits_and_labels

    cfg = _cfg("ct", scheme=scheme, feature_layers="all", word_pooling="mean", max_epochs=4)
    res = finetune_calculation(pre, cfg, CT_TRAIN, CT_TEST, val=CT_VAL)
    ft = load_finetuned(save_finetuned(storage, pre, cfg, res))
    assert ft.cfg == cfg and head_input(ft.model.heads["ct"]).pooling == "mean"
    assert head_input(ft.model.heads["whp"]).layers == "last", "a pretrained head copy reads what it was trained on"
    assert evaluate_examples(ft.model, CT, CT_TEST, ft.tok)["accuracy"] == pytest.approx(res.row["accuracy"], abs=1e-6)
    pred = Predictor(ft)
    for ex in (_multi_piece_example(ft.tok), *CT_TEST[:3]):
        with torch.no_grad():
            logits, _ = logits_and_labels(ft.model, CT, encode_examples(CT, [ex], ft.tok, ft.model.cfg.max_len))
        assert pred.tag(ex.tokens) == [WHP_TAGS[i] for i in logits.argmax(-1).tolist()]
    whp_tags = pred.tag(CT_TEST[0].tokens, head="whp")  # the pretrained head is served from the fast encoder
    assert len(whp_tags) == len(CT_TEST[0].tokens)


def test_an_ad_head_reading_every_layer_is_served_from_its_cls_vectors(storage, pre):
    cfg = _cfg("ad", feature_layers="all", word_pooling="mean")
    res = finetune_calculation(pre, cfg, AD_TRAIN, AD_TEST, val=AD_VAL)
    ft = load_finetuned(save_finetuned(storage, pre, cfg, res))
    ex = AD_TEST[0]
    enc = encode_examples(AD, [ex], ft.tok, ft.model.cfg.max_len)
    with torch.no_grad():
        h = ft.model.encoder(enc.input_ids, enc.segment_ids, layers="all")[0]
        want = torch.softmax(ft.model.heads["ad"](h[:1]), -1)[0, 1].item()
    assert Predictor(ft).acronym_score(ex.acronym, ex.snippet) == pytest.approx(want, abs=1e-5)


def test_the_head_input_fields_stay_out_of_a_configs_dict_and_ids_at_their_defaults_and_are_validated():
    from alignlab.platform.config import config_hash, to_dict
    from alignlab.platform.fel.finetune import finetuned_id
    from alignlab.platform.presets import Preset

    plain, wide = _cfg("ct"), _cfg("ct", feature_layers="all", word_pooling="mean")
    assert not {"feature_layers", "word_pooling"} & set(to_dict(plain))
    assert to_dict(wide)["feature_layers"] == "all" and to_dict(wide)["word_pooling"] == "mean"
    bare = {f: v for f, v in to_dict(wide).items() if f not in ("feature_layers", "word_pooling")}
    assert finetuned_id("m", plain) == f"ct-{config_hash('m', bare)}" != finetuned_id("m", wide)
    for field, bad in (("feature_layers", "middle"), ("word_pooling", "max")):
        with pytest.raises(ValueError, match=f"FinetuneConfig.{field} must be one of"):
            _cfg("ct", **{field: bad})
    assert Preset.named("paper").finetune.feature_layers == "last" and Preset.named("paper").finetune.word_pooling == "first"
