"""The shipped real-text task data (hand-labelled CT of npm summaries, out-of-domain AD), the bracketed
format and its converter, the agreement figures, and every context-free baseline on hand-computed toys."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from alignlab.tasks import ad_data as AD
from alignlab.tasks import ct_data as CT
from alignlab.tasks import bracketed
from alignlab.tasks.ad_data import ADExample
from alignlab.tasks.ad_mining import matches_a_span
from alignlab.tasks.ct_data import CTExample
from alignlab.platform.cli import main
from alignlab.platform.fel.protocol import context_free_baselines
from alignlab.platform.tasks import task as T
from alignlab.platform.tasks.task_data import SHIPPED_TASK_DATA
from alignlab.platform.tasks.task_files import TaskDataError
from alignlab.platform.tasks.task import task as task_named

NPM = SHIPPED_TASK_DATA


def _make_ct():
    spec = importlib.util.spec_from_file_location("make_ct", NPM / "make_ct.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------- the bracketed format


def test_a_bracketed_line_becomes_one_tag_per_word():
    tokens, tags = bracketed.parse_line("a [spatial graph] library for [ python ]")
    assert tokens == ["a", "spatial", "graph", "library", "for", "python"]
    assert tags == ["N", "S", "E", "N", "N", "SE"]
    tokens, tags = bracketed.parse_line("[ruby on rails] [x]")
    assert tags == ["S", "N", "E", "SE"]
    assert bracketed.to_line(tokens, tags) == "[ruby on rails] [x]"


@pytest.mark.parametrize("line, problem", [
    ("a [b [c] d]", "do not nest"),
    ("a b] c", "without an open"),
    ("a [b c", "never closed"),
    ("a [] b", "empty concept"),
    ("java[script] x", "inside a word"),
    ("   ", "no words"),
])
def test_a_malformed_bracketed_line_is_refused_with_its_problem(line, problem):
    with pytest.raises(ValueError, match=problem):
        bracketed.parse_line(line)


def test_the_converter_names_file_and_line_and_writes_nothing_on_error(tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("a spatial graph library\nreact hooks\n")
    good = tmp_path / "good.txt"
    good.write_text("a [spatial graph] library\n[react] hooks\n")
    out = tmp_path / "out.jsonl"
    assert main(["data", "convert-ct", str(good), str(out), "--texts", str(texts)]) == 0
    assert [json.loads(l)["tags"] for l in out.read_text().splitlines()] == [["N", "S", "E", "N"], ["SE", "N"]]
    assert T.validate_file("ct", out) == []

    bad = tmp_path / "bad.txt"
    bad.write_text("a [spatial graph library\n[react] hook\n")
    out2 = tmp_path / "out2.jsonl"
    assert main(["data", "convert-ct", str(bad), str(out2), "--texts", str(texts)]) == 1
    printed = capsys.readouterr().out
    assert f"{bad}:1: '[' never closed" in printed
    assert f"{bad}:2: words differ from text 2" in printed
    assert not out2.exists() and not list(tmp_path.glob(".out2*"))


def test_cohen_kappa_matches_a_hand_computed_value():
    # 10 items: agree on 8 (p_o = 0.8); marginals a: N 6, S 4; b: N 6, S 4 -> p_e = 0.36 + 0.16 = 0.52
    a = ["N"] * 6 + ["S"] * 4
    b = ["N"] * 5 + ["S"] + ["N"] + ["S"] * 3
    assert bracketed.cohen_kappa(a, b) == pytest.approx((0.8 - 0.52) / (1 - 0.52))
    assert bracketed.cohen_kappa(a, a) == 1.0


def test_the_split_keeps_near_duplicates_on_one_side():
    exs = [CTExample(tuple(t.split()), ("N",) * len(t.split())) for t in
           ["a react library", "the react library", "vue plugin", "a vue plugin for you", "angular module", "svelte kit"]]
    pool, test = bracketed.split_pool_test(exs, test_size=3, seed=1, stopwords=CT.STOPWORDS)
    key = lambda e: bracketed.near_duplicate_key(e.tokens, CT.STOPWORDS)
    assert {key(e) for e in pool}.isdisjoint({key(e) for e in test})
    assert len(pool) + len(test) == len(exs)


# ---------------------------------------------------------------- the shipped data


def test_the_shipped_ct_files_are_exactly_what_the_adjudicated_labels_make():
    for name, content in _make_ct().build(NPM).items():
        assert (NPM / name).read_text(encoding="utf-8") == content, f"{name} is stale: run make_ct.py"


def test_the_shipped_ct_set_is_real_text_of_the_promised_size_with_a_disjoint_split():
    assert (NPM / "GUIDELINE.md").read_text().count("\n") > 50
    pool, test = T.load_examples("ct", NPM / "ct_pool.jsonl"), T.load_examples("ct", NPM / "ct_test.jsonl")
    assert len(pool) >= 275 and len(test) >= 200
    assert all(3 <= len(e.tokens) <= 20 for e in pool + test)
    assert all(t == t.lower() for e in pool + test for t in e.tokens)
    key = lambda e: bracketed.near_duplicate_key(e.tokens, CT.STOPWORDS)
    assert {key(e) for e in pool}.isdisjoint({key(e) for e in test})
    assert T.check_disjoint(NPM / "ct_pool.jsonl", NPM / "ct_test.jsonl") == []
    agree = json.loads((NPM / "agreement.json").read_text())["before_adjudication"]
    assert agree["texts"] == len(pool) + len(test) and 0 < agree["cohen_kappa_tags"] <= 1


def test_data_validate_passes_on_every_shipped_file():
    assert main(["data", "validate", "--task", "ct", str(NPM / "ct_pool.jsonl"), str(NPM / "ct_test.jsonl")]) == 0
    assert main(["data", "validate", "--task", "ad", str(NPM / "ad_ood.jsonl")]) == 0


def test_the_out_of_domain_ad_set_follows_the_in_domain_rules():
    ood = T.load_examples("ad", NPM / "ad_ood.jsonl")
    snippets = {e.snippet for e in ood}
    assert len(snippets) >= 300 and len(ood) == 2 * len(snippets)
    for pos, neg in zip(ood[::2], ood[1::2]):
        assert (pos.label, neg.label) == (1, 0) and pos.snippet == neg.snippet
        assert len(pos.acronym) == len(neg.acronym) and pos.acronym != neg.acronym
        assert pos.snippet == pos.snippet.lower() and f"({pos.acronym})" not in pos.snippet
        # PAD's word rule (mine_ad.py filtered the file to it): the positive spells its long form's whitespace words.
        assert len(pos.long_form.split()) == len(pos.acronym) and matches_a_span(pos.acronym, pos.long_form)
        assert matches_a_span(pos.acronym, pos.snippet)


# ---------------------------------------------------------------- baselines on hand-computed toys


def _ct(line: str) -> CTExample:
    tokens, tags = bracketed.parse_line(line)
    return CTExample(tuple(tokens), tuple(tags))


def test_the_run_rule_tags_runs_of_words_never_seen_as_n():
    train = [_ct("a [react] wrapper for [node js]")]  # N words: a, wrapper, for
    test = [_ct("a [vue] [redux] wrapper for [angular]")]
    # predicted: a=N, "vue redux" one run -> S E, wrapper N, for N, angular SE; gold: N SE SE N N SE -> 4/6
    assert CT.run_rule_ct_baseline(train, test) == pytest.approx(4 / 6)


def test_the_gazetteer_tags_the_longest_title_match():
    titles = [("node", "js"), ("node",), ("react",), ("react", "native", "apps")]
    test = [_ct("[node js] and [react native] for [deno]")]
    # predicted: node js -> S E, and N, react -> SE (no "react native" title), native N, for N, deno N
    # gold:      S E N S E N SE -> right on node, js, and, for = 4 of 7
    assert CT.gazetteer_ct_baseline(titles, test) == pytest.approx(4 / 7)
    assert CT.title_words("Mercury (planet)") == ("mercury",)


def test_the_span_matcher_is_right_on_positives_and_mutations_and_wrong_on_pseudo_acronyms():
    snippet = "much of world of warcraft's gameplay involves the completion of quests"
    test = [ADExample("wow", snippet, 1),   # initials of "world of warcraft's": right
            ADExample("xow", snippet, 0),   # a mutation, no span: right
            ADExample("tco", snippet, 0)]   # "the completion of": a span, so predicted 1: wrong
    assert AD.span_matcher_ad_baseline(test) == pytest.approx(2 / 3)


def test_context_free_baselines_name_the_strongest_and_score_each_test_unit():
    train = [_ct("a [react] wrapper for [node js]")]
    test = [_ct("a [vue] [redux] wrapper for [angular]"), _ct("[vue] for a wrapper")]
    out = context_free_baselines(task_named("ct"), train, test, titles=[("vue",), ("redux",), ("angular",)])
    names = ("majority", "lexicon", "run_rule", "gazetteer")
    assert set(out) == {*(f"baseline_{n}" for n in names), "baseline_best", "baseline_best_name",
                        *(f"unit_{k}_baseline_{n}" for n in names for k in ("count", "correct"))}
    assert out["baseline_gazetteer"] == 1.0 and out["baseline_best_name"] == "gazetteer" and out["baseline_best"] == 1.0
    # Per test text (a CT unit): its words scored and those the baseline got right, adding up to its accuracy.
    assert out["unit_count_baseline_lexicon"] == [6, 4]
    assert out["unit_correct_baseline_gazetteer"] == [6, 4]
    # The lexicon knows "a", "wrapper", "for" as N from training; every concept word is unknown and tagged N.
    assert out["unit_correct_baseline_lexicon"] == [3, 3]
    assert out["baseline_lexicon"] == pytest.approx(6 / 10)
    snippet = "much of world of warcraft's gameplay involves the completion of quests"
    test = [ADExample("wow", snippet, 1), ADExample("xow", snippet, 0)]
    uninformative = [ADExample("ab", "a b", 1), ADExample("ab", "a b", 0)]  # letters and majority learn nothing
    out = context_free_baselines(task_named("ad"), uninformative, test)
    assert out["baseline_span_matcher"] == 1.0 and out["baseline_best_name"] == "span_matcher"
