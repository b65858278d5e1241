"""AD, acronym detection (paper §3.1, §3.4): its examples, file format, the dataset builder and the
context-free baselines.

Format (one JSON object per line):
    {"acronym": "wow", "snippet": "much of world of warcraft's gameplay ...", "label": 1}
Lines may carry provenance "doc_id" and "long_form" (the entity span); they are not inputs.

What the dataset is: a stand-in for the paper's unpublished, manually labelled internal data, built
the way §3.4 describes, from Wikipedia text we can ship. Unique snippets each holding a named entity
with a known acronym of 2-6 letters, mined from the text with the Schwartz-Hearst algorithm
("long form (ACRO)", ad_mining); the known acronym is the positive, one negative per snippet with no
accidental match; one word rule for all of it, PAD's (`text.spells_a_span`: the initials of a span of
whitespace words, every word giving its initial, a hyphenated word one word), so a positive spells its
entity, a pseudo acronym spells a span outside it and a mutated positive spells no span; labels exactly 50/50; acronyms never appear in their snippet. The negative follows
the paper's rules, (a) or (b) with equal probability, made so that the acronym's letters alone say
nothing about the label (AD is about matching letters to the text; letters_only_ad_baseline must stay
at chance):
(a) pseudo acronym: the initials of a span of the snippet's words outside the entity with as many words as
    the positive has letters (so negatives have exactly the positives' lengths; spans are 2-6 words,
    hence positives of 2-6 letters). Among the snippet's spans of that length one is chosen with
    probability proportional to the product, over its letters, of the positives' letter probability
    at that position (first letter / other letters) over the word-initial letter probability of
    snippet words: importance weights that make pseudo acronyms spell like acronyms, not like running
    text (whose minor words "of", "the", "and", rare in acronyms' long forms, and "was", "is", "in"
    would otherwise mark negatives).
(b) mutated positive: k letters (k uniform in 1..length, then a uniform subset) replaced, each by a
    different letter drawn from the word-initial letter distribution of the positives (that of
    acronyms' first letters for position 1, of their other letters elsewhere) through
    mutation_kernel: a plain "draw from p but not the letter replaced" under-draws frequent letters,
    the kernel K(c, l) = q_l / (1 - q_c) with p K = p does not, so a mutated letter is distributed
    like the letter it replaced.
Uniform span lengths and plain word-initial replacements let the letters-only baseline well above
chance (docs/journal/benchmark-notes.md, "AD negatives").

What it is not: human-labelled. Positives are only acronyms that the text itself introduces as
"long form (ACRO)" and whose letters are the initials of the long form's whitespace words: "goods and
services tax (GST)" and "light-emitting diode (LED)" are not positives (docs/data.md, "One word rule for PAD and
AD").
"""
from __future__ import annotations

import bisect
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from alignlab.tasks.ad_mining import PAREN_RE, SnippetCandidate, matches_a_span, snippet_candidates
from alignlab.platform.sources.documents import Document
from alignlab.platform.sources.text import (INELIGIBLE, LETTERS, InitialCache, initials_string, letter_probs,
                                            mutation_kernel, occurs_as_word, spells_a_span, words_of, words_with_spans)
from alignlab.platform.tasks.task_files import TaskFormat


@dataclass(frozen=True, slots=True)
class ADExample:
    acronym: str
    snippet: str
    label: int
    """1: the acronym matches an entity of the snippet; 0: it does not."""
    doc_id: str = field(default="", compare=False)
    """Provenance: the document the snippet comes from (so pretraining can hold it out)."""
    long_form: str = field(default="", compare=False)
    """Provenance: the entity span of the snippet whose known acronym is the positive."""

    def to_json(self) -> dict:
        obj = {"acronym": self.acronym, "snippet": self.snippet, "label": self.label}
        if self.doc_id:
            obj["doc_id"] = self.doc_id
        if self.long_form:
            obj["long_form"] = self.long_form
        return obj


