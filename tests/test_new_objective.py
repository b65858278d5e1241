"""Adding an objective is one module and no change to the engine: a toy objective defined and registered here, a
word-length tagger with its own corpus-time labels, is labelled into a corpus, pretrained and reported.

The toy follows the registry's recipe for an objective outside `alignlab.objectives` (platform/encoder/registry.py's
docstring): `@register` its config, and since Ray's workers cannot import this test file, pickle its module by
value before the corpus labelling actors and the training workers start.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from alignlab.platform.encoder import registry
from alignlab.platform.encoder.batching import IGNORE
from alignlab.platform.encoder.model import TokenHead
from alignlab.platform.encoder.registry import CorpusLabels, Objective, classification_sums

BUCKET_EDGES = (3, 6)
"""Word length in characters: 1-3 → class 0, 4-6 → class 1, longer → class 2."""
NUM_BUCKETS = len(BUCKET_EDGES) + 1


def length_buckets(lengths) -> np.ndarray:
    return np.searchsorted(np.asarray(BUCKET_EDGES), np.asarray(lengths, dtype=np.int64), side="left").astype(np.int8)


class WordLengthLabels(CorpusLabels):
    """Every word of every document gets its length bucket, on its first subword."""

    token_columns = ("wlen_a", "wlen_b")
    stats_columns = ("wlen_a",)

    def word_labels(self, doc, word_spans) -> np.ndarray:
        return length_buckets([e - s for s, e in word_spans])

    def count(self, table: pa.Table, acc: Counter) -> None:
        w = table.column("wlen_a").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        acc.update(w[w >= 0].tolist())

    def stats(self, acc: Counter) -> dict:
        return {"wlen_bucket_counts": {str(k): v for k, v in sorted(acc.items())}}


@dataclass(frozen=True, kw_only=True, slots=True)
class WordLengthConfig:
    name: ClassVar[str] = "wlen"
    weight: float = 1.0

    def build(self, tokenizer) -> "WordLength":
        return WordLength(self, tokenizer)


class WordLength(Objective):
    name = "wlen"
    corpus_labels = WordLengthLabels
    corpus_columns = WordLengthLabels.token_columns

    def load(self, ex, rows) -> None:
        ex.add_token_labels("wlen", rows["wlen_a"], rows["wlen_b"])

    @property
    def num_classes(self) -> int:
        return NUM_BUCKETS

    def build_head(self, model_cfg, encoder) -> torch.nn.Module:
        return TokenHead(model_cfg.hidden, NUM_BUCKETS, model_cfg.dropout)

    def loss_and_sums(self, head, hidden_BTH, batch):
        labels = batch["wlen"].reshape(-1)
        pos = torch.nonzero(labels != IGNORE).squeeze(1)
        h = hidden_BTH.reshape(-1, hidden_BTH.shape[-1]).index_select(0, pos)
        return classification_sums(head(h), labels.index_select(0, pos))


@pytest.fixture
def word_length(monkeypatch):
    """The toy registered for this test only (a user's module would just decorate its config with @register)."""
    # A copy of the discovered registry, restored afterwards: the other tests of the session never see the toy.
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry.registered()))
    registry.register(WordLengthConfig)
    return WordLengthConfig


@pytest.fixture
def by_value():
    import ray.cloudpickle

    mod = sys.modules[__name__]
    ray.cloudpickle.register_pickle_by_value(mod)
    yield
    ray.cloudpickle.unregister_pickle_by_value(mod)


def test_a_registered_objective_labels_corpus_words_on_their_first_subword(word_length, tmp_path):
    from alignlab.platform.corpus.corpus import chunk_document
    from alignlab.platform.encoder.tokenizer import Tokenizer, train_tokenizer
    from alignlab.platform.sources.documents import Document

    train_tokenizer(["a quick brown fox jumped over extraordinarily lazy dogs"] * 50, tmp_path / "t.model",
                    vocab_size=60)
    tok = Tokenizer(tmp_path / "t.model")
    text = "a quick brown fox jumped over extraordinarily lazy dogs"
    labellers = registry.corpus_labellers()
    assert "wlen" in [lab.name for lab in labellers]
    (row,) = chunk_document(Document(doc_id="d", text=text, kind="web"), tok, 200, labellers)
    expected = []
    for word, pieces in zip(text.split(), tok.encode_words(text.split())):
        expected += [int(length_buckets([len(word)])[0])] + [IGNORE] * (len(pieces) - 1)
    assert row["wlen_a"] == expected
    assert row["whp_a"] is None  # the bundled objectives still label as before: a web document has no links


@pytest.mark.ray
def test_a_toy_objective_from_a_test_module_is_labelled_pretrained_and_reported(ray_session, word_length, by_value,
                                                                                tmp_path):
    from alignlab.platform.config import to_dict
    from alignlab.platform.corpus.corpus import build_corpus, load_manifest
    from alignlab.platform.corpus.corpus_identity import corpus_id
    from alignlab.platform.presets import Preset
    from alignlab.platform.pretrain.driver import pretrain
    from alignlab.platform.report.report import pretrain_table

    ccfg = dataclasses.replace(Preset.named("smoke").corpus, hold_out_tasks=False)
    cdir = build_corpus(ccfg, tmp_path, progress=False)
    manifest = load_manifest(cdir)
    assert {"wlen_a", "wlen_b", "whp_a", "pad_label"} <= set(manifest["columns"])
    stats = json.loads((cdir / "stats.json").read_text())
    assert sum(stats["wlen_bucket_counts"].values()) > 1000 and stats["pad_pairs"]["positive"] > 0
    shard = pq.read_table(sorted((cdir / "shards" / "train").glob("*.parquet"))[0])
    assert shard.column("wlen_a").null_count == 0  # every document, linked or not
    # Its labels are part of the corpus's identity: the same config without the toy is another corpus.
    bundled_only = [lab for lab in registry.corpus_labellers() if lab.name != "wlen"]
    assert corpus_id(ccfg, [], labellers=bundled_only) != cdir.name

    cfg = dataclasses.replace(Preset.named("smoke").pretrain, objectives="mlm,wlen", max_steps=6, log_every=1)
    mdir = pretrain(cdir, cfg, tmp_path)
    ev = json.loads((mdir / "final" / "eval.json").read_text())
    assert 0.0 <= ev["eval/wlen/accuracy"] <= 1.0

    study = {"corpus_dir": str(cdir), "models": {"toy": {"model_id": mdir.name, "pretrain": to_dict(cfg)}}}
    header, _, row = pretrain_table(study)
    assert header.split("|")[4:6] == [" MLM ", " WLEN "]
    assert row.startswith("| toy | mlm+wlen | ") and f"{100 * ev['eval/wlen/accuracy']:.1f} / " in row
