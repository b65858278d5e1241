"""CT, concept-of-interest tagging (paper §3.1, §3.4): its examples, file format, the templated dataset
builder and the context-free baselines.

Format (one JSON object per line):
    {"tokens": ["when", "was", "the", "first", "super", "mario", "released"],
     "tags":   ["N", "N", "N", "N", "S", "E", "N"]}

The templated set: short English queries made of concept phrases (Wikipedia titles) slotted into query
patterns whose words all belong to the categories CT must not tag (five Ws and how, verbs,
determiners/prepositions/conjunctions, comparatives and superlatives, numbers); gold tags follow by
construction. A 275-query pool and a 200-query test set share no non-stopword unigram.

What it is not: human-labelled, or drawn from real user queries. The queries are template made, so
they are more regular than real queries and carry no natural-language titles (category 6); concept
words are only checked against STOPWORDS, not POS-tagged, so a title that contains a verb (e.g.
"breaking bad") can still be tagged as a concept.
"""
from __future__ import annotations

import math
import random
import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

from alignlab.objectives.hyperlink import TAGS as WHP_TAGS
from alignlab.platform.sources.documents import Document
from alignlab.platform.sources.text import words_of
from alignlab.platform.tasks.task_files import TaskFormat

TAGS = WHP_TAGS
"""CT's tags in label-index order: CT has WHP's shape, and a kept WHP head predicts these indices."""
OUTSIDE = "N"
TAGS_CONCEPT_FIRST = tuple(t for t in TAGS if t != OUTSIDE) + (OUTSIDE,)
"""The same tags with N last: the order of messages and stats, and the lexicon baseline's tie order."""
PAPER_CT_TAG_FRACTIONS = {"S": 0.16, "E": 0.16, "SE": 0.09, "N": 0.59}


@dataclass(frozen=True, slots=True)
class CTExample:
    tokens: tuple[str, ...]
    tags: tuple[str, ...]
    """One of TAGS per token: S starts a multiword concept, E ends it, SE is a one-word concept,
    N everything else (including words inside a multiword concept)."""

    def to_json(self) -> dict:
        return {"tokens": list(self.tokens), "tags": list(self.tags)}


# ---------------------------------------------------------------------------------------------
# The file format


def ct_problems(obj: dict) -> list[str]:
    problems = []
    tokens, tags = obj.get("tokens"), obj.get("tags")
    for name, value in (("tokens", tokens), ("tags", tags)):
        if value is None:
            problems.append(f"missing field {name!r}")
        elif not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            problems.append(f"field {name!r} must be a list of strings")
    for key in sorted(set(obj) - {"tokens", "tags"}):
        problems.append(f"unknown field {key!r}")
    if problems:
        return problems
    if not tokens:
        problems.append("no tokens")
    for i, tok in enumerate(tokens):
        if not tok.strip():
            problems.append(f"token {i} is empty")
        elif any(c.isspace() for c in tok):
            problems.append(f"token {i} {tok!r} contains whitespace")
    if len(tags) != len(tokens):
        problems.append(f"{len(tags)} tags for {len(tokens)} tokens")
    problems.extend(tag_sequence_problems(tags))
    return problems


def tag_sequence_problems(tags: Sequence[str]) -> list[str]:
    """Problems with a CT tag sequence: unknown tags, E without an open S, S never closed."""
    problems, open_at = [], None
    for i, tag in enumerate(tags):
        if tag not in TAGS_CONCEPT_FIRST:
            problems.append(f"unknown tag {tag!r} at token {i} (expected one of {', '.join(TAGS_CONCEPT_FIRST)})")
        elif tag == "E":
            if open_at is None:
                problems.append(f"E at token {i} without an open S")
            open_at = None
        elif tag in ("S", "SE"):
            if open_at is not None:
                problems.append(f"S at token {open_at} never closed ({tag} at token {i} before an E)")
            open_at = i if tag == "S" else None
    if open_at is not None:
        problems.append(f"S at token {open_at} never closed (query ends before an E)")
    return problems


def ct_key(obj: dict) -> tuple | None:
    """What makes two lines the same example: the query."""
    return tuple(map(str, obj["tokens"])) if isinstance(obj.get("tokens"), list) else None


def ct_parse(obj: dict) -> CTExample:
    return CTExample(tuple(obj["tokens"]), tuple(obj["tags"]))


CT_FORMAT = TaskFormat(problems=ct_problems, parse=ct_parse, key=ct_key)


# ---------------------------------------------------------------------------------------------
# CT: template queries from concept phrases

