"""Corpus-time labels of the two aligned objectives (paper §3.2, Figure 2): WHP word tags and PAD pairs.

Pure, deterministic (all randomness from the `np.random.Generator` passed in), numpy only.

Words
    `split_words(text)` gives the (start, end) character spans of `text.split()`'s whitespace unigrams.

WHP, Wikipedia hyperlink prediction (§3.2; classes of Figure 2's CT task)
    One tag per word, ids N=0, S=1, E=2, SE=3 (`WHP_TAGS`). A word belongs to a link when its span
    overlaps the link's span (a link may cover only part of a word: "[[bus]]es", or "Paris," with the
    comma outside). Of the words a link covers, the first is S, the last E, and a one-word link's word
    SE; words strictly inside a multiword link and words in no link are N. When two links touch the
    same word the earlier link wins: the later link keeps only the words no earlier link took, and its
    S/E/SE are placed on those (so every tag sequence stays well formed). A link that covers only
    whitespace tags nothing.

PAD, pseudo-acronym detection (§3.2, steps 1-3)
    A word's initial is its first alphabetic character, NFKD-decomposed with combining marks dropped,
    lowercased; if that is not in a-z (Greek, CJK, "Æ") or the word has no alphabetic character
    ("1990", "—") the word is ineligible, and so is every span containing it. Of the words'
    initials only contiguous spans of `min_words`..`max_words` (2..6) eligible words count.

    `make_pad_pairs` makes one (acronym, label, kind) per chunk:
    - The valid chunks (those with at least one eligible span) are split exactly in half by a random
      permutation: half positives (label 1, kind "pos"), half negatives (label 0); with an odd count
      a fair coin gives the extra one. Chunks with no eligible span get ("", -1, "none").
    - A chunk's *positive candidate*: span length uniform over the lengths that have an eligible span
      in the chunk, then a start uniform over the eligible spans of that length; its initials.
    - A negative is, with equal probability,
      "mutate": the chunk's own positive candidate with k letters replaced, k uniform in 1..len, the
      k positions a uniform subset, each replacement drawn from the corpus's word-initial letter
      distribution `letter_probs` and never equal to the letter it replaces; or
      "other": the positive candidate of another valid chunk of the batch, chosen uniformly.
    - No accidental match (step 3): a negative never equals the initials of any 2-6-word eligible
      span of its own chunk. A colliding draw is redrawn with the same length (so the length
      distribution of negatives stays that of the first draws, i.e. of positives): "mutate" with a
      fresh candidate of that length and fresh k, positions and letters; "other" with another chunk's
      candidate of that length, and after `_OTHER_RETRIES` failures by mutation. After
      `_MUTATE_RETRIES` more failures the chunk gets ("", -1, "none") (never seen on real text).

    Why replacement letters follow the corpus distribution rather than uniform a-z: uniform mutations
    put rare letters (x, q, z) into negatives, and a classifier that reads only the acronym's letters
    tells them apart from positives, a shortcut that teaches no spelling. Drawing "from p but different
    from the letter replaced" is still biased: it under-draws frequent letters (a "t" can never replace
    a "t"). So replacement letters are drawn from the kernel K(c, l) = q_l / (1 - q_c) (l != c),
    with q solved so that p K = p: a mutated letter is distributed exactly like the letter it
    replaced, and the letters of negatives match those of positives. Lengths match too: "mutate" keeps
    the candidate's length, "other" takes another chunk's candidate, and redraws keep the length.
"""
from __future__ import annotations

import bisect
import re
import unicodedata
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = [
    "WHP_TAGS", "N", "S", "E", "SE", "split_words", "whp_word_tags",
    "word_initial", "initials", "span_initials", "letter_distribution", "mutation_kernel", "make_pad_pairs",
]

WHP_TAGS = ("N", "S", "E", "SE")
N, S, E, SE = 0, 1, 2, 3

LETTERS = "abcdefghijklmnopqrstuvwxyz"
_INELIGIBLE = "#"  # stands for an ineligible word in a chunk's initials string; never in a-z
_OTHER_RETRIES = 16
_MUTATE_RETRIES = 64

# re's \s is exactly str.isspace (checked over all code points), so this is str.split()'s word set.
_WORD = re.compile(r"\S+")


# ---------------------------------------------------------------- words

