"""Build the shipped CT files from the annotation passes (run after adjudication; a test checks the output
is up to date):

    python tasks/task_data/npm/make_ct.py

Reads ct_texts.txt, pass1.txt and pass2.txt (two independent annotation passes, each by an annotator who
saw neither the other pass nor any adjudicated label) and adjudicated.txt (the source of truth). Writes
agreement.json (word-level Cohen's kappa of the two passes before adjudication, and more),
ct_pool.jsonl and ct_test.jsonl (disjoint, with no near-duplicate across them), and stats.json.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from alignlab.tasks import bracketed
from alignlab.tasks.ct_data import PAPER_CT_TAG_FRACTIONS, STOPWORDS, tag_fractions

HERE = Path(__file__).resolve().parent
TEST_SIZE = 260
SEED = 0


def build(here: Path = HERE) -> dict[str, str]:
    """{file name: content} of every generated file (nothing is written)."""
    texts = here / "ct_texts.txt"
    first = bracketed.read(here / "pass1.txt", texts=texts)
    second = bracketed.read(here / "pass2.txt", texts=texts)
    final = bracketed.read(here / "adjudicated.txt", texts=texts)
    agree = {"before_adjudication": bracketed.agreement(first, second),
             "pass1_vs_adjudicated": bracketed.agreement(first, final),
             "pass2_vs_adjudicated": bracketed.agreement(second, final)}
    pool, test = bracketed.split_pool_test(final, test_size=TEST_SIZE, seed=SEED, stopwords=STOPWORDS)
    jsonl = lambda exs: "".join(json.dumps({"tokens": list(e.tokens), "tags": list(e.tags)}) + "\n" for e in exs)
    stats = {"texts": len(final), "pool": len(pool), "test": len(test), "words": sum(len(e.tokens) for e in final),
             "tag_fractions": {k: round(v, 4) for k, v in tag_fractions(final).items()},
             "paper_tag_fractions": PAPER_CT_TAG_FRACTIONS,
             "tag_fractions_pool": {k: round(v, 4) for k, v in tag_fractions(pool).items()},
             "tag_fractions_test": {k: round(v, 4) for k, v in tag_fractions(test).items()},
             "split": {"test_size": TEST_SIZE, "seed": SEED, "near_duplicate": "same words after removing STOPWORDS"}}
    return {"agreement.json": json.dumps(agree, indent=2) + "\n", "ct_pool.jsonl": jsonl(pool),
            "ct_test.jsonl": jsonl(test), "stats.json": json.dumps(stats, indent=2) + "\n"}


if __name__ == "__main__":
    for name, content in build().items():
        (HERE / name).write_text(content, encoding="utf-8")
        print(f"wrote {HERE / name}", file=sys.stderr)
    print((HERE / "agreement.json").read_text())
    print((HERE / "stats.json").read_text())