# "{C}" is a concept slot. Every other word is from a category CT must not tag (five Ws and how,
# verbs, determiners/prepositions/conjunctions, comparatives/superlatives, numbers) and is in STOPWORDS.
CT_PATTERNS = (
    "when was the first {C} released",
    "who is {C}",
    "where is {C}",
    "what is {C}",
    "how old is {C}",
    "{C} vs {C}",
    "how many {C} are there in 2020",
    "when did {C} {C} win",
    "{C} 2019",
    "best {C}",
    "the best {C} of 2018",
    "why did {C} fail",
    "how to play {C}",
    "how to get to {C}",
    "who founded {C}",
    "when did {C} start",
    "is {C} bigger than {C}",
    "which is better {C} or {C}",
    "what are the 10 best {C}",
    "where was {C} born",
    "who wrote {C}",
    "how far is {C} from {C}",
    "when will {C} come out",
    "did {C} win",
    "what does {C} mean",
    "{C} and {C}",
    "the latest {C}",
    "watch {C}",
    "buy {C}",
    "{C} {C} 2021",
    "who played {C} in {C}",
    "what happened to {C}",
    "how much does {C} cost",
    "is {C} the same as {C}",
    "who won the {C} {C}",
    "{C}",
    "{C} {C}",
)

_PATTERN_WORDS = {w for p in CT_PATTERNS for w in p.split() if w != "{C}"}
STOPWORDS = frozenset(_PATTERN_WORDS | set("""
a an the this that these those some any all each every no
of in on at to for from by with about into onto over under near than as like after before between
during through without within against toward towards up down out off
and or but nor so yet if then because while although
who what when where why how which whom whose
is are was were be been being am do does did done have has had will would can could shall should
may might must get gets got make made play played win won go went come came start started
release released watch buy see find cost mean happened wrote founded born fail failed
more most less least better best worse worst bigger biggest smaller smallest larger largest
higher highest lower lowest older oldest newer newest latest first last same other
one two three four five six seven eight nine ten 10 100 2018 2019 2020 2021 2022
i me my you your he him his she her it its we us our they them their
not very too also just there here much many far old
""".split()))


def _slugify_title(title: str) -> str | None:
    title = re.sub(r"\s*\([^)]*\)", " ", title)  # "Mercury (planet)" -> "Mercury"
    title = title.replace("-", " ").replace("–", " ").lower()
    words = title.split()
    if not 1 <= len(words) <= 4 or not all(w.isascii() and w.isalnum() for w in words):
        return None
    return " ".join(words)


def concepts_from_documents(docs: Iterable[Document]) -> list[str]:
    """Concept phrases from document titles: lowercased, parenthetical qualifiers removed, hyphens
    as spaces, 1-4 words of ASCII letters/digits only; deduplicated and sorted."""
    out = set()
    for doc in docs:
        c = _slugify_title(doc.title) if doc.title else None
        if c:
            out.add(c)
    return sorted(out)


def _concept_ok(concept: str) -> bool:
    """Concept words must be ASCII letters (numbers are category 5) and no STOPWORDS (categories 1-4,
    and titles with function words, the natural-language titles of category 6)."""
    words = concept.split()
    return 1 <= len(words) <= 4 and all(w.isascii() and w.isalpha() and w not in STOPWORDS for w in words)


def concept_tags(n_words: int) -> list[str]:
    return ["SE"] if n_words == 1 else ["S"] + ["N"] * (n_words - 2) + ["E"]


def content_words(examples: Iterable[CTExample]) -> set[str]:
    """The non-stopword unigrams of the queries."""
    return {t for ex in examples for t in ex.tokens if t not in STOPWORDS}


def tag_fractions(examples: Iterable[CTExample]) -> dict[str, float]:
    counts = Counter(tag for ex in examples for tag in ex.tags)
    total = sum(counts.values())
    return {tag: (counts[tag] / total if total else 0.0) for tag in TAGS_CONCEPT_FIRST}