# ---------------------------------------------------------------------------------------------
# The file format


def ad_problems(obj: dict) -> list[str]:
    problems = []
    acronym, snippet, label = obj.get("acronym"), obj.get("snippet"), obj.get("label")
    if acronym is None:
        problems.append("missing field 'acronym'")
    elif not isinstance(acronym, str):
        problems.append("field 'acronym' must be a string")
    elif not acronym:
        problems.append("acronym is empty")
    elif not acronym.isalpha():
        problems.append(f"acronym {acronym!r} has non-letters")
    if snippet is None:
        problems.append("missing field 'snippet'")
    elif not isinstance(snippet, str):
        problems.append("field 'snippet' must be a string")
    elif not snippet.strip():
        problems.append("snippet is empty")
    if label is None:
        problems.append("missing field 'label'")
    elif type(label) is not int or label not in (0, 1):  # bool and 1.0 are not labels
        problems.append(f"label must be 0 or 1, got {label!r}")
    for key in ("doc_id", "long_form"):
        if key in obj and not isinstance(obj[key], str):
            problems.append(f"field {key!r} must be a string")
    for key in sorted(set(obj) - {"acronym", "snippet", "label", "doc_id", "long_form"}):
        problems.append(f"unknown field {key!r}")
    return problems

def ad_key(obj: dict) -> tuple | None:
    """What makes two lines the same example: the (acronym, snippet) pair."""
    if isinstance(obj.get("acronym"), str) and isinstance(obj.get("snippet"), str):
        return (obj["acronym"], obj["snippet"])
    return None


def ad_parse(obj: dict) -> ADExample:
    return ADExample(obj["acronym"], obj["snippet"], obj["label"], obj.get("doc_id", ""), obj.get("long_form", ""))


AD_FORMAT = TaskFormat(problems=ad_problems, parse=ad_parse, key=ad_key)


# ---------------------------------------------------------------------------------------------
# The builder


AD_MIN_LETTERS, AD_MAX_LETTERS = 2, 6
"""Acronym lengths AD keeps: a pseudo acronym (the initials of a 2-6-word span) can only match these."""
AD_BUILDER_VERSION = 4
"""Bumped when build_ad_dataset makes different data for the same inputs (2: negatives of the
positive's length and letter distribution; 4: PAD's word rule for positives and negatives, the shipped
out-of-domain pairs filtered to it), or the task folder's held-out list changes (3: it adds the
documents that define a positive's acronym, defining_doc_ids), so caches of built datasets can key on it."""
AD_TARGET_SNIPPETS = 480
"""The in-domain set's size: the bundled corpus yields 483 snippets under PAD's word rule (600 of 727 under the
looser rule before it), so 480 is reached and gives five folds of 96."""


def _known_long_forms_in(words: list[str], known: dict[tuple[str, ...], set[str]], lengths: set[int]):
    for n in lengths:
        for i in range(len(words) - n + 1):
            span = tuple(words[i: i + n])
            if span in known:
                yield span, known[span]


def _accidental_match(candidate: str, cand: SnippetCandidate, present_long_forms) -> bool:
    """Is `candidate` the positive, a word of the snippet, the initials of (a span of) the entity, or the acronym of
    another known long form in the snippet (whose initials it is: every mined pair obeys PAD's rule)?"""
    if candidate == cand.acronym or occurs_as_word(candidate, cand.snippet):
        return True
    if spells_a_span(candidate, cand.words[cand.entity[0]: cand.entity[1]]):
        return True
    return any(candidate in acronyms for _, acronyms in present_long_forms)


