"""Words, word initials and letter distributions: text rules shared by corpus labels and task data.

Two word rules, for two jobs. Corpus-time labels (WHP tags, PAD pairs) use `str.split()`'s whitespace
unigrams (`split_words` gives their character spans). Task data (AD snippets, CT titles) uses letter/digit
runs (`words_with_spans`): apostrophes join ("warcraft's" is one word), hyphens split ("computer-generated"
is two), French/Italian elisions split off ("l'organisation" is "l'" and "organisation").

A word's initial is its first alphabetic character, NFKD-decomposed with combining marks dropped,
lowercased; if that is not in a-z (Greek, CJK, "Æ") or the word has no alphabetic character ("1990",
"—") the word is ineligible, and so is every span containing it. `span_initials` gives the initials of
every contiguous `min_words`..`max_words`-word span of eligible words; `initials_string` writes a word
list's initials with `INELIGIBLE` standing for an ineligible word, so that an a-z string of length >= 2
is a substring of it iff it is the initials of an eligible span.

`mutation_kernel` is a letter-replacement kernel that leaves a letter distribution unchanged.

Pure and deterministic, numpy only.
"""
from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

LETTERS = "abcdefghijklmnopqrstuvwxyz"
INELIGIBLE = "#"  # stands for an ineligible word in a chunk's initials string; never in a-z

# re's \s is exactly str.isspace (checked over all code points), so this is str.split()'s word set.
_WORD = re.compile(r"\S+")


# ---------------------------------------------------------------- words

def split_words(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of `text.split()`'s words, in order."""
    return [m.span() for m in _WORD.finditer(text)]


# ---------------------------------------------------------------- initials

def _slow_initial(word: str) -> str:
    for ch in word:
        if ch.isalpha():
            base = unicodedata.normalize("NFKD", ch)
            base = "".join(c for c in base if not unicodedata.combining(c)).lower()
            return base[0] if base and base[0] in LETTERS else ""
    return ""


def word_initial(word: str) -> str:
    """The word's initial in a-z, or "" when the word is ineligible."""
    c = word[:1]
    if c and c in _ASCII_LETTERS:
        return c.lower()
    return _slow_initial(word)


_ASCII_LETTERS = frozenset(LETTERS + LETTERS.upper())
_LOWER_LETTERS = frozenset(LETTERS)


class InitialCache(dict):
    """word -> initial, or INELIGIBLE; `map(cache.__getitem__, words)` runs at C speed on hits."""

    def __missing__(self, word: str) -> str:
        c = word_initial(word) or INELIGIBLE
        self[word] = c
        return c


def initials_string(words: Sequence[str], cache: InitialCache) -> str:
    return "".join(map(cache.__getitem__, words))


def initials(words: Sequence[str]) -> str:
    """Concatenated initials of `words`; ValueError if a word has no a-z initial (ineligible)."""
    out = []
    for w in words:
        c = word_initial(w)
        if not c:
            raise ValueError(f"word {w!r} has no a-z initial; spans containing it are ineligible")
        out.append(c)
    return "".join(out)


def check_span_lengths(min_words: int, max_words: int) -> None:
    if not (1 <= min_words <= max_words):
        raise ValueError(f"need 1 <= min_words <= max_words, got min_words={min_words}, max_words={max_words}")


def span_initials(words: Sequence[str], min_words: int = 2, max_words: int = 6) -> set[str]:
    """Initials of every contiguous `min_words`..`max_words`-word span of eligible words."""
    check_span_lengths(min_words, max_words)
    s = initials_string(words, InitialCache())
    out: set[str] = set()
    for run in s.split(INELIGIBLE):
        for length in range(min_words, min(max_words, len(run)) + 1):
            out.update(run[i:i + length] for i in range(len(run) - length + 1))
    return out


def spelled_spans(letters: str, text: str | Sequence[str], min_words: int = 2,
                  max_words: int = 6) -> list[tuple[int, int]]:
    """Word index spans [start, end) of the whitespace words (`str.split()`) of `text` (or of the given word list)
    whose initials are `letters` (lowercased): every span that PAD's rule (`spells_a_span`) finds, in order."""
    a = letters.lower()
    if not (min_words <= len(a) <= max_words and set(a) <= _LOWER_LETTERS):
        return []
    words = text.split() if isinstance(text, str) else text
    s = initials_string(words, InitialCache())
    out, i = [], s.find(a)
    while i >= 0:
        out.append((i, i + len(a)))
        i = s.find(a, i + 1)
    return out


def spells_a_span(letters: str, text: str | Sequence[str], min_words: int = 2, max_words: int = 6) -> bool:
    """PAD's exact rule as one function (make_pad_pairs' labels obey it, tests/test_ad_word_rule.py; AD's miner,
    its negatives and its span matchers use it, tasks/ad_mining.py): are `letters`
    (lowercased) the initials of a contiguous `min_words`..`max_words` span of eligible whitespace words
    (`str.split()`) of `text` (or of the given word list)? Every word gives its initial, minor words too, and a
    hyphenated word is one word."""
    return bool(spelled_spans(letters, text, min_words, max_words))


def letter_distribution(word_lists_or_texts: Iterable[str | Sequence[str]]) -> np.ndarray:
    """Distribution (26,) over a-z of the word initials of a corpus sample (texts or word lists)."""
    counts = np.zeros(26, dtype=np.int64)
    cache = InitialCache()
    for item in word_lists_or_texts:
        words = item.split() if isinstance(item, str) else item
        s = initials_string(words, cache)
        for k, c in enumerate(LETTERS):
            counts[k] += s.count(c)
    total = counts.sum()
    if total == 0:
        raise ValueError("letter_distribution: the sample has no word with an a-z initial")
    return counts / total


def mutation_kernel(letter_probs: np.ndarray, *, iters: int = 500, tol: float = 1e-12) -> np.ndarray:
    """Row-stochastic (26, 26) K with zero diagonal and p K = p, of the form K[c, l] = q_l / (1 - q_c).

    A letter drawn from p and then replaced by a draw from K[c] is again distributed as p, so mutated
    negatives carry the same letter distribution as positives. Needs max(p) <= 1/2 (a letter that is
    more than half of all initials cannot be replaced by others often enough); p is first mixed with
    uniform just enough to satisfy that.
    """
    p = np.asarray(letter_probs, dtype=np.float64).reshape(-1)
    if p.shape != (26,) or not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
        raise ValueError("letter_probs must be 26 finite non-negative numbers (a-z) with a positive sum")
    p = p / p.sum()
    cap = 0.45
    if p.max() > cap:
        a = (p.max() - cap) / (p.max() - 1 / 26)
        p = (1 - a) * p + a / 26
    # Fixed point of q = normalize(p / (A - w)), w_c = p_c / (1 - q_c), A = sum(w): at it p K = p.
    q = p.copy()
    for _ in range(iters):
        w = p / (1 - q)
        q_new = p / (w.sum() - w)
        q_new /= q_new.sum()
        done = np.abs(q_new - q).max() < tol
        q = q_new
        if done:
            break
    K = q[None, :] / (1 - q[:, None])
    np.fill_diagonal(K, 0.0)
    K /= K.sum(axis=1, keepdims=True)
    if np.abs(p @ K - p).max() > 1e-6:  # not reached for any p with max <= cap; keep a safe kernel
        K = np.where(np.eye(26, dtype=bool), 0.0, p[None, :] + 1e-12)
        K /= K.sum(axis=1, keepdims=True)
    return K


# ---------------------------------------------------------------- task data: letter/digit-run words

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
