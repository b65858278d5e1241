"""Make `software_summaries.txt`, the bundled software-domain text of the mini corpus (run once; kept for provenance).

    python platform/sources/corpus_data/make_software_summaries.py /path/to/pypi.tsv \
        --exclude tasks/task_data/npm/ct_texts.txt --exclude tasks/task_data/npm/ad_ood.jsonl \
        --out platform/sources/corpus_data/software_summaries.txt

The input is a tab-separated list of PyPI packages with `name` and `summary` columns (public package metadata).
A summary is kept when it is ASCII and has 4-40 words, once per text (compared lowercased, on letters and digits
only), and when it is not a near-duplicate (the same words less stop words) of any line of an `--exclude` file:
the FEL test texts (npm summaries) must stay out of every pretraining corpus. Then `--num` summaries are drawn at
random (seed 0) and written as `name<TAB>summary`, sorted by package name.
"""
from __future__ import annotations

import argparse
import csv
import json
import random
import re

STOP = frozenset("""a an the for to of with and in on from by your you that this is are it as or into using based
at be can all any its via""".split())
_WORD = re.compile(r"[a-z0-9]+")


def key(text: str) -> tuple[str, ...]:
    return tuple(_WORD.findall(text.lower()))


def near_duplicate_key(text: str) -> tuple[str, ...]:
    return tuple(sorted(set(w for w in key(text) if w not in STOP)))


def excluded_texts(path: str) -> list[str]:
    out = []
    for line in open(path, encoding="utf-8"):
        line = line.strip()
        if not line:
            continue
        if path.endswith(".jsonl"):
            obj = json.loads(line)
            line = " ".join(obj["tokens"]) if "tokens" in obj else str(obj.get("snippet") or obj.get("text") or "")
        out.append(line)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("pypi_tsv")
    ap.add_argument("--exclude", action="append", default=[])
    ap.add_argument("--num", type=int, default=40000)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    banned = {near_duplicate_key(t) for p in a.exclude for t in excluded_texts(p)}
    csv.field_size_limit(1 << 30)
    seen, kept = set(), []
    with open(a.pypi_tsv, encoding="utf-8", newline="") as f:
        rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(rows)
        name_col, summary_col = header.index("name"), header.index("summary")
        for row in rows:
            if len(row) <= summary_col:
                continue
            name, summary = row[name_col].strip(), " ".join(row[summary_col].split())
            if not name or not summary.isascii() or not 4 <= len(summary.split()) <= 40:
                continue
            k = key(summary)
            if k in seen or near_duplicate_key(summary) in banned:
                continue
            seen.add(k)
            kept.append((name, summary))
    random.Random(0).shuffle(kept)
    chosen = sorted(kept[:a.num])
    with open(a.out, "w", encoding="utf-8") as f:
        f.writelines(f"{n}\t{s}\n" for n, s in chosen)
    print(f"{len(kept)} eligible summaries, {len(banned)} excluded texts; wrote {len(chosen)} to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