@dataclass(frozen=True)
class _LetterModel:
    """How negatives get the positives' per-position letter distributions (see build_ad_dataset)."""

    span_weights: tuple[np.ndarray, np.ndarray]
    """(first, rest) importance weights, the positives' distribution of first (other) letters over the
    distribution of the initials of the snippet words a pseudo acronym can use; a span is chosen with
    probability proportional to the product of its letters' weights."""
    kernels: tuple[np.ndarray, np.ndarray]
    """(first, rest) mutation kernels (mutation_kernel, zero diagonal): a letter drawn
    from the target distribution and replaced by a draw from K[letter] is again distributed as the
    target; targets are the positives' first (other) letter distributions, or `letter_freq`."""


def _restricted_kernel(p: np.ndarray) -> np.ndarray:
    """mutation_kernel(p) with replacements kept inside p's support (a letter of zero weight is never
    drawn; mutation_kernel mixes in uniform mass when one letter has more than 45% of the weight)."""
    K = mutation_kernel(p) * (p > 0)[None, :]
    np.fill_diagonal(K, 0.0)
    rows = K.sum(axis=1, keepdims=True)
    return np.divide(K, rows, out=np.zeros_like(K), where=rows > 0)


def _letter_model(candidates: Sequence[SnippetCandidate], letter_freq: dict[str, float] | None) -> _LetterModel:
    first = letter_probs((c.acronym[0] for c in candidates), smooth=0.5)
    rest = letter_probs((ch for c in candidates for ch in c.acronym[1:]), smooth=0.5)
    # Initials of the words a pseudo acronym may use: every word outside the entity.
    cache = InitialCache()
    pool = letter_probs("".join(initials_string(c.words[: c.entity[0]] + c.words[c.entity[1]:], cache)
                                for c in candidates), smooth=1.0)
    if letter_freq is not None:
        target = np.array([letter_freq.get(c, 0.0) for c in LETTERS]) / sum(letter_freq.values())
        kernels = (_restricted_kernel(target),) * 2
    else:
        kernels = (_restricted_kernel(first), _restricted_kernel(rest))
    return _LetterModel((first / pool, rest / pool), kernels)


def _pseudo_acronym_negative(cand: SnippetCandidate, rng: random.Random, present, model: _LetterModel,
                             tries: int = 50) -> str | None:
    """Initials of a span of len(positive) whitespace words outside the entity (eligible words: PAD's rule, so the
    negative spells that span, `spells_a_span`), picked with probability proportional to the product of its
    letters' model.span_weights."""
    words, (e0, e1), n = cand.words, cand.entity, len(cand.acronym)
    initials = initials_string(words, InitialCache())
    options, weights = [], []
    for i in range(len(words) - n + 1):
        if not (i + n <= e0 or i >= e1):
            continue
        candidate = initials[i: i + n]
        if INELIGIBLE in candidate:
            continue
        w = model.span_weights[0][LETTERS.index(candidate[0])]
        for c in candidate[1:]:
            w *= model.span_weights[1][LETTERS.index(c)]
        options.append(candidate)
        weights.append(w)
    for _ in range(tries):
        if not options:
            return None
        k = rng.choices(range(len(options)), weights=weights)[0]
        candidate = options[k]
        if not _accidental_match(candidate, cand, present):
            return candidate
        del options[k], weights[k]
    return None


def _mutated_negative(cand: SnippetCandidate, rng: random.Random, present, model: _LetterModel,
                      tries: int = 50) -> str | None:
    """The positive with 1..all of its letters (a uniform number, then a uniform subset) replaced, each
    by a different letter drawn from the position's mutation kernel; never the initials of any span of the
    snippet (PAD's rule, `spells_a_span`: a perfect PAD solver rejects every mutated negative)."""
    acro = cand.acronym
    for _ in range(tries):
        chars = list(acro)
        for i in rng.sample(range(len(acro)), rng.randint(1, len(acro))):
            row = model.kernels[i > 0][LETTERS.index(acro[i])]
            if not row.any():  # the target gives weight to this letter only: keep it
                continue
            chars[i] = rng.choices(LETTERS, weights=row.tolist())[0]
        candidate = "".join(chars)
        if candidate != acro and not _accidental_match(candidate, cand, present) \
                and not spells_a_span(candidate, cand.words):
            return candidate
    return None