def build_ct_dataset(concepts: Sequence[str], *, seed: int = 0, pool_size: int = 275, test_size: int = 200,
                     single_word_share: float = 0.36) -> tuple[list[CTExample], list[CTExample], dict]:
    """CT queries (paper §3.4): a pool and a test set sharing no non-stopword unigram, and stats.

    Concepts that fail _concept_ok are dropped. The rest are split into two groups with disjoint
    words (a concept sharing a word with one group joins it; one sharing words with both is
    dropped), and each group fills its queries from CT_PATTERNS. A slot takes a one-word concept
    with probability `single_word_share` (0.36 gives the paper's SE : S ratio of 9 : 16).
    """
    if pool_size < 1 or test_size < 1:
        raise ValueError(f"pool_size and test_size must be >= 1, got {pool_size} and {test_size}")
    if not 0 <= single_word_share <= 1:
        raise ValueError(f"single_word_share must be in [0, 1], got {single_word_share}")
    rng = random.Random(seed)
    usable = sorted({c.strip().lower() for c in concepts if _concept_ok(c.strip().lower())})
    single = [c for c in usable if " " not in c]
    multi = [c for c in usable if " " in c]
    if not single or not multi:
        raise ValueError(f"need one-word and multiword concepts; got {len(single)} and {len(multi)} usable "
                         f"of {len(concepts)} (concepts must be letters only and contain no STOPWORDS)")
    slots_per_query = sum(p.split().count("{C}") for p in CT_PATTERNS) / len(CT_PATTERNS)

    def need(size: int) -> dict[bool, int]:
        slots = size * slots_per_query
        return {True: math.ceil(slots * single_word_share) + 2, False: math.ceil(slots * (1 - single_word_share)) + 2}

    # test = group 0, pool = group 1.
    needs = [need(test_size), need(pool_size)]
    groups: list[dict[bool, list[str]]] = [{True: [], False: []}, {True: [], False: []}]
    vocab = [set(), set()]
    order = single + multi
    rng.shuffle(order)
    dropped_conflict = 0
    for c in order:
        words = set(c.split())
        hits = [bool(words & vocab[0]), bool(words & vocab[1])]
        if all(hits):
            dropped_conflict += 1
            continue
        kind = " " not in c
        if hits[0] or hits[1]:
            g = 0 if hits[0] else 1
        else:
            fill = [len(groups[g][kind]) / needs[g][kind] for g in (0, 1)]
            g = 0 if fill[0] <= fill[1] else 1
        groups[g][kind].append(c)
        vocab[g] |= words
        if all(len(groups[g][k]) >= needs[g][k] for g in (0, 1) for k in (True, False)):
            break
    for g, name in ((0, "test"), (1, "pool")):
        for kind in (True, False):
            if not groups[g][kind]:
                raise ValueError(f"not enough concepts with disjoint words for the {name} set "
                                 f"({len(usable)} usable concepts)")

    def fill(group: dict[bool, list[str]], size: int, name: str) -> list[CTExample]:
        queues = {k: [] for k in (True, False)}

        def take(kind: bool, avoid: set[str]) -> str:
            for _ in range(3):
                if not queues[kind]:
                    queues[kind] = list(group[kind])
                    rng.shuffle(queues[kind])
                c = queues[kind].pop()
                if c not in avoid:
                    return c
            return c

        out, seen = [], set()
        for _ in range(size * 50):
            if len(out) == size:
                break
            tokens, tags, used = [], [], set()
            for w in rng.choice(CT_PATTERNS).split():
                if w == "{C}":
                    c = take(rng.random() < single_word_share, used)
                    used.add(c)
                    tokens += c.split()
                    tags += concept_tags(len(c.split()))
                else:
                    tokens.append(w)
                    tags.append("N")
            key = tuple(tokens)
            if key not in seen:
                seen.add(key)
                out.append(CTExample(key, tuple(tags)))
        if len(out) < size:
            raise ValueError(f"could only make {len(out)} distinct {name} queries of {size}; give more concepts")
        return out

    test = fill(groups[0], test_size, "test")
    pool = fill(groups[1], pool_size, "pool")
    shared = content_words(pool) & content_words(test)
    assert not shared, f"pool and test share non-stopword unigrams: {sorted(shared)[:10]}"
    for ex in pool + test:
        assert len(ex.tokens) == len(ex.tags) and not tag_sequence_problems(ex.tags), ex

    num_tokens = sum(len(ex.tokens) for ex in pool + test)
    stats = {
        "num_concepts_given": len(concepts),
        "num_concepts_usable": len(usable),
        "num_concepts_dropped_shared_words": dropped_conflict,
        "num_concepts_pool": len(groups[1][True]) + len(groups[1][False]),
        "num_concepts_test": len(groups[0][True]) + len(groups[0][False]),
        "num_pool": len(pool),
        "num_test": len(test),
        "num_tokens": num_tokens,
        "mean_query_tokens": num_tokens / (len(pool) + len(test)),
        "tag_fractions": tag_fractions(pool + test),
        "tag_fractions_pool": tag_fractions(pool),
        "tag_fractions_test": tag_fractions(test),
        "paper_tag_fractions": dict(PAPER_CT_TAG_FRACTIONS),
        "num_patterns": len(CT_PATTERNS),
    }
    return pool, test, stats


# ---------------------------------------------------------------------------------------------
# Context-free baselines: what a model gets without reading the context


