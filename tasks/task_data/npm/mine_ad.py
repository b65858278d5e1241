"""Mine the out-of-domain AD test set from npm package summaries (run once; kept for provenance).

    python tasks/task_data/npm/mine_ad.py /path/to/npm.tsv --out tasks/task_data/npm/ad_ood.jsonl

The shipped file was mined (446 snippets) when AD's rule let minor words give no letter and split hyphenated
words, then filtered to PAD's word rule, which AD follows since (docs/data.md, "One word rule for PAD and AD"):

    python tasks/task_data/npm/mine_ad.py --strict-filter tasks/task_data/npm/ad_ood.jsonl \
        --out tasks/task_data/npm/ad_ood.jsonl

keeps a snippet when its positive is exactly the initials of its long form's whitespace words and its negative is
what the strict builder could have made: a pseudo acronym that still spells a span of the snippet, or a mutated
positive that spells none (`text.spells_a_span`). 332 of the 446 snippets stay: 90 positives skipped a minor word or
split a hyphen, and 24 pseudo-acronym negatives were initials of hyphen-split words that spell no whitespace span.

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

from alignlab.tasks.ad_data import AD_FORMAT, build_ad_dataset
from alignlab.platform.sources.documents import Document
from alignlab.platform.sources.text import first_letters, spells_a_span, words_of
from alignlab.platform.tasks.task_files import load_examples, write_jsonl


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


def strict_pairs(examples: list) -> tuple[list, dict]:
    """The (positive, negative) pairs of a set mined under the loose rule that the strict builder could have made
    (module docstring), and the counts of what was dropped."""
    kept, dropped = [], {"positive_not_initials": 0, "pseudo_negative_spells_no_span": 0,
                         "mutated_negative_spells_a_span": 0}
    for pos, neg in zip(examples[::2], examples[1::2]):
        assert pos.label == 1 and neg.label == 0 and pos.snippet == neg.snippet
        long_words, n = pos.long_form.split(), len(pos.acronym)
        if not (len(long_words) == n and spells_a_span(pos.acronym, long_words, n, n)
                and spells_a_span(pos.acronym, pos.snippet)):
            dropped["positive_not_initials"] += 1
            continue
        # The loose builder's pseudo acronyms were the first letters of letter/digit-run words (`words_of`).
        words = words_of(pos.snippet)
        was_pseudo = any(first_letters(words[i: i + n]) == neg.acronym for i in range(len(words) - n + 1))
        if was_pseudo and not spells_a_span(neg.acronym, pos.snippet):
            dropped["pseudo_negative_spells_no_span"] += 1
        elif not was_pseudo and spells_a_span(neg.acronym, pos.snippet):
            dropped["mutated_negative_spells_a_span"] += 1
        else:
            kept += [pos, neg]
    return kept, dropped


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("npm_tsv", nargs="?")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--strict-filter", metavar="JSONL", help="filter a mined set to the strict word rule instead")
    args = ap.parse_args(argv)
    if args.strict_filter:
        kept, dropped = strict_pairs(load_examples(AD_FORMAT, args.strict_filter))
        write_jsonl(args.out, kept)
        print(f"{len(kept) // 2} snippets kept -> {args.out}; dropped: {dropped}", file=sys.stderr)
        return 0
    if not args.npm_tsv:
        ap.error("give the npm TSV, or --strict-filter JSONL")
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