def build_ad_dataset(docs: Iterable[Document], *, seed: int = 0, target_snippets: int = AD_TARGET_SNIPPETS,
                     letter_freq: dict[str, float] | None = None,
                     max_snippet_words: int = 60) -> tuple[list[ADExample], dict]:
    """AD examples (paper §3.4) from documents, and stats.

    Documents are read in the order given and snippets taken until `target_snippets` (so put the
    English documents first, as the paper's AD data is English). Positives outside AD_MIN_LETTERS..
    AD_MAX_LETTERS (2-6) letters are dropped. Each snippet gives its positive (the known acronym)
    followed by its negative; snippets are shuffled with `seed`. A negative is, with equal
    probability, a pseudo acronym (initials of a span of len(positive) words outside the entity,
    importance weighted towards the positives' per-position letter distribution) or the positive
    with one or more letters mutated (replacements through mutation_kernel of the
    positives' first-letter / other-letter distributions, so mutated letters keep those
    distributions; with `letter_freq`, of that distribution instead, replacements kept inside its
    support); see the module docstring for why. When the drawn method finds no clean negative the
    other one is tried, and the snippet is dropped if neither does. A negative always has the
    positive's length, is never the positive, never a word of the snippet, never the initials of
    the entity span or the acronym of another known long form in the snippet, and a mutated one never
    spells any span (`spells_a_span`). stats["doc_ids"] lists the documents used, so pretraining can hold them
    out. (What the bundled summaries yield: docs/journal/benchmark-notes.md, "AD negatives".)
    """
    if target_snippets < 1:
        raise ValueError(f"target_snippets must be >= 1, got {target_snippets}")
    docs = list(docs)
    if letter_freq is not None:
        bad = sorted(k for k in letter_freq if k not in LETTERS)
        if bad or any(v < 0 for v in letter_freq.values()) or sum(letter_freq.values()) <= 0:
            raise ValueError("letter_freq must map letters a-z to non-negative weights with a positive sum"
                             + (f" (bad keys: {bad})" if bad else ""))
        if sum(1 for c in LETTERS if letter_freq.get(c, 0) > 0) < 2:
            raise ValueError("letter_freq must give weight to at least two letters")

    counts: Counter = Counter()
    candidates = [c for doc in docs for c in snippet_candidates(doc, max_snippet_words, counts)]
    known: dict[tuple[str, ...], set[str]] = {}
    for c in candidates:  # every mined pair, kept or not, guards against accidental matches
        known.setdefault(tuple(words_of(c.long_form)), set()).add(c.acronym)
    lengths = {len(k) for k in known}
    kept = [c for c in candidates if AD_MIN_LETTERS <= len(c.acronym) <= AD_MAX_LETTERS]
    counts["dropped_acronym_length"] = len(candidates) - len(kept)
    candidates = kept
    model = _letter_model(candidates, letter_freq)

    chosen: list[tuple[ADExample, ADExample]] = []
    seen_snippets, by_lang, methods, doc_ids = set(), Counter(), Counter(), set()
    for cand in candidates:
        if len(chosen) >= target_snippets:
            break
        if cand.snippet in seen_snippets:
            counts["dropped_duplicate_snippet"] += 1
            continue
        # Seeded per snippet, so a snippet's negative does not depend on what came before it.
        rng = random.Random(f"{seed}|{cand.snippet}")
        present = list(_known_long_forms_in(words_of(cand.snippet), known, lengths))
        order = ["pseudo", "mutation"] if rng.random() < 0.5 else ["mutation", "pseudo"]
        negative = None
        for method in order:
            negative = (_pseudo_acronym_negative(cand, rng, present, model) if method == "pseudo"
                        else _mutated_negative(cand, rng, present, model))
            if negative is not None:
                methods[method] += 1
                if method != order[0]:
                    counts["negative_fallbacks"] += 1
                break
        if negative is None:
            counts["dropped_no_negative"] += 1
            continue
        seen_snippets.add(cand.snippet)
        pos = ADExample(cand.acronym, cand.snippet, 1, cand.doc.doc_id, cand.long_form)
        neg = ADExample(negative, cand.snippet, 0, cand.doc.doc_id, cand.long_form)
        chosen.append((pos, neg))
        by_lang[cand.doc.lang] += 1
        doc_ids.add(cand.doc.doc_id)

    random.Random(seed).shuffle(chosen)
    examples = [ex for pair in chosen for ex in pair]
    stats = {
        "num_docs": len(docs),
        "num_pairs_found": counts["pairs_found"],
        "num_candidate_snippets": len(candidates),
        "num_snippets": len(chosen),
        "num_examples": len(examples),
        "target_snippets": target_snippets,
        "reached_target": len(chosen) >= target_snippets,
        "snippets_by_lang": dict(sorted(by_lang.items())),
        "negatives_by_method": dict(sorted(methods.items())),
        "num_negative_fallbacks": counts["negative_fallbacks"],
        "num_dropped_acronym_length": counts["dropped_acronym_length"],
        "num_dropped_acronym_in_snippet": counts["dropped_acronym_in_snippet"],
        "num_dropped_sentence_too_long": counts["dropped_sentence_too_long"],
        "num_dropped_duplicate_snippet": counts["dropped_duplicate_snippet"],
        "num_dropped_no_negative": counts["dropped_no_negative"],
        "num_dropped_entity_changed": counts["dropped_entity_changed"],
        "label_fractions": {str(l): n / len(examples) for l, n in sorted(Counter(e.label for e in examples).items())},
        "doc_ids": sorted(doc_ids),
    }
    return examples, stats


