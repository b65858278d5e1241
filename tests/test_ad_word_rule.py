"""PAD's exact rule as one function, AD built on it (its miner and negatives follow PAD's word rule), the AD
word-rule benchmark on the shipped out-of-domain pairs, and the content-word span matcher baseline."""
import sys
from pathlib import Path

import pytest

from alignlab.tasks.ad_data import (ADExample, build_ad_dataset, content_span_matcher_ad_baseline,
                                         matches_a_content_span)
from alignlab.tasks.ad_kinds import pair_kind
from alignlab.tasks.ad_mining import find_acronym_pairs, matches_a_span
from alignlab.objectives.pseudo_acronym import make_pad_pairs
from alignlab.platform.sources.documents import Document
from alignlab.platform.sources.text import spelled_spans, spells_a_span

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "probes"))
import ad_word_rule  # noqa: E402


def test_pad_rule_takes_every_whitespace_word_initial_and_keeps_hyphenated_words_whole():
    assert spells_a_span("wow", "much of world of warcraft gameplay")
    assert not spells_a_span("gst", "the goods and services tax was raised")   # "and" gives its "a"
    assert spells_a_span("gast", "the goods and services tax was raised")
    assert not spells_a_span("cgi", "made by computer-generated imagery today")  # one word, one initial
    assert spells_a_span("ci", "made by computer-generated imagery today")
    assert not spells_a_span("w", "world") and not spells_a_span("abcdefg", "a b c d e f g")
    assert not spells_a_span("ab", "alpha 1990 beta") and spells_a_span("ab", ["alpha", "beta"])
    assert spelled_spans("ab", "alpha beta and a bit") == [(0, 2), (3, 5)] and spelled_spans("ab", "alpha") == []


def test_pad_rule_calls_every_pad_positive_of_a_corpus_chunk_positive_and_every_negative_negative():
    import numpy as np
    chunks = [("the national gallery of modern art opened in london after the war " * 2).split()[: 8 + i % 9]
              for i in range(60)]
    pairs = make_pad_pairs(chunks, np.random.default_rng(0), np.full(26, 1 / 26))
    assert {lab for _, lab, _ in pairs} == {0, 1}
    for words, (acronym, label, _) in zip(chunks, pairs):
        if label >= 0:
            assert spells_a_span(acronym, words) == (label == 1), (acronym, words)


def test_the_miner_takes_only_acronyms_that_are_the_initials_of_every_whitespace_word_of_their_long_form():
    def pairs(s):
        return [(p.long_form, p.acronym) for p in find_acronym_pairs(s)]

    assert pairs("Much of World of Warcraft (WoW) gameplay involves quests.") == [("World of Warcraft", "wow")]
    assert pairs("The Goods and Services Tax (GST) was raised.") == []             # "and" gives no letter
    assert pairs("The Goods and Services Tax (GAST) was raised.") == [("Goods and Services Tax", "gast")]
    assert pairs("A light-emitting diode (LED) emits light.") == []                # a hyphen splits a word
    assert pairs("A light-emitting diode (LD) emits light.") == [("light-emitting diode", "ld")]


def test_every_built_pair_agrees_with_pads_rule_by_kind():
    docs = [Document("d:gst", "The Goods and Services Tax (GST) was raised by the federal government of Canada.", "en"),
            Document("d:led", "A light-emitting diode (LED) is a semiconductor device that emits light.", "en"),
            Document("d:bbc", "The British Broadcasting Corporation (BBC) is a public service broadcaster in London "
                     "and the oldest national broadcaster of the world.", "en"),
            Document("d:wow", "Much of World of Warcraft (WoW) gameplay involves the completion of quests for the "
                     "non-player characters of its world.", "en")]
    kinds = set()
    for seed in range(12):
        examples, stats = build_ad_dataset(docs, seed=seed)
        assert {e.doc_id for e in examples} == {"d:bbc", "d:wow"}  # GST and LED break PAD's rule
        for e in examples:
            kind = pair_kind(e)
            kinds.add(kind)
            # A positive and a pseudo acronym spell a span (PAD positives), a mutated negative spells none.
            assert spells_a_span(e.acronym, e.snippet) == (kind in ("pos", "pseudo")), e
            if e.label == 1:
                assert spelled_spans(e.acronym, e.snippet) and spells_a_span(e.acronym, e.long_form)
    assert kinds == {"pos", "mutate", "pseudo"}


def test_content_span_matcher_rejects_spans_that_start_or_end_on_a_minor_word():
    text = "the cost of the world of warcraft licence in europe"
    assert matches_a_span("otw", text) and not matches_a_content_span("otw", text)   # starts on "of"
    assert matches_a_span("wo", text) and not matches_a_content_span("wo", text)     # ends on "of"
    assert matches_a_content_span("wow", text) and matches_a_content_span("wl", text)
    assert not matches_a_span("wwl", text)  # PAD's rule: "of" gives its letter
    assert matches_a_content_span("ab", "(of) alpha beta, (of)") and not matches_a_content_span("ao", "alpha (of)")
    test = [ADExample("wow", text, 1), ADExample("otw", text, 0)]
    assert content_span_matcher_ad_baseline(test) == 1.0


def test_the_shipped_out_of_domain_pairs_scored_with_pads_rule_give_the_benchmarks_figures():
    f = ad_word_rule.word_rule_figures(ad_word_rule.ood_examples())
    # 332 of the 446 snippets mined under the loose rule survive PAD's (tasks/task_data/npm/mine_ad.py).
    assert f["n"] == {"pos": 332, "mutate": 210, "pseudo": 122}
    # As measured (benchmarks/results/ad_word_rule.md): aligned by construction, a perfect PAD solver calls every
    # positive and every pseudo acronym positive and every mutated negative negative (the goal: >= 95%, 0%).
    assert f["pad_says_positive"] == {"pos": 1.0, "mutate": 0.0, "pseudo": 1.0}
    assert f["pad_solver"]["all"] == pytest.approx((332 + 210) / 664)
    assert f["span_matcher"] == f["pad_solver"]
    assert f["content_span_matcher"]["all"] == pytest.approx(0.884, abs=1e-3)


def test_ad_accuracy_by_kind_splits_the_pad_aligned_part_from_the_pseudo_acronym_part():
    from alignlab.tasks.ad_kinds import accuracy_by_kind, pair_kind
    snippet = "much of world of warcraft gameplay involves the completion of quests"
    pos, mutated, pseudo = ADExample("wow", snippet, 1), ADExample("xqz", snippet, 0), ADExample("tco", snippet, 0)
    assert [pair_kind(e) for e in (pos, mutated, pseudo)] == ["pos", "mutate", "pseudo"]
    # The span matcher's pattern: right on positives and mutations, wrong on pseudo acronyms.
    acc = accuracy_by_kind([pos, mutated, pseudo], [True, True, False])
    assert acc == {"all": pytest.approx(2 / 3), "pos_vs_mutate": 1.0, "pos_vs_pseudo": 0.5}
    with pytest.raises(ValueError, match="2 hits"):
        accuracy_by_kind([pos, mutated, pseudo], [True, True])
