"""The finished corpus a benchmark trains on: its folder, tokenizer, and training and held-out shards."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from alignlab.platform.tokenizer import Tokenizer


def load_corpus(storage: Path, corpus: Path | None = None) -> tuple[Path, Tokenizer, pa.Table, pa.Table]:
    """(folder, tokenizer, train table, held-out table) of `corpus`, or of the first corpus under `storage`."""
    corpus = corpus or next(iter(sorted((storage / "corpus").iterdir())))
    manifest = json.loads((corpus / "manifest.json").read_text())

    def shards(split: str) -> pa.Table:
        return pa.concat_tables([pq.read_table(corpus / "shards" / n) for n in manifest["shards"][split]])

    return corpus, Tokenizer(corpus / "tokenizer.model"), shards("train"), shards("eval")
