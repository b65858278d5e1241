"""Words, initials and letter distributions of plain text, shared by the task builders, their
baselines and their checks.

Words here are letter/digit runs (`words_with_spans`): apostrophes join ("warcraft's" is one word),
hyphens split ("computer-generated" is two), French/Italian elisions split off ("l'organisation" is
"l'" and "organisation"). This is the word rule of the task data (AD snippets, CT titles), not the
whitespace words of corpus-time labels.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Iterable, Sequence

import numpy as np

# TODO(#16 merge): helper A's text.py brings aligned_labels.LETTERS, the same string: keep one.
LETTERS = "abcdefghijklmnopqrstuvwxyz"

_WORD_RE = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
_ELISION_RE = re.compile(r"^((?:qu|[cdjlmnst])['’])(.+)$", re.IGNORECASE)
_ALNUM_RUN_RE = re.compile(r"[^\W_]+")


def words_with_spans(text: str) -> list[tuple[str, int, int]]:
    """Words of `text` (see the module docstring) with their character offsets."""
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


def first_letters(words: Sequence[str]) -> str:
    """Lowercased first characters of the words, whatever they are (no eligibility rule, unlike PAD's
    `initials`, which takes each word's first a-z letter and rejects words without one)."""
    return "".join(w[0].lower() for w in words)


def occurs_as_word(word: str, text: str) -> bool:
    """True if `word` is one of the letter/digit runs of `text` (case-insensitive)."""
    word = word.lower()
    return any(m.group().lower() == word for m in _ALNUM_RUN_RE.finditer(text))


def letter_probs(letters: Iterable[str], *, smooth: float) -> np.ndarray:
    """Distribution (26,) over a-z of `letters` (others ignored), with `smooth` added to every count."""
    tally = Counter(letters)
    counts = np.array([tally[c] + smooth for c in LETTERS], dtype=float)
    return counts / counts.sum()
