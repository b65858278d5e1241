"""PAD's exact rule as one function, the AD word-rule benchmark on the shipped out-of-domain pairs, and the
content-word span matcher baseline."""
import sys
from pathlib import Path

import pytest

from alignlab.objectives.ad_data import ADExample, content_span_matcher_ad_baseline, matches_a_content_span
from alignlab.objectives.ad_mining import matches_a_span
from alignlab.objectives.pseudo_acronym import make_pad_pairs
from alignlab.platform.sources.text import spells_a_span, words_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import ad_word_rule  # noqa: E402


def test_pad_rule_takes_every_whitespace_word_initial_and_keeps_hyphenated_words_whole():
    assert spells_a_span("wow", "much of world of warcraft gameplay")
    assert not spells_a_span("gst", "the goods and services tax was raised")   # "and" gives its "a"
    assert spells_a_span("gast", "the goods and services tax was raised")
    assert not spells_a_span("cgi", "made by computer-generated imagery today")  # one word, one initial
    assert spells_a_span("ci", "made by computer-generated imagery today")
    assert not spells_a_span("w", "world") and not spells_a_span("abcdefg", "a b c d e f g")
    assert not spells_a_span("ab", "alpha 1990 beta") and spells_a_span("ab", ["alpha", "beta"])


def test_pad_rule_calls_every_pad_positive_of_a_corpus_chunk_positive_and_every_negative_negative():
    import numpy as np
    chunks = [("the national gallery of modern art opened in london after the war " * 2).split()[: 8 + i % 9]
              for i in range(60)]
    pairs = make_pad_pairs(chunks, np.random.default_rng(0), np.full(26, 1 / 26))
    assert {lab for _, lab, _ in pairs} == {0, 1}
    for words, (acronym, label, _) in zip(chunks, pairs):
        if label >= 0:
            assert spells_a_span(acronym, words) == (label == 1), (acronym, words)


def test_content_span_matcher_rejects_spans_that_start_or_end_on_a_minor_word():
    words = words_of("the cost of the world of warcraft licence in europe")
    assert matches_a_span("otw", words) and not matches_a_content_span("otw", words)   # starts on "of"
    assert matches_a_span("wo", words) and not matches_a_content_span("wo", words)     # ends on "of"
    assert matches_a_content_span("wow", words) and matches_a_content_span("wl", words)
    test = [ADExample("wow", " ".join(words), 1), ADExample("otw", " ".join(words), 0)]
    assert content_span_matcher_ad_baseline(test) == 1.0


def test_the_shipped_out_of_domain_pairs_scored_with_pads_rule_give_the_benchmarks_figures():
    f = ad_word_rule.word_rule_figures(ad_word_rule.ood_examples())
    assert f["n"] == {"pos": 446, "mutate": 272, "pseudo": 174}
    # Pinned as measured (benchmarks/results/ad_word_rule.md): the pair is NOT aligned as built yet.
    assert f["pad_says_positive"]["pos"] == pytest.approx(PINNED_OOD_POS, abs=1e-3)
    assert f["pad_says_positive"]["mutate"] == pytest.approx(PINNED_OOD_MUTATE, abs=1e-3)
    assert f["pad_solver"]["all"] == pytest.approx(0.740, abs=1e-3)
    assert f["content_span_matcher"]["all"] > f["span_matcher"]["all"]


PINNED_OOD_POS = 358 / 446   # 80.3%: the goal is >= 95%
PINNED_OOD_MUTATE = 0.0


def test_ad_accuracy_by_kind_splits_the_pad_aligned_part_from_the_pseudo_acronym_part():
    from alignlab.objectives.ad_kinds import accuracy_by_kind, pair_kind
    snippet = "much of world of warcraft gameplay involves the completion of quests"
    pos, mutated, pseudo = ADExample("wow", snippet, 1), ADExample("xqz", snippet, 0), ADExample("tco", snippet, 0)
    assert [pair_kind(e) for e in (pos, mutated, pseudo)] == ["pos", "mutate", "pseudo"]
    # The span matcher's pattern: right on positives and mutations, wrong on pseudo acronyms.
    acc = accuracy_by_kind([pos, mutated, pseudo], [True, True, False])
    assert acc == {"all": pytest.approx(2 / 3), "pos_vs_mutate": 1.0, "pos_vs_pseudo": 0.5}
    with pytest.raises(ValueError, match="2 hits"):
        accuracy_by_kind([pos, mutated, pseudo], [True, True])