def defining_doc_ids(docs: Iterable[Document], examples: Iterable[ADExample]) -> set[str]:
    """Ids of the documents that define an acronym of the AD task: their text holds a positive's long
    form followed by "(ACRONYM)" -- the same words (words_of, case-insensitive), then whitespace and the
    parenthesised acronym in any case, as the miner finds it (PAREN_RE).

    A model pretrained on such a document has read the answer to that test pair even when the snippet's
    own document is held out, and many positives are defined in documents other than their snippet's
    (counts in README.md). Pretraining holds all of them out (a snippet's own document defines its
    acronym, so it is among these ids when `docs` holds it)."""
    wanted: dict[str, set[tuple[str, ...]]] = {}
    for ex in examples:
        if ex.label == 1 and ex.long_form:
            wanted.setdefault(ex.acronym.lower(), set()).add(tuple(w.lower() for w in words_of(ex.long_form)))
    found: set[str] = set()
    if not wanted:
        return found
    for doc in docs:
        matches = [m for m in PAREN_RE.finditer(doc.text) if m.group(2).lower() in wanted]
        if not matches:
            continue
        spans = words_with_spans(doc.text)
        ends = [e for _, _, e in spans]
        for m in matches:
            k = bisect.bisect_right(ends, m.start())  # the words that end before the parenthesis
            if any(k >= len(lf) and tuple(w.lower() for w, _, _ in spans[k - len(lf): k]) == lf
                   for lf in wanted[m.group(2).lower()]):
                found.add(doc.doc_id)
                break
    return found


# ---------------------------------------------------------------------------------------------
# Context-free baselines: what a model gets without reading the context


def _letter_features(examples: Sequence[ADExample]) -> np.ndarray:
    X = np.zeros((len(examples), 27))
    for i, ex in enumerate(examples):
        for ch in ex.acronym.lower():
            j = LETTERS.find(ch)
            if j >= 0:
                X[i, j] += 1
        X[i, 26] = len(ex.acronym)
    return X


