"""Select the texts of the hand-labelled CT set from npm package summaries (run once; kept for provenance).

    python tasks/task_data/npm/select_texts.py /path/to/npm.tsv --out tasks/task_data/npm/ct_texts.txt

The input is a tab-separated list of npm packages with a `summary` column (public package metadata).
A summary is kept when it is ASCII, has 3-20 words after CT tokenization (lowercased, `words_of`),
at least one common English word, no parenthetical acronym (those summaries feed the out-of-domain AD
set instead) and no near-duplicate among the kept texts (same words after removing stop words).
Texts are drawn at random (seed 0) from packages with at least 1,000 downloads a month, so the set
leans towards maintained packages rather than placeholders.
"""
from __future__ import annotations

import argparse
import csv
import random
import re
import sys

ENGLISH = frozenset("""a an the for to of with and in on from by your you that this is are it as or into using based
based simple fast small tiny library module plugin tool tools utility utilities component components helper helpers
package support wrapper client server api data file files""".split())
STOP = frozenset("""a an the for to of with and in on from by your you that this is are it as or into using based
at be can all any its via""".split())
_WORD_RE = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
_PAREN_ACRONYM = re.compile(r"\(\s*[A-Za-z]*[A-Z][A-Za-z]*[A-Z][A-Za-z]*\s*\)")


def ct_words(summary: str) -> list[str]:
    return _WORD_RE.findall(summary.lower())


def near_duplicate_key(words: list[str]) -> tuple[str, ...]:
    return tuple(sorted(set(w for w in words if w not in STOP)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("npm_tsv")
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=560)
    ap.add_argument("--min-downloads", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    csv.field_size_limit(10**9)
    cands = []
    with open(args.npm_tsv, newline="", encoding="utf-8") as f:
        r = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(r)
        si, di = header.index("summary"), header.index("downloads_a_month")
        for row in r:
            if len(row) <= si:
                continue
            s = row[si].strip()
            dl = int(row[di]) if row[di].isdigit() else 0
            if dl < args.min_downloads or not s.isascii() or _PAREN_ACRONYM.search(s) or "http" in s.lower():
                continue
            words = ct_words(s)
            if not 3 <= len(words) <= 20 or not ENGLISH & set(words):
                continue
            if sum(w.isalpha() for w in words) < 0.8 * len(words) or max(len(w) for w in words) > 25:
                continue
            cands.append(words)
    random.Random(args.seed).shuffle(cands)
    seen, out = set(), []
    for words in cands:
        key = near_duplicate_key(words)
        text = " ".join(words)
        if key in seen or text in seen or not key:
            continue
        seen.update((key, text))
        out.append(text)
        if len(out) == args.n:
            break
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("".join(t + "\n" for t in out))
    print(f"{len(out)} texts from {len(cands)} candidates -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
