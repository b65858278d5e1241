"""Tasks from files (platform/tasks/task_kinds.py): the three kinds' validation with FILE:LINE, heads made from the
data, context-free baselines, entity span F1, a full FEL calculation of each kind on a tiny real model, and the
study transform that gives a declared task rows of its own."""
from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
import torch

from alignlab.platform.tasks.task import task, task_names
from alignlab.platform.tasks.task_files import TaskDataError
from alignlab.platform.tasks.task_kind_data import is_span_scheme
from alignlab.platform.tasks.task_kinds import declarations, declare_all, declare_task, undeclare

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "software_ner"


@pytest.fixture
def declared():
    """Declare tasks in this test only: a declared task stays registered (and its files required) otherwise."""
    names = []

    def declare(name, *args, **kw):
        names.append(name)
        return declare_task(name, *args, **kw)

    yield declare
    for n in names:
        undeclare(n)


def _write(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _sentiment(tmp_path, n=60, seed=0):
    rng = random.Random(seed)
    good, bad, filler = ["fast", "great", "clean"], ["slow", "broken", "buggy"], ["a", "library", "for", "data", "tool"]
    rows = []
    for i in range(n):
        label = "pos" if i % 2 else "neg"
        words = rng.sample(filler, 3) + [rng.choice(good if label == "pos" else bad), f"w{i}"]
        rows.append({"text": " ".join(words), "label": label})
    return _write(tmp_path / "seq_pool.jsonl", rows[: n * 2 // 3]), _write(tmp_path / "seq_test.jsonl", rows[n * 2 // 3:])


def _pairs(tmp_path, n=60):
    rows = []
    for i in range(n):
        a = f"parse json files quickly number{i}"
        b = a if i % 2 else f"draw maps of cities with tiles id{i}"
        rows.append({"text_a": a, "text_b": b + " ok", "label": int(i % 2)})
    return _write(tmp_path / "pair_pool.jsonl", rows[:40]), _write(tmp_path / "pair_test.jsonl", rows[40:])


def test_each_kind_names_every_bad_line_as_file_colon_line(declared, tmp_path):
    good_tag = {"tokens": ["a", "b"], "tags": ["O", "B-X"]}
    tag = _write(tmp_path / "t.jsonl", [good_tag, {"tokens": ["a"], "tags": ["O", "O"]}, "{not json",
                                         {"tokens": ["two words"], "tags": ["O"]}, good_tag])
    seq = _write(tmp_path / "s.jsonl", [{"text": "x", "label": "a"}, {"text": "", "label": "b"},
                                        {"text": "y", "label": True}])
    pair = _write(tmp_path / "p.jsonl", [{"text_a": "x", "text_b": "y", "label": 1}, {"text_a": "x", "label": 0}])
    with pytest.raises(TaskDataError) as e:
        declared("tagged", "tagging", tag, tag)
    problems = "\n".join(e.value.problems)
    assert f"{tag}:2: 2 tags for 1 tokens" in problems and f"{tag}:3: invalid JSON" in problems
    assert f'{tag}:4: "tokens"[0] is not a word' in problems and f"{tag}:5: duplicate of the example at line 1" in problems
    with pytest.raises(TaskDataError) as e:
        declared("seq", "sequence", seq, seq)
    assert f'{seq}:2: "text" must be a non-empty string' in str(e.value)
    assert f'{seq}:3: "label" must be a non-empty string or an integer' in str(e.value)
    with pytest.raises(TaskDataError, match=f'{pair}:2: "text_b" must be a non-empty string'):
        declared("pairs", "pair", pair, pair)
    assert "tagged" not in task_names() and "seq" not in task_names()


def test_an_extra_test_file_with_a_label_the_head_does_not_have_is_refused_by_line(declared, tmp_path):
    pool, test = _sentiment(tmp_path)
    extra = _write(tmp_path / "extra.jsonl", [{"text": "fine", "label": "pos"}, {"text": "meh", "label": "neutral"}])
    with pytest.raises(TaskDataError, match=f"{extra}:2: label"):
        declared("senti", "sequence", pool, test, extra_tests={"other": extra})


def test_the_head_is_made_from_the_label_set_of_the_data(declared):
    t = declared("swner", "tagging", EXAMPLE / "pool.jsonl", EXAMPLE / "test.jsonl", aligned_objective="whp")
    assert t.labels == ("B-LANG", "B-TECH", "I-TECH", "O") and t.num_classes == 4
    assert t.make_head(16, 0.0).out.out_features == 4
    assert task("swner") is t and "swner" in task_names() and t.head_rank > max(task(n).head_rank for n in ("ct", "ad"))


def test_tagging_baselines_and_span_f1_follow_their_definitions(declared):
    t = declared("swner", "tagging", EXAMPLE / "pool.jsonl", EXAMPLE / "test.jsonl")
    pool, test = t.load_examples(EXAMPLE / "pool.jsonl"), t.load_examples(EXAMPLE / "test.jsonl")
    scores = t.baseline_scores(pool, test)
    n_o = sum(tag == "O" for ex in test for tag in ex.tags)
    assert scores["majority"] == n_o / sum(len(ex.tags) for ex in test)
    assert scores["lexicon"] > scores["majority"]
    # Gold predictions score span F1 1; predicting O everywhere finds no entity: 0.
    gold = [t.labels.index(tag) for ex in test for tag in ex.tags]
    rows = [i for i, ex in enumerate(test) for _ in ex.tags]
    assert t.unit_metrics(gold, rows, test) == {"span_f1": 1.0}
    assert t.unit_metrics([t.labels.index("O")] * len(gold), rows, test) == {"span_f1": 0.0}
    assert is_span_scheme(["O", "B-PER", "I-PER"]) and not is_span_scheme(["S", "E", "SE", "N"])


def test_sequence_and_pair_baselines_learn_what_their_features_see(declared, tmp_path):
    s = declared("senti", "sequence", *_sentiment(tmp_path))
    pool, test = (s.load_examples(p) for p in _sentiment(tmp_path))
    scores = s.baseline_scores(pool, test)
    assert scores["majority"] == 0.5 and scores["bag_of_words"] == 1.0
    p = declared("same", "pair", *_pairs(tmp_path))
    pool, test = (p.load_examples(f) for f in _pairs(tmp_path))
    scores = p.baseline_scores(pool, test)
    assert scores["majority"] == 0.5 and scores["overlap"] == 1.0
    assert p.labels == ("0", "1")


def test_a_worker_registers_the_same_task_from_its_portable_declaration(declared):
    t = declared("swner", "tagging", EXAMPLE / "pool.jsonl", EXAMPLE / "test.jsonl", aligned_objective="whp")
    [decl] = declarations()
    undeclare("swner")
    declare_all([decl])
    w = task("swner")
    assert w is not t and (w.labels, w.data_files, w.aligned_objective) == (t.labels, t.data_files, "whp")
    with pytest.raises(RuntimeError, match="without its files"):
        w.build_data([], seed=0, options={})


def test_a_name_taken_by_other_files_is_refused(declared, tmp_path):
    declared("swner", "tagging", EXAMPLE / "pool.jsonl", EXAMPLE / "test.jsonl")
    assert declared("swner", "tagging", EXAMPLE / "pool.jsonl", EXAMPLE / "test.jsonl") is task("swner")
    with pytest.raises(ValueError, match="registered twice"):
        declared("swner", "tagging", EXAMPLE / "test.jsonl", EXAMPLE / "pool.jsonl")
    with pytest.raises(ValueError, match=r"task name 'ct' registered twice: by alignlab \(alignlab.tasks"):
        declare_task("ct", "tagging", EXAMPLE / "pool.jsonl", EXAMPLE / "test.jsonl")


@pytest.mark.parametrize("kind", ["sequence", "pair", "tagging"])
def test_a_calculation_of_each_kind_runs_on_a_tiny_model_and_keeps_the_aligned_head_only_when_it_fits(
        declared, tmp_path, kind):
    from alignlab.platform.fel.finetune import build_task_model, finetune_calculation, load_pretrained
    from alignlab.platform.fel.protocol import test_unit_metrics
    from alignlab.platform.presets import Preset

    from tests.tiny_model import tiny_pretrained

    files = {"sequence": _sentiment(tmp_path), "pair": _pairs(tmp_path),
             "tagging": (EXAMPLE / "pool.jsonl", EXAMPLE / "test.jsonl")}[kind]
    # PAD's head is a 2-class sequence head like the sentiment task's; WHP's 4-tag token head fits the software
    # tags (4 labels) but not a pair task's sequence head, which then starts fresh.
    aligned = {"sequence": "pad", "pair": "whp", "tagging": "whp"}[kind]
    t = declared(f"my{kind}", kind, *files, aligned_objective=aligned)
    pre = load_pretrained(tiny_pretrained(tmp_path / "root"))
    cfg = dataclasses.replace(Preset.named("smoke").finetune, task=t.name, budget=20, keep_head=True,
                              selection="paper")
    train, test = t.load_examples(files[0])[:20], t.load_examples(files[1])
    done = finetune_calculation(pre, cfg, train, test)
    assert 0 <= done.row["accuracy"] <= 1 and done.row["num_test"] > 0
    assert ("span_f1" in test_unit_metrics(done.model, pre.tok, cfg, test, t)) == (kind == "tagging")
    model = build_task_model(pre, t.name, keep_head=True, dropout=0.0, seed=0)
    w, pretrained = model.heads[t.name].out.weight, pre.state[f"heads.{aligned}.out.weight"]
    assert (w.shape == pretrained.shape and torch.equal(w, pretrained)) == (kind != "pair")


def _study_script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "studies" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_declared_task_gets_rows_like_the_study_task_aligned_with_the_same_objective(declared):
    from alignlab.platform.study.tasks import with_tasks

    declared("swner", "tagging", EXAMPLE / "pool.jsonl", EXAMPLE / "test.jsonl", aligned_objective="whp")
    base = _study_script("data_budget").build("smoke")
    study = with_tasks(base, ["swner"])
    ct_rows = sorted(c.row for c in base.calcs if c.finetune.task == "ct")
    mine = [c for c in study.calcs if c.finetune.task == "swner"]
    assert sorted(c.row for c in mine) == [r.replace("CT", "SWNER", 1) for r in ct_rows]
    assert {c.group for c in mine} == {"SWNER"} and len(study.calcs) == len(base.calcs) + len(mine)
    assert [c for c in study.baseline_cells if c[0].startswith("SWNER")] == \
        [(r.replace("CT", "SWNER", 1), col) for r, col in base.baseline_cells if r.startswith("CT")]
    assert study.name.startswith(base.name + "-tasks-") and study.name != with_tasks(base, ["swner"], ["swner"]).name
    only = with_tasks(_study_script("objective_ablation").build("smoke"), ["swner"], ["swner"])
    assert {c.finetune.task for c in only.calcs} == {"swner"} and only.baseline_cells == (("SWNER", "-whp*"),)
    with pytest.raises(ValueError, match="task must be one of"):
        with_tasks(base, [], ["nosuch"])


@pytest.mark.parametrize("spec, message", [("name=a,kind=tagging,pool=p", "missing test"),
                                           ("name=a,kind=tagging,pool=p,test=t,colour=red", "unknown key 'colour'"),
                                           ("name=a,kind", "'kind' is not KEY=VALUE")])
def test_a_bad_task_spec_says_what_is_wrong(spec, message):
    from alignlab.platform.study.tasks import parse_task_spec

    with pytest.raises(ValueError, match=message):
        parse_task_spec(spec)