def ct_lexicon(train: Sequence[CTExample]) -> dict[str, str]:
    """Each train word's most frequent tag (ties: the first in TAGS_CONCEPT_FIRST order): the lexicon baseline's
    lookup table."""
    counts: dict[str, Counter] = {}
    for ex in train:
        for tok, tag in zip(ex.tokens, ex.tags):
            counts.setdefault(tok, Counter())[tag] += 1
    order = TAGS_CONCEPT_FIRST
    return {tok: max(order, key=lambda t: (c[t], -order.index(t))) for tok, c in counts.items()}


def lexicon_ct_hits(train: Sequence[CTExample], test: Sequence[CTExample]) -> list[list[bool]]:
    """Per test text, whether each word's most frequent train tag (`ct_lexicon`; unknown words N) is its tag."""
    lexicon = ct_lexicon(train)
    hits = [[lexicon.get(tok, "N") == tag for tok, tag in zip(ex.tokens, ex.tags)] for ex in test]
    if not any(hits):
        raise ValueError("lexicon_ct_baseline needs a non-empty test set")
    return hits


def lexicon_ct_baseline(train: Sequence[CTExample], test: Sequence[CTExample]) -> float:
    """Word-level test accuracy of tagging each word with its most frequent train tag (`ct_lexicon`), unknown
    words N."""
    return hit_rate(lexicon_ct_hits(train, test))


def hit_rate(hits: Sequence[Sequence[bool]]) -> float:
    """The share of right predictions over every scored unit of per-example hit lists."""
    return sum(sum(h) for h in hits) / sum(len(h) for h in hits)


def _tags_of_runs(is_concept_word: Sequence[bool]) -> list[str]:
    """Tags that make every maximal run of concept words one concept (S…E, or SE for one word)."""
    tags, i, n = [], 0, len(is_concept_word)
    while i < n:
        if not is_concept_word[i]:
            tags.append("N")
            i += 1
            continue
        j = i
        while j + 1 < n and is_concept_word[j + 1]:
            j += 1
        tags += concept_tags(j - i + 1)
        i = j + 1
    return tags


def _word_hits(predicted: Sequence[Sequence[str]], test: Sequence[CTExample]) -> list[list[bool]]:
    hits = [[p == g for p, g in zip(pred, ex.tags)] for pred, ex in zip(predicted, test)]
    if not any(hits):
        raise ValueError("a CT baseline needs a non-empty test set")
    return hits


def run_rule_ct_hits(train: Sequence[CTExample], test: Sequence[CTExample]) -> list[list[bool]]:
    """Per test text, the run rule's word hits: a word tagged N anywhere in `train` is N; every maximal run of
    the other words is one concept. It needs no context, only which words are "function words" of the task, and
    it is strong wherever concepts sit between such words."""
    n_words = {tok for ex in train for tok, tag in zip(ex.tokens, ex.tags) if tag == "N"}
    return _word_hits([_tags_of_runs([t not in n_words for t in ex.tokens]) for ex in test], test)


def run_rule_ct_baseline(train: Sequence[CTExample], test: Sequence[CTExample]) -> float:
    """Word accuracy of the training-vocabulary run rule (`run_rule_ct_hits`)."""
    return hit_rate(run_rule_ct_hits(train, test))


def gazetteer_tags(tokens: Sequence[str], titles: set[tuple[str, ...]], max_len: int) -> list[str]:
    """Left-to-right longest match of `titles` (word tuples): each match is a concept, all else N."""
    tags, i = [], 0
    while i < len(tokens):
        for n in range(min(max_len, len(tokens) - i), 0, -1):
            if tuple(tokens[i: i + n]) in titles:
                tags += concept_tags(n)
                i += n
                break
        else:
            tags.append("N")
            i += 1
    return tags


def gazetteer_ct_hits(titles: Iterable[Sequence[str]], test: Sequence[CTExample]) -> list[list[bool]]:
    """Per test text, the word hits of tagging the longest matches of article titles as concepts: what WHP could
    teach by looking titles up, with no context at all."""
    table = {tuple(t) for t in titles if t}
    if not table:
        raise ValueError("gazetteer_ct_baseline needs at least one title")
    max_len = max(len(t) for t in table)
    return _word_hits([gazetteer_tags(ex.tokens, table, max_len) for ex in test], test)


def gazetteer_ct_baseline(titles: Iterable[Sequence[str]], test: Sequence[CTExample]) -> float:
    """Word accuracy of the title gazetteer (`gazetteer_ct_hits`)."""
    return hit_rate(gazetteer_ct_hits(titles, test))


def title_words(title: str) -> tuple[str, ...]:
    """A title as CT words: lowercased, parenthetical qualifier dropped ("Mercury (planet)" -> mercury)."""
    return tuple(words_of(re.sub(r"\s*\([^)]*\)\s*$", "", title).lower()))

