"""The pretrained aligned head read zero-shot on its task (issue #65: PAD's head on AD's pairs): the numbers are what
the model's own PAD head says of AD's inputs, with no finetuning, whole and by pair kind; a model without a PAD head
gets none; a study scores each model once and keeps it."""
from __future__ import annotations

import pytest
from tiny_model import tiny_pretrained

from alignlab.tasks.ad_kinds import pair_kind
from alignlab.tasks.ct_data import CTExample
from alignlab.platform.fel.finetune import build_task_model, load_pretrained
from alignlab.platform.fel.task_scoring import evaluate_examples
from alignlab.platform.fel.zero_shot import aligned_head_scores, read_zero_shot, record_zero_shot
from alignlab.platform.tasks.task import task as task_named
from alignlab.platform.tasks.task_data import SHIPPED_TASK_DATA
from alignlab.platform.tasks.task_files import write_jsonl


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("zs")
    return tiny_pretrained(root), tiny_pretrained(root, objectives="mlm,nsp,whp")


@pytest.fixture(scope="module")
def ood():
    return task_named("ad").load_examples(SHIPPED_TASK_DATA / "ad_ood.jsonl")[:120]


def test_the_zero_shot_score_is_the_pretrained_pad_head_on_ad_pairs_whole_and_by_kind(models, ood):
    ad = task_named("ad")
    pre = load_pretrained(models[0])
    got = aligned_head_scores(pre, ad, {"ood": ood})
    assert got["head"] == "pad"
    # The same head reached another way: the AD head a calculation starts from when it keeps PAD's (`keep_head`).
    kept = build_task_model(pre, "ad", keep_head=True, dropout=0.0, seed=0)
    want = evaluate_examples(kept, ad, ood, pre.tok, per_unit=True)
    rec = got["sets"]["ood"]
    assert rec["accuracy"] == pytest.approx(want["accuracy"]) and rec["count"] == len(ood)
    # Each part is its snippets' two pairs; together they are the whole.
    n = {k: 2 * sum(1 for e in ood if e.label == 0 and pair_kind(e) == k) for k in ("mutate", "pseudo")}
    assert n["mutate"] > 0 and n["pseudo"] > 0
    whole = sum(rec["parts"][k] * n[k] for k in n) / len(ood)
    assert whole == pytest.approx(rec["accuracy"])
    assert aligned_head_scores(load_pretrained(models[1]), ad, {"ood": ood}) is None, "no PAD head: no number"


def test_a_study_scores_each_model_once_and_keeps_it(models, ood, tmp_path):
    tdir = tmp_path / "tasks"
    write_jsonl(tdir / "ad.jsonl", ood)
    write_jsonl(tdir / "ad_ood.jsonl", ood[:40])
    texts = [CTExample(("where", "is", "paris"), ("N", "N", "SE"))]
    write_jsonl(tdir / "ct_pool.jsonl", texts)
    write_jsonl(tdir / "ct_test.jsonl", texts)
    sdir = tmp_path / "study"
    sdir.mkdir()
    with_pad, without = models
    out = record_zero_shot(sdir, {with_pad.name: with_pad, without.name: without}, {"ad": (), "ct": ()}, tdir)
    assert set(out["models"][with_pad.name]) == {"ad"}, "only a task that asks for it (AD)"
    entry = out["models"][with_pad.name]["ad"]
    assert set(entry["sets"]) == {"test", "ood"} and entry["sets"]["test"]["count"] == len(ood)
    assert out["models"][without.name]["ad"] == {}
    assert read_zero_shot(sdir) == out
    # Scored once: a second call with the same task data reads the file and loads no model (none is there).
    again = record_zero_shot(sdir, {with_pad.name: tmp_path / "gone"}, {"ad": ()}, tdir)
    assert again == out