def split_words(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of `text.split()`'s words, in order."""
    return [m.span() for m in _WORD.finditer(text)]


# ---------------------------------------------------------------- WHP

def _link_bounds(link) -> tuple[int, int]:
    if hasattr(link, "start"):
        return int(link.start), int(link.end)
    return int(link[0]), int(link[1])


def whp_word_tags(word_spans, links) -> np.ndarray:
    """One WHP tag id per word (N=0, S=1, E=2, SE=3); see the module docstring for the rule.

    `word_spans`: (start, end) pairs as from `split_words`, sorted; `links`: `Link`s or (start, end[, ...])
    tuples, character offsets into the same text.
    """
    n = len(word_spans)
    tags = np.zeros(n, dtype=np.int8)
    if n == 0 or not links:
        return tags
    spans = np.asarray(word_spans, dtype=np.int64).reshape(n, 2)
    bounds = sorted(_link_bounds(link) for link in links)
    lo = np.asarray([b[0] for b in bounds], dtype=np.int64)
    hi = np.asarray([b[1] for b in bounds], dtype=np.int64)
    # word w overlaps link [lo, hi) iff start_w < hi and end_w > lo
    first = np.searchsorted(spans[:, 1], lo, side="right")  # first word ending after lo
    last = np.searchsorted(spans[:, 0], hi, side="left") - 1  # last word starting before hi
    taken = -1  # highest word index claimed by an earlier link
    for a, b in zip(first.tolist(), last.tolist()):
        a = max(a, taken + 1)  # earlier link wins on shared words
        if a > b:
            continue
        if a == b:
            tags[a] = SE
        else:
            tags[a] = S
            tags[b] = E
        taken = b
    return tags


# ---------------------------------------------------------------- PAD: initials

def _slow_initial(word: str) -> str:
    for ch in word:
        if ch.isalpha():
            base = unicodedata.normalize("NFKD", ch)
            base = "".join(c for c in base if not unicodedata.combining(c)).lower()
            return base[0] if base and base[0] in LETTERS else ""
    return ""


def word_initial(word: str) -> str:
    """The word's PAD initial in a-z, or "" when the word is ineligible."""
    c = word[:1]
    if c and c in _ASCII_LETTERS:
        return c.lower()
    return _slow_initial(word)


_ASCII_LETTERS = frozenset(LETTERS + LETTERS.upper())


class _InitialCache(dict):
    """word -> initial, or _INELIGIBLE; `map(cache.__getitem__, words)` runs at C speed on hits."""

    def __missing__(self, word: str) -> str:
        c = word_initial(word) or _INELIGIBLE
        self[word] = c
        return c


def _initials_string(words: Sequence[str], cache: _InitialCache) -> str:
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


def _check_lengths(min_words: int, max_words: int) -> None:
    if not (1 <= min_words <= max_words):
        raise ValueError(f"need 1 <= min_words <= max_words, got min_words={min_words}, max_words={max_words}")


def span_initials(words: Sequence[str], min_words: int = 2, max_words: int = 6) -> set[str]:
    """Initials of every contiguous `min_words`..`max_words`-word span of eligible words."""
    _check_lengths(min_words, max_words)
    s = _initials_string(words, _InitialCache())
    out: set[str] = set()
    for run in s.split(_INELIGIBLE):
        for length in range(min_words, min(max_words, len(run)) + 1):
            out.update(run[i:i + length] for i in range(len(run) - length + 1))
    return out


def letter_distribution(word_lists_or_texts: Iterable[str | Sequence[str]]) -> np.ndarray:
    """Distribution (26,) over a-z of the word initials of a corpus sample (texts or word lists)."""
    counts = np.zeros(26, dtype=np.int64)
    cache = _InitialCache()
    for item in word_lists_or_texts:
        words = item.split() if isinstance(item, str) else item
        s = _initials_string(words, cache)
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


# ---------------------------------------------------------------- PAD: pairs

class _Chunk:
    """A chunk's initials string and its eligible spans by length, computed once."""

    __slots__ = ("s", "lengths", "runs")

    def __init__(self, s: str, min_words: int, max_words: int):
        self.s = s
        if _INELIGIBLE not in s:
            self.runs = None
            self.lengths = list(range(min_words, min(max_words, len(s)) + 1))
        else:
            runs, pos = [], 0
            for part in s.split(_INELIGIBLE):
                if len(part) >= min_words:
                    runs.append((pos, len(part)))
                pos += len(part) + 1
            self.runs = runs
            longest = max((r for _, r in runs), default=0)
            self.lengths = list(range(min_words, min(max_words, longest) + 1))

    def span(self, length: int, u: float) -> str | None:
        """Initials of the eligible span of `length` picked by u in [0, 1); None if there is none."""
        s = self.s
        if self.runs is None:
            count = len(s) - length + 1
            if count <= 0:
                return None
            i = min(int(u * count), count - 1)
            return s[i:i + length]
        counts = [max(0, r - length + 1) for _, r in self.runs]
        total = sum(counts)
        if total == 0:
            return None
        i = min(int(u * total), total - 1)
        for (off, _), c in zip(self.runs, counts):
            if i < c:
                return s[off + i:off + i + length]
            i -= c
        return None  # unreachable

    def candidate(self, u_len: float, u_start: float) -> str:
        ls = self.lengths
        length = ls[min(int(u_len * len(ls)), len(ls) - 1)]
        return self.span(length, u_start)


def _mutate(cand: str, u_k: float, u_pos: Sequence[float], u_let: Sequence[float], cum: list[list[float]],
            K: np.ndarray) -> str:
    L = len(cand)
    k = min(int(u_k * L), L - 1) + 1
    chosen = sorted(range(L), key=u_pos.__getitem__)[:k]
    out = list(cand)
    for j in chosen:
        c = ord(out[j]) - 97
        r = bisect.bisect_right(cum[c], u_let[j])
        if r == c or r > 25:  # float edge at the end of a row: take the row's likeliest other letter
            r = int(np.argmax(K[c]))
        out[j] = LETTERS[r]
    return "".join(out)


def make_pad_pairs(
    chunks: Sequence[Sequence[str]],
    rng: np.random.Generator,
    letter_probs: np.ndarray,
    *,
    min_words: int = 2,
    max_words: int = 6,
) -> list[tuple[str, int, str]]:
    """One (acronym, label, kind) per chunk (a chunk is its list of words); rules in the module docstring.

    label 1 = positive (kind "pos"), 0 = negative (kind "mutate" or "other"), -1 = no eligible span
    (kind "none", acronym ""); callers skip label -1. Among the others labels are 50/50 (+-1).
    """
    _check_lengths(min_words, max_words)
    K = mutation_kernel(letter_probs)
    cum = np.cumsum(K, axis=1)
    cum[:, -1] = 1.0
    cum = cum.tolist()

    cache = _InitialCache()
    n = len(chunks)
    info = [_Chunk(_initials_string(words, cache), min_words, max_words) for words in chunks]
    valid = [i for i, c in enumerate(info) if c.lengths]
    nv = len(valid)
    out: list[tuple[str, int, str]] = [("", -1, "none")] * n
    if nv == 0:
        return out
    where = {i: k for k, i in enumerate(valid)}

    n_pos = nv // 2 + (int(rng.random() < 0.5) if nv % 2 else 0)
    order = rng.permutation(nv)
    is_pos = np.zeros(nv, dtype=bool)
    is_pos[order[:n_pos]] = True
    is_pos = is_pos.tolist()
    # Pre-drawn uniforms (vectorised); redraws after a collision take fresh scalars from rng.
    U = rng.random((nv, 6)).tolist()  # len, start, kind, other chunk, k, (spare)
    W = rng.random((nv, 2 * max_words)).tolist()  # mutation positions | replacement letters

    def other_chunk(i_pos: int, u: float) -> _Chunk:
        j = min(int(u * (nv - 1)), nv - 2)
        return info[valid[j + (j >= i_pos)]]

    for k, i in enumerate(valid):
        ch = info[i]
        u = U[k]
        if is_pos[k]:
            out[i] = (ch.candidate(u[0], u[1]), 1, "pos")
            continue
        s = ch.s
        kind = "mutate" if (u[2] < 0.5 or nv < 2) else "other"
        if kind == "mutate":
            cand = ch.candidate(u[0], u[1])
            w = W[k]
            neg = _mutate(cand, u[4], w[:max_words], w[max_words:], cum, K)
            length = len(cand)
        else:
            neg = other_chunk(k, u[3]).candidate(u[0], u[1])
            length = len(neg)
            tries = 0
            while neg in s and tries < _OTHER_RETRIES:
                tries += 1
                got = other_chunk(k, rng.random()).span(length, rng.random())
                if got is not None:
                    neg = got
            if neg in s:
                kind = "mutate"
        if neg in s and kind == "mutate":
            for _ in range(_MUTATE_RETRIES):
                cand = ch.span(length, rng.random())
                if cand is None:  # "other" fell back with a length this chunk lacks
                    length = ch.lengths[int(rng.random() * len(ch.lengths))]
                    continue
                neg = _mutate(cand, rng.random(), rng.random(max_words).tolist(),
                              rng.random(max_words).tolist(), cum, K)
                if neg not in s:
                    break
        # an a-z string of length >= 2 is a substring of the chunk's initials string iff it is the
        # initials of an eligible span (it cannot cross an ineligible word's "#")
        out[i] = (neg, 0, kind) if neg not in s and len(neg) >= min_words else ("", -1, "none")
    return out
