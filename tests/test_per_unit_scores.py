"""Every FEL calculation records its test set's scores per test unit (CT: a text, AD: a snippet), so the report can
resample units: the counts add up to the reported accuracy, units are keyed by their text (the same key in every
calculation that tests the unit), and extra test sets get theirs too."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from tiny_model import tiny_pretrained

from alignlab.tasks.ad_data import ADExample
from alignlab.tasks.ct_data import CTExample
from alignlab.platform.cli import main
from alignlab.platform.fel.finetune import finetune_calculation, load_pretrained
from alignlab.platform.fel.finetune_config import FinetuneConfig
from alignlab.platform.fel.protocol import extra_test_scores
from alignlab.platform.fel.task_scoring import scores_per_test_unit
from alignlab.platform.tasks.task_files import write_jsonl
from alignlab.platform.tasks.task import task as task_named

CONCEPTS = ["paris", "super mario", "alan turing", "new york city", "red river", "tokyo", "black sea"]


def _ct(start: int, n: int) -> list[CTExample]:
    out = []
    for i in range(start, start + n):
        concept = CONCEPTS[i % len(CONCEPTS)].split()
        tags = ["SE"] if len(concept) == 1 else ["S"] + ["N"] * (len(concept) - 2) + ["E"]
        out.append(CTExample(("where", "is", *concept, f"w{i}"), ("N", "N", *tags, "N")))
    return out


def _ad(start: int, n: int) -> list[ADExample]:
    out = []
    for i in range(start, start + n):
        snippet = f"the world health organization said on day {i} that the plan was ready"
        out += [ADExample("who", snippet, 1), ADExample("whz", snippet, 0)]
    return out


DATA = {"ct": (_ct(0, 16), _ct(16, 6), _ct(30, 9)), "ad": (_ad(0, 8), _ad(8, 3), _ad(20, 5))}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_pretrained(tmp_path_factory.mktemp("units"))


@pytest.fixture(scope="module")
def pre(model_dir):
    return load_pretrained(model_dir)


def test_scores_per_test_unit_sum_a_units_scored_words_and_hits_by_hand():
    ex = [CTExample(("a", "b"), ("N", "N")), CTExample(("c",), ("SE",)), CTExample(("a", "b"), ("N", "N"))]
    rows = torch.tensor([0, 0, 1, 2, 2])  # two words, one, two; the third text repeats the first: one unit
    hits = torch.tensor([True, False, True, True, True])
    out = scores_per_test_unit(task_named("ct"), ex, hits, rows)
    assert out["unit_count"] == [4, 1] and out["unit_correct"] == [3, 1]
    assert len(set(out["unit_keys"])) == 2


@pytest.mark.parametrize("task,scheme,selection", [("ct", "pred", "honest"), ("ct", "pred+trm", "paper"),
                                                   ("ad", "pred+trm", "honest"), ("ad", "pred", "paper")])
def test_a_calculation_records_per_unit_scores_that_add_up_to_its_accuracy(pre, task, scheme, selection):
    train, val, test = DATA[task]
    rows = []
    for seed in (0, 1):
        cfg = FinetuneConfig(task=task, budget=10, max_epochs=3, patience=5, batch_size=8, lr=1e-2, scheme=scheme,
                             selection=selection, seed=seed)
        rows.append(finetune_calculation(pre, cfg, train, test, val=val if selection == "honest" else None).row)
    for r in rows:
        assert len(r["unit_keys"]) == len({(e.snippet if task == "ad" else e.tokens) for e in test})
        assert sum(r["unit_correct"]) / sum(r["unit_count"]) == pytest.approx(r["accuracy"])
        assert sum(r["unit_correct_at_best_accuracy"]) / sum(r["unit_count"]) == pytest.approx(r["best_accuracy"])
        if task == "ad":
            assert set(r["unit_count"]) == {2}, "a snippet's positive and negative pair are one unit"
    assert rows[0]["unit_keys"] == rows[1]["unit_keys"], "the same test units carry the same keys"


def test_extra_test_sets_are_scored_per_unit_too(pre):
    train, val, test = DATA["ad"]
    cfg = FinetuneConfig(task="ad", budget=10, max_epochs=2, patience=5, batch_size=8, lr=1e-2, scheme="pred")
    calc = finetune_calculation(pre, cfg, train, test, val=val)
    out = extra_test_scores(calc.model, pre.tok, dataclasses.replace(cfg), {"other": _ad(40, 4)}, train + val,
                            task=task_named("ad"))
    assert out["eval_other_unit_count"] == [2, 2, 2, 2]
    assert sum(out["eval_other_unit_correct"]) / 8 == pytest.approx(out["eval_other_accuracy"])


def test_the_fel_command_summarises_its_numbers_and_leaves_the_per_unit_lists_out(model_dir, tmp_path, capsys):
    tdir = tmp_path / "tasks"
    write_jsonl(tdir / "ad.jsonl", _ad(0, 20))
    write_jsonl(tdir / "ad_ood.jsonl", _ad(40, 4))
    write_jsonl(tdir / "ct_pool.jsonl", DATA["ct"][0])
    write_jsonl(tdir / "ct_test.jsonl", DATA["ct"][2])
    assert main(["fel", "--preset", "smoke", "--model", model_dir.name, "--task", "ad", "--budget", "10",
                 "--scheme", "pred", "--tasks-dir", str(tdir), "--storage", str(model_dir.parent.parent)]) == 0
    out = capsys.readouterr().out
    assert "eval_ood_accuracy: " in out and "unit_" not in out


def _unit_key(snippet: str) -> str:
    import hashlib

    return hashlib.blake2b(snippet.encode(), digest_size=6).hexdigest()


def test_each_test_units_recorded_part_is_the_pair_kind_of_its_negative(pre):
    """AD's parts (issue #65): a calculation records, in its `unit_keys` order, each snippet's part, which is
    `ad_kinds.pair_kind` of its negative; on real pairs (the shipped out-of-domain set has both kinds)."""
    from alignlab.tasks.ad_kinds import pair_kind
    from alignlab.platform.tasks.task_data import SHIPPED_TASK_DATA

    ood = task_named("ad").load_examples(SHIPPED_TASK_DATA / "ad_ood.jsonl")
    train, val, _ = DATA["ad"]
    cfg = FinetuneConfig(task="ad", budget=10, max_epochs=2, patience=5, batch_size=8, lr=1e-2, scheme="pred")
    calc = finetune_calculation(pre, cfg, train, ood[:80], val=val)
    kind = {_unit_key(e.snippet): pair_kind(e) for e in ood if e.label == 0}
    assert calc.row["unit_parts"] == [kind[k] for k in calc.row["unit_keys"]]
    assert set(calc.row["unit_parts"]) == {"mutate", "pseudo"}
    out = extra_test_scores(calc.model, pre.tok, cfg, {"other": ood[80:160]}, train + val, task=task_named("ad"))
    assert out["eval_other_unit_parts"] == [kind[k] for k in out["eval_other_unit_keys"]]
    # A task without parts records none.
    ct_train, ct_val, ct_test = DATA["ct"]
    ct_cfg = FinetuneConfig(task="ct", budget=10, max_epochs=1, patience=5, batch_size=8, scheme="pred")
    assert "unit_parts" not in finetune_calculation(pre, ct_cfg, ct_train, ct_test, val=ct_val).row
