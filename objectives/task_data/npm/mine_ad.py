"""Mine the out-of-domain AD test set from npm package summaries (run once; kept for provenance).

    python objectives/task_data/npm/mine_ad.py /path/to/npm.tsv --out objectives/task_data/npm/ad_ood.jsonl

The same rules as the bundled (Wikipedia) AD set, through the same builder (`tasks.build_ad_dataset`):
Schwartz-Hearst pairs whose acronym letters are the initials of the long form, the parenthetical
removed, the snippet lowercased, one positive and one negative per snippet, negatives of the
positive's length with letters drawn from the positives' distribution. Only ASCII summaries are
read, and only the first of summaries that are identical after lowercasing. At most two snippets per
long form are kept (npm has 76 summaries defining "model context protocol (MCP)" alone), so that a few
package families do not dominate the test set.
"""
from __future__ import annotations

import argparse
import csv
import sys

from alignlab.objectives.ad_data import build_ad_dataset
from alignlab.platform.sources.documents import Document
from alignlab.platform.tasks.task_files import write_jsonl


def npm_documents(path):
    csv.field_size_limit(10**9)
    seen = set()
    with open(path, newline="", encoding="utf-8") as f:
        r = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(r)
        ni, si = header.index("name"), header.index("summary")
        for row in r:
            if len(row) <= si or not row[si].strip() or not row[si].isascii() or "(" not in row[si]:
                continue
            key = row[si].strip().lower()
            if key in seen:
                continue
            seen.add(key)
            yield Document(doc_id=f"npm:{row[ni]}", text=row[si].strip(), lang="en", kind="web")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("npm_tsv")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    docs = list(npm_documents(args.npm_tsv))
    examples, stats = build_ad_dataset(docs, seed=args.seed, target_snippets=10**6)
    stats.pop("doc_ids")
    per_long_form: dict[str, int] = {}
    kept = []
    for pos, neg in zip(examples[::2], examples[1::2]):  # the builder emits each snippet's positive, then negative
        assert pos.label == 1 and neg.label == 0 and pos.snippet == neg.snippet
        if per_long_form.get(pos.long_form, 0) < 2:
            per_long_form[pos.long_form] = per_long_form.get(pos.long_form, 0) + 1
            kept += [pos, neg]
    stats["num_snippets"], examples = len(kept) // 2, kept
    write_jsonl(args.out, examples)
    print(f"{stats['num_snippets']} snippets, {len(examples)} pairs from {len(docs)} summaries -> {args.out}",
          file=sys.stderr)
    print(stats, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
