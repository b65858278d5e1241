"""AD's acronym mining: words that spell an acronym, Schwartz-Hearst "long form (ACRO)" definitions,
sentence splitting, and the snippets around a definition that the AD builder (ad_data) draws from.

An acronym here is a written one whose letters are exactly the initials of its long form's whitespace words:
PAD's rule (`text.spells_a_span`, the one function PAD's labels obey), every word giving its initial, minor
words ("of", "and") too, a hyphenated word one word. So AD's positives are PAD positives by construction:
"World of Warcraft (WoW)" and "British Broadcasting Corporation (BBC)" are in; "Goods and Services Tax (GST)"
(a skipped minor word), "light-emitting diode (LED)" (a split hyphen) and "Hypertext Markup Language (HTML)"
are out (docs/data.md, "One word rule for PAD and AD").
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterator, Sequence

from alignlab.platform.sources.documents import Document
from alignlab.platform.sources.text import occurs_as_word, spelled_spans, spells_a_span, split_words, words_of

# Words that are not content words, for the content-word span matcher (`matches_a_span(content_ends=True)`): a
# span that starts or ends on one ("of the world", "war in") is rarely an entity's long form.
ACRONYM_MINOR_WORDS = frozenset("""
a an the of and for in on at to by with from or as into upon via per vs
de del la las el los y e en para por con al o u
des du le les et pour sur par aux au à d' l' qu'
""".split())

_EDGE_PUNCT = re.compile(r"^[^\w']+|[^\w']+$")
_EDGE_NON_ALNUM = re.compile(r"^[\W_]+|[\W_]+$")


def _is_minor(word: str) -> bool:
    """A whitespace word is minor when, lowercased and without surrounding punctuation ("(of", "the,"), it is in
    ACRONYM_MINOR_WORDS."""
    return _EDGE_PUNCT.sub("", word.lower()) in ACRONYM_MINOR_WORDS


def matches_a_span(acronym: str, text: str | Sequence[str], content_ends: bool = False) -> bool:
    """True if `acronym` spells a span of `text`'s whitespace words (or of the given word list) under PAD's rule
    (`text.spells_a_span`); with `content_ends`, a span that starts and ends on a content word (neither end a
    minor word, ACRONYM_MINOR_WORDS)."""
    if not content_ends:
        return spells_a_span(acronym, text)
    words = text.split() if isinstance(text, str) else text
    return any(not _is_minor(words[a]) and not _is_minor(words[b - 1]) for a, b in spelled_spans(acronym, words))


# ---------------------------------------------------------------------------------------------
# Schwartz-Hearst acronym mining


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
PAREN_RE = re.compile(r"(\s+)\(\s*([^()\s]{2,10})\s*\)(?![^\W_])")


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
    capitals (a written acronym, not "(singing)"), and its letters are exactly the initials of the
    |A| whitespace words before "(" (PAD's rule, `spells_a_span`: minor words give their initial, a
    hyphenated word is one word). Those words are the entity span.
    """
    pairs = []
    for m in PAREN_RE.finditer(sentence):
        sf = m.group(2)
        if not (sf.isascii() and sf.isalpha() and sum(c.isupper() for c in sf) >= 2):
            continue
        max_words = min(len(sf) + 5, 2 * len(sf))
        before = sentence[: m.start()]
        window_words = list(re.finditer(r"\S+", before))[-max_words:]
        if not window_words:
            continue
        sh = schwartz_hearst_long_form(sf, " ".join(w.group() for w in window_words))
        if sh is None or len(sh) <= len(sf) or sf.lower() in sh.lower().split():
            continue
        spans = split_words(before)[-len(sf):]
        if len(spans) == len(sf) and spells_a_span(sf, [before[a:b] for a, b in spans], len(sf), len(sf)):
            pairs.append(AcronymPair(sf.lower(), before[spans[0][0]: spans[-1][1]], spans[0][0], spans[-1][1],
                                     m.start(), m.end()))
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


# ---------------------------------------------------------------------------------------------
# Snippets around a definition


@dataclass
class SnippetCandidate:
    doc: Document
    snippet: str
    acronym: str
    entity: tuple[int, int]
    """Word indices [start, end) of the entity span in `words`."""
    words: list[str]
    """The snippet's whitespace words (`str.split()`, PAD's words), lowercased."""
    long_form: str
    """The entity's text, lowercased, without punctuation at its ends."""


def snippet_candidates(doc: Document, max_words: int, stats: Counter) -> Iterator[SnippetCandidate]:
    """Every usable definition of `doc` with its snippet: the sentence, the parentheticals removed, grown
    by neighbouring sentences up to `max_words`; `stats` counts what was found and dropped."""
    if not PAREN_RE.search(doc.text):
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
            if any(a < pair.long_end and b > pair.long_start for a, b in removed):
                # Another definition's "(ACRO)" is inside the entity ("Alpha (AB) Beta Gamma (ABG)"): removing it
                # changes the entity's words.
                stats["dropped_entity_changed"] += 1
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
            # Word offsets are taken before lowercasing: a few characters change length when lowercased. A removed
            # "(ACRO)" right after the entity may glue punctuation onto its last word ("tax (GST)." -> "tax."), so
            # the entity's words are those that overlap its characters.
            spans = split_words(snippet)
            idx = [i for i, (a, b) in enumerate(spans) if a < ent_end and b > ent_start]
            words = [snippet[a:b].lower() for a, b in spans]
            if not idx or idx[-1] + 1 - idx[0] != len(pair.acronym) \
                    or not spells_a_span(pair.acronym, words[idx[0]: idx[-1] + 1], len(pair.acronym), len(pair.acronym)):
                stats["dropped_entity_changed"] += 1  # not seen in the bundled corpus or the npm summaries
                continue
            long_form = _EDGE_NON_ALNUM.sub("", snippet[ent_start:ent_end]).lower()
            yield SnippetCandidate(doc, snippet.lower(), pair.acronym, (idx[0], idx[-1] + 1), words, long_form)
