"""What the content holdout (platform/tasks/holdout.py) costs a corpus build: the staging pass of a preset's corpus,
timed with the rule off and on, interleaved (off, on, on, off, ...) so a change of machine load is spread.

Staging (`corpus_sources.stage_documents`: read the sources, hold out, write the documents to parquet parts) is
the only stage the rule touches; the tokenizer and labelling come after and see fewer documents. The rule runs
against the task folder that the preset's corpus would use (built first under a temporary root, not timed).
Prints per run the staging seconds, the documents kept and held out (per reason), and the rule's own time (the
`reason` calls alone, timed in a separate pass over the same documents).

    python benchmarks/throughput/holdout_cost.py --preset smoke --repeats 3
    python benchmarks/throughput/holdout_cost.py --preset mini --repeats 1
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from alignlab.platform.corpus.corpus_identity import content_holdout, heldout_doc_ids
from alignlab.platform.corpus.corpus_sources import iter_sources, stage_documents
from alignlab.platform.config import PRESETS
from alignlab.platform.presets import Preset
from alignlab.platform.storage.root import as_storage


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="smoke", choices=PRESETS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None, help="JSON file for the results")
    args = ap.parse_args()
    cfg = Preset.named(args.preset).corpus
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        ids, task_dir = heldout_doc_ids(cfg, as_storage(root))
        rule = content_holdout([root / "tasks" / task_dir])
        docs = [d for _, d in iter_sources(cfg)]
        t = time.perf_counter()
        reasons = Counter(rule.reason(d.text) for d in docs)
        rule_s = time.perf_counter() - t
        runs = []
        order = [False, True, True, False] * ((args.repeats + 1) // 2)
        for k, on in enumerate(order[: 2 * args.repeats]):
            out = Path(tmp) / f"stage-{k}"
            t = time.perf_counter()
            staged = stage_documents(iter_sources(cfg), out, cfg, set(ids), False, content=rule if on else None)
            runs.append({"rule": on, "stage_s": round(time.perf_counter() - t, 2), "documents": staged["documents"],
                         "held_out": staged["held_out_documents"]})
            print(json.dumps(runs[-1]), flush=True)
    off = sorted(r["stage_s"] for r in runs if not r["rule"])
    on = sorted(r["stage_s"] for r in runs if r["rule"])
    result = {"command": " ".join([sys.executable.rsplit("/", 1)[-1], *sys.argv]), "preset": args.preset,
              "documents_read": len(docs), "rule_reasons": {str(k): v for k, v in reasons.items()},
              "rule_only_s": round(rule_s, 2), "rule_us_per_document": round(1e6 * rule_s / max(len(docs), 1), 1),
              "stage_s_median_off": off[len(off) // 2], "stage_s_median_on": on[len(on) // 2], "runs": runs}
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
