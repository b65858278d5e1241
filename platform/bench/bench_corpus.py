"""The finished corpus (and task folder) a benchmark works on: its folder, tokenizer, training and held-out shards."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from alignlab.platform.encoder.tokenizer import Tokenizer


def only_folder(storage: Path, kind: str) -> Path:
    """The one folder under <storage>/<kind> ("corpus", "tasks"); exits naming the option to give otherwise."""
    root = storage / kind
    found = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if len(found) != 1:
        sys.exit(f"{Path(sys.argv[0]).name}: give --{kind} (found {len(found)} folders under {root})")
    return found[0]


def load_corpus(storage: Path, corpus: Path | None = None) -> tuple[Path, Tokenizer, pa.Table, pa.Table]:
    """(folder, tokenizer, train table, held-out table) of `corpus`, or of the only corpus under `storage`."""
    corpus = corpus or only_folder(storage, "corpus")
    if not (corpus / "manifest.json").is_file():
        sys.exit(f"{corpus}: not a finished corpus (no manifest.json); build one with `alignlab corpus build`")
    manifest = json.loads((corpus / "manifest.json").read_text())

    def shards(split: str) -> pa.Table:
        return pa.concat_tables([pq.read_table(corpus / "shards" / n) for n in manifest["shards"][split]])

    return corpus, Tokenizer(corpus / "tokenizer.model"), shards("train"), shards("eval")
