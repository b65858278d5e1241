"""The order of a corpus's rows: documents spread over the shards by a hash of their id (`shuffle_documents`).

Pretraining streams the shards in order through a shuffle buffer of a few batches, so a corpus whose shards
held the documents in reading order taught one language or source at a time (docs/journal/round-08.md).
"""
from __future__ import annotations

import dataclasses

import pyarrow.parquet as pq

from alignlab.platform.corpus.corpus_config import CorpusConfig
from alignlab.platform.corpus.corpus_sources import doc_hash, stage_documents
from alignlab.platform.sources.documents import Document

SOURCES = ("en", "es", "fr")


def _reading_order() -> list[tuple[int, Document]]:
    # Three sources of 100 documents each, read one after the other, as a multi-source or multilingual corpus is.
    return [(i, Document(doc_id=f"{lang}:{n}", text=f"document {n} in {lang}", lang=lang))
            for i, lang in enumerate(SOURCES) for n in range(100)]


def _parts(folder) -> list[list[str]]:
    return [pq.read_table(f).column("doc_id").to_pylist() for f in sorted(folder.glob("part-*.parquet"))]


def _stage(tmp_path, name: str, **cfg) -> list[list[str]]:
    config = CorpusConfig(docs_per_shard=100, eval_fraction=0.0, tokenizer_sample_docs=10, **cfg)
    stage_documents(iter(_reading_order()), tmp_path / name, config, set(), progress=False)
    return _parts(tmp_path / name / "train")


def test_shuffled_parts_hold_every_document_once_and_each_part_mixes_every_source(tmp_path):
    parts = _stage(tmp_path, "shuffled")
    assert len(parts) == 3
    assert sorted(d for p in parts for d in p) == sorted(d.doc_id for _, d in _reading_order())
    for part in parts:
        assert {d.split(":")[0] for d in part} == set(SOURCES), "every part is a sample of every source"
        assert [doc_hash(d) for d in part] == sorted(doc_hash(d) for d in part)
    assert not (tmp_path / "shuffled" / "train" / "buckets").exists()


def test_the_shuffled_order_is_the_same_on_every_build(tmp_path):
    assert _stage(tmp_path, "a") == _stage(tmp_path, "b")


def test_with_shuffling_off_the_parts_keep_the_reading_order(tmp_path):
    parts = _stage(tmp_path, "ordered", shuffle_documents=False)
    assert parts == [[d.doc_id for _, d in _reading_order()][k * 100:(k + 1) * 100] for k in range(3)]
    assert dataclasses.replace(CorpusConfig(), shuffle_documents=False) != CorpusConfig()