def letters_only_ad_hits(train: Sequence[ADExample], test: Sequence[ADExample], l2: float = 1e-2) -> list[list[bool]]:
    """Per test pair, whether L2-regularised logistic regression on the acronym alone (its 26 letter counts and
    its length), never the snippet, is right: how much AD can be solved by spelling priors."""
    if not train or not test:
        raise ValueError("letters_only_ad_baseline needs non-empty train and test sets")
    from scipy.optimize import minimize  # here: task discovery imports this module in every worker

    X, Xt = _letter_features(train), _letter_features(test)
    mean, std = X.mean(0), X.std(0)
    std[std == 0] = 1.0
    X, Xt = (X - mean) / std, (Xt - mean) / std
    X, Xt = np.hstack([X, np.ones((len(X), 1))]), np.hstack([Xt, np.ones((len(Xt), 1))])
    y = np.array([ex.label for ex in train], dtype=float)

    def loss_grad(w):
        z = X @ w
        loss = np.mean(np.logaddexp(0.0, z) - y * z) + l2 * np.dot(w[:-1], w[:-1])
        grad = X.T @ (1.0 / (1.0 + np.exp(-z)) - y) / len(y)
        grad[:-1] += 2 * l2 * w[:-1]
        return loss, grad

    w = minimize(loss_grad, np.zeros(X.shape[1]), jac=True, method="L-BFGS-B").x
    pred = (Xt @ w) > 0
    return [[bool(p == (ex.label == 1))] for p, ex in zip(pred, test)]


def letters_only_ad_baseline(train: Sequence[ADExample], test: Sequence[ADExample], l2: float = 1e-2) -> float:
    """Test accuracy of the letters-only logistic regression (`letters_only_ad_hits`)."""
    hits = letters_only_ad_hits(train, test, l2)
    return float(np.mean([h[0] for h in hits]))


def span_matcher_ad_hits(test: Sequence[ADExample]) -> list[list[bool]]:
    """Per test pair, whether "positive iff the acronym is the initials of some contiguous span of the snippet's
    whitespace words" (PAD's rule, the task's own: a perfect PAD solver read zero-shot) is right. No training and
    no notion of an entity: on pairs the builder made it is right on every positive and every mutated negative,
    and wrong on every pseudo-acronym negative (the initials of a non-entity span)."""
    if not test:
        raise ValueError("span_matcher_ad_baseline needs a non-empty test set")
    return [[matches_a_span(ex.acronym, ex.snippet) == (ex.label == 1)] for ex in test]


def matches_a_content_span(acronym: str, text: str | Sequence[str]) -> bool:
    """`matches_a_span` (on `text`'s whitespace words, or the given word list), but the matched span must start and
    end on a content word: neither its first nor its last word is a minor word (ACRONYM_MINOR_WORDS).
    Pseudo-acronym negatives are mostly spans that start or end on "of", "the", "in", ...; an entity's long form
    rarely does. Nothing in it is tuned."""
    return matches_a_span(acronym, text, content_ends=True)


def content_span_matcher_ad_hits(test: Sequence[ADExample]) -> list[list[bool]]:
    """Per test pair, whether "positive iff the acronym is the initials of a span of the snippet that starts and
    ends on a content word" (`matches_a_content_span`) is right. Context-free and untrained, like the span matcher."""
    if not test:
        raise ValueError("content_span_matcher_ad_baseline needs a non-empty test set")
    return [[matches_a_content_span(ex.acronym, ex.snippet) == (ex.label == 1)] for ex in test]


def content_span_matcher_ad_baseline(test: Sequence[ADExample]) -> float:
    """Accuracy of the content-word span matcher (`content_span_matcher_ad_hits`)."""
    hits = content_span_matcher_ad_hits(test)
    return sum(h[0] for h in hits) / len(hits)


def span_matcher_ad_baseline(test: Sequence[ADExample]) -> float:
    """Accuracy of the span matcher (`span_matcher_ad_hits`)."""
    hits = span_matcher_ad_hits(test)
    return sum(h[0] for h in hits) / len(hits)
