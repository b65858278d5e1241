"""The synthetic source: documents over a small lexicon, for the alignment positive control (issue #65).

The lexicon is 44 made-up four-letter words, two for each of 22 initials, and those 22 letters as words, short and
frequent enough that a
sentencepiece model of a few hundred pieces keeps each word as one piece, so that an initial is a property of a
piece and PAD needs no spelling from inside a piece. A
document is `SYNTHETIC_WORDS` words drawn uniformly from the lexicon, with a few fixed multi-word "entities"
(three-word names) spliced in and linked, so that WHP has links to learn from and PAD's spans are whole words.

The text is a pure function of (`SYNTHETIC_VERSION`, the document's index): the same corpus on every machine,
fingerprinted by the version alone (`corpus_identity`). `synthetic_documents(n, namespace)` draws documents of
another namespace for task snippets, which are therefore never corpus text.
"""
from __future__ import annotations

import functools
import random
from collections.abc import Iterator

from alignlab.platform.sources.documents import Document, Link

SYNTHETIC_VERSION = 2
"""Bump when the lexicon, the entities or the document rule change: it is the source's fingerprint."""
SYNTHETIC_DOCS = 12000
"""Documents of the corpus namespace (`max_docs_per_lang` caps them): enough that the control's 4,000 steps pass
over the text about 12 times, under the study runner's limit of 20."""
SYNTHETIC_WORDS = (3, 6)
"""Words of a document, inclusive bounds (entities count as their three words). Short on purpose: at 10-18 words
(version 1) nearly half of the 22 initials are in every chunk, and the control's 64x2 model left PAD at chance
for 5,000 steps; at 3-6 words most letters of a negative are absent from its chunk, which gives PAD a first
foothold, and the model reaches 86% in 2,000 steps (benchmarks/probes/synthetic_world_pad_probe.py,
docs/journal/issue-65-cls-and-control.md)."""
_ONSETS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
INITIALS = "abcdefghijklmnoprstuvw"
LEXICON: tuple[str, ...] = tuple(
    f"{initial}{_VOWELS[(i + j) % 5]}{_ONSETS[(3 * i + j) % len(_ONSETS)]}{_VOWELS[(2 * i + j + 1) % 5]}"
    for i, initial in enumerate(INITIALS) for j in range(2)) + tuple(INITIALS)
"""44 four-letter words, two for each of 22 initials (no q, x, y, z), and the 22 letters as words of their own:
these make "▁a" a piece, which is how the tokenizer spells an acronym's letters (`Tokenizer.encode_spelled`),
so that a task's acronym written "a b c" enters exactly as PAD's acronyms do."""
ENTITIES: tuple[tuple[str, ...], ...] = tuple(
    tuple(LEXICON[(7 * e + 11 * k) % 44] for k in range(3)) for e in range(12))
"""Twelve three-word names that recur across documents and are linked (WHP's spans)."""
ENTITY_RATE = 0.12
"""Chance that a document position starts an entity rather than a lexicon word."""


def synthetic_text(rng: random.Random, letters: bool = True) -> tuple[str, list[tuple[int, int, str]]]:
    """One document's text and its linked entity spans (start, end, target); without `letters`, no one-letter
    words."""
    lexicon = LEXICON if letters else LEXICON[:44]
    n = rng.randint(*SYNTHETIC_WORDS)
    words: list[str] = []
    links: list[tuple[int, int, str]] = []
    pos = 0
    while len(words) < n:
        if n - len(words) >= 3 and rng.random() < ENTITY_RATE:
            ent = rng.choice(ENTITIES)
            start = pos + (1 if words else 0)
            text = " ".join(ent)
            links.append((start, start + len(text), "_".join(ent)))
            words.extend(ent)
            pos = start + len(text)
        else:
            w = rng.choice(lexicon)
            pos += len(w) + (1 if words else 0)
            words.append(w)
    return " ".join(words), links


@functools.cache
def _corpus_texts() -> frozenset[str]:
    return frozenset(d.text for d in synthetic_documents(SYNTHETIC_DOCS))


def synthetic_documents(n: int, namespace: str = "corpus", letters: bool = True) -> Iterator[Document]:
    """Documents 0..n-1 of `namespace` ("corpus" for the source; others for task snippets), kind "wiki"; without
    `letters`, of four-letter words only (a task snippet: its words never equal an acronym's letters). A document
    of another namespace is never the text of a corpus document (short documents do repeat: it is drawn again)."""
    for i in range(n):
        rng = random.Random(f"synthetic:{SYNTHETIC_VERSION}:{namespace}:{i}")
        text, links = synthetic_text(rng, letters)
        while namespace != "corpus" and text in _corpus_texts():
            text, links = synthetic_text(rng, letters)
        yield Document(doc_id=f"synthetic:{namespace}:{i}", text=text, lang="en", kind="wiki",
                       links=tuple(Link(s, e, t) for s, e, t in links), title=f"{namespace} {i}")


def read_synthetic(max_docs: int | None = None) -> Iterator[Document]:
    """The synthetic source's documents (English, linked), at most `max_docs`."""
    yield from synthetic_documents(SYNTHETIC_DOCS if max_docs is None else min(max_docs, SYNTHETIC_DOCS))
