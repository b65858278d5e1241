"""The bracketed text format of hand-labelled CT data: `a [spatial graph] library for [python]`.

It is the source of truth of a hand-labelled CT set because a person can read and review it; the
JSONL the studies read (`{"tokens": [...], "tags": [...]}`) is made from it by `convert`, which
refuses anything malformed and names the file, the line and the problem.

A bracket may touch its word or stand apart (`[react]`, `[ react ]`); brackets never nest and never
split a word. A one-word concept is tagged SE; a longer one S, N…, E; words outside concepts are N.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

from alignlab.tasks.ct_data import CTExample
from alignlab.platform.tasks.task_files import TaskDataError


def parse_line(line: str) -> tuple[list[str], list[str]]:
    """(tokens, tags) of one bracketed line; ValueError with the problem if it is malformed."""
    spaced = line.replace("[", " [ ").replace("]", " ] ").split()
    tokens: list[str] = []
    tags: list[str] = []
    open_at: int | None = None
    for piece in spaced:
        if piece == "[":
            if open_at is not None:
                raise ValueError("'[' inside an open concept (brackets do not nest)")
            open_at = len(tokens)
        elif piece == "]":
            if open_at is None:
                raise ValueError("']' without an open '['")
            n = len(tokens) - open_at
            if n == 0:
                raise ValueError("empty concept '[]'")
            tags[open_at:] = ["SE"] if n == 1 else ["S"] + ["N"] * (n - 2) + ["E"]
            open_at = None
        else:
            tokens.append(piece)
            tags.append("N")
    if open_at is not None:
        raise ValueError("'[' never closed")
    if not tokens:
        raise ValueError("no words")
    for i in range(1, len(line)):  # a bracket glued between two word characters splits a word
        if line[i] in "[]" and i + 1 < len(line) and line[i - 1].isalnum() and line[i + 1].isalnum():
            raise ValueError(f"bracket inside a word at column {i + 1}")
    return tokens, tags


def to_line(tokens: Sequence[str], tags: Sequence[str]) -> str:
    """The bracketed form of a tagged query (the inverse of parse_line)."""
    out = []
    for tok, tag in zip(tokens, tags):
        if tag in ("S", "SE"):
            tok = "[" + tok
        if tag in ("E", "SE"):
            tok = tok + "]"
        out.append(tok)
    return " ".join(out)


def read(path, *, texts=None) -> list[CTExample]:
    """The examples of a bracketed file, one per non-blank line (lines starting with '#' are comments).

    With `texts` (a file of plain texts, one per line), line i of `path` must have exactly the words of
    line i of `texts`. Raises TaskDataError listing every problem as FILE:LINE: problem."""
    path = Path(path)
    problems, examples = [], []
    try:
        raw = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise TaskDataError([f"{path}: not UTF-8 ({e.reason} at byte {e.start})"]) from None
    except OSError as e:
        raise TaskDataError([f"{path}: {e.strerror or e}"]) from None
    expected = None
    if texts is not None:
        expected = [ln.split() for ln in Path(texts).read_text(encoding="utf-8").splitlines() if ln.strip()]
    k = 0
    for no, line in enumerate(raw, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            tokens, tags = parse_line(line)
        except ValueError as e:
            problems.append(f"{path}:{no}: {e}")
            k += 1
            continue
        if expected is not None:
            want = expected[k] if k < len(expected) else None
            if want is None:
                problems.append(f"{path}:{no}: more lines than the {len(expected)} texts of {texts}")
            elif tokens != want:
                diff = next((i for i, (a, b) in enumerate(zip(tokens, want)) if a != b), min(len(tokens), len(want)))
                problems.append(f"{path}:{no}: words differ from text {k + 1} of {texts} at word {diff + 1} "
                                f"({' '.join(tokens[diff:diff + 3])!r} vs {' '.join(want[diff:diff + 3])!r})")
        examples.append(CTExample(tuple(tokens), tuple(tags)))
        k += 1
    if expected is not None and k < len(expected):
        problems.append(f"{path}: {k} labelled lines for the {len(expected)} texts of {texts}")
    if problems:
        raise TaskDataError(problems)
    return examples


def convert(src, dst, *, texts=None) -> int:
    """Bracketed file -> CT JSONL (temp name, renamed last); returns the number of examples."""
    examples = read(src, texts=texts)
    dst = Path(dst)
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        for ex in examples:
            f.write(json.dumps({"tokens": list(ex.tokens), "tags": list(ex.tags)}, ensure_ascii=False) + "\n")
    os.replace(tmp, dst)
    return len(examples)



def cohen_kappa(a: Sequence[str], b: Sequence[str]) -> float:
    """Cohen's kappa of two annotators' labels of the same items: (p_o - p_e) / (1 - p_e)."""
    if len(a) != len(b) or not a:
        raise ValueError("kappa needs two equally long, non-empty label sequences")
    n = len(a)
    p_o = sum(x == y for x, y in zip(a, b)) / n
    labels = set(a) | set(b)
    p_e = sum((list(a).count(k) / n) * (list(b).count(k) / n) for k in labels)
    return 1.0 if p_e == 1 else (p_o - p_e) / (1 - p_e)


def _spans(tags: Sequence[str]) -> set[tuple[int, int]]:
    out, start = set(), None
    for i, t in enumerate(tags):
        if t == "SE":
            out.add((i, i + 1))
        elif t == "S":
            start = i
        elif t == "E" and start is not None:
            out.add((start, i + 1))
            start = None
    return out


def agreement(first: Sequence[CTExample], second: Sequence[CTExample]) -> dict:
    """Agreement of two independent annotation passes of the same texts: word-level Cohen's kappa on the
    tags, raw word agreement, exact span F1 (one pass as reference; F1 is symmetric) and identical texts."""
    if len(first) != len(second) or any(x.tokens != y.tokens for x, y in zip(first, second)):
        raise ValueError("the two passes must label the same texts in the same order")
    a = [t for ex in first for t in ex.tags]
    b = [t for ex in second for t in ex.tags]
    sa = [_spans(ex.tags) for ex in first]
    sb = [_spans(ex.tags) for ex in second]
    both = sum(len(x & y) for x, y in zip(sa, sb))
    na, nb = sum(map(len, sa)), sum(map(len, sb))
    return {"texts": len(first), "words": len(a), "cohen_kappa_tags": round(cohen_kappa(a, b), 4),
            "word_agreement": round(sum(x == y for x, y in zip(a, b)) / len(a), 4),
            "span_f1": round(2 * both / (na + nb), 4) if na + nb else 1.0,
            "identical_texts": round(sum(x.tags == y.tags for x, y in zip(first, second)) / len(first), 4),
            "concepts_first": na, "concepts_second": nb}


def near_duplicate_key(tokens: Sequence[str], stopwords) -> tuple[str, ...]:
    """Texts with the same key are near-duplicates: the same words once stop words are removed."""
    return tuple(sorted({t for t in tokens if t not in stopwords}))


def split_pool_test(examples: Sequence[CTExample], *, test_size: int, seed: int, stopwords) -> tuple[list, list]:
    """A pool and a test set sharing no text and no near-duplicate (near_duplicate_key): texts are shuffled
    with `seed`, grouped by key, and whole groups go to the test set until it holds `test_size`."""
    import random

    groups: dict[tuple, list[CTExample]] = {}
    for ex in examples:
        groups.setdefault(near_duplicate_key(ex.tokens, stopwords), []).append(ex)
    keys = sorted(groups)
    random.Random(seed).shuffle(keys)
    pool, test = [], []
    for k in keys:
        (test if len(test) < test_size else pool).extend(groups[k])
    return pool, test


if __name__ == "__main__":  # python -m alignlab.tasks.bracketed LABELLED.txt [TEXTS.txt]: check a file
    import sys

    try:
        n = len(read(sys.argv[1], texts=sys.argv[2] if len(sys.argv) > 2 else None))
    except TaskDataError as e:
        print("\n".join(e.problems))
        sys.exit(1)
    print(f"{sys.argv[1]}: {n} lines, well-formed")
