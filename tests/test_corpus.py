"""The corpus stage: chunking rules, the Ray Data build, its artifacts, and bad input."""
from __future__ import annotations

import bz2
import dataclasses
import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from alignlab.platform.corpus.corpus import MANIFEST, chunk_document, load_manifest, shard_names
from alignlab.platform.corpus.corpus_config import CorpusConfig
from alignlab.platform.encoder.tokenizer import Tokenizer, train_tokenizer
from alignlab.platform.presets import Preset
from alignlab.platform.sources.documents import CorpusInputError, Document, Link


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    texts = ["the quick brown fox jumps over the lazy dog near the river bank"] * 50 + \
            ["alan turing was a mathematician and computer scientist in england"] * 50
    train_tokenizer(texts, d / "tokenizer.model", vocab_size=120)
    return Tokenizer(d / "tokenizer.model")


def test_chunks_hold_at_most_chunk_len_tokens_and_point_at_their_next_chunk(tok):
    text = " ".join(["the quick brown fox jumps over the lazy dog"] * 20)
    rows = chunk_document(Document(doc_id="d", text=text, kind="web"), tok, chunk_len=16)
    assert len(rows) > 3
    assert all(len(r["a_ids"]) <= 16 for r in rows)
    for r, nxt in zip(rows, rows[1:]):
        assert r["has_next"] and r["b_ids"] == nxt["a_ids"] and r["b_text"] == nxt["a_text"]
    assert not rows[-1]["has_next"] and rows[-1]["b_ids"] == []
    # No word is split across chunks: the chunks' words are the document's words, in order.
    assert " ".join(r["a_text"] for r in rows) == text
    assert rows[0]["whp_a"] is None  # web documents carry no link labels


def test_whp_tags_sit_on_the_first_subword_of_each_word(tok):
    text = "alan turing was a mathematician in england"
    doc = Document(doc_id="d", text=text, kind="wiki",
                   links=(Link(0, 11, "Alan Turing"), Link(text.index("england"), len(text), "England")))
    (row,) = chunk_document(doc, tok, chunk_len=60)
    pieces = tok.encode_words(text.split())
    expected = []
    for word_tags, p in zip([1, 2, 0, 0, 0, 0, 3], pieces):
        expected += [word_tags] + [-100] * (len(p) - 1)
    assert row["whp_a"] == expected


@pytest.mark.ray
def test_the_smoke_corpus_builds_with_manifest_stats_tokenizer_and_labelled_shards(smoke_corpus):
    manifest = load_manifest(smoke_corpus)
    stats = json.loads((smoke_corpus / "stats.json").read_text())
    assert manifest["corpus_id"] == smoke_corpus.name
    assert stats["documents"] > 200 and stats["chunks"]["train"] > 500 and stats["tokens"] > 10_000
    assert 0 < stats["link_density"] < 0.5
    pad = stats["pad_pairs"]
    assert abs(pad["positive"] - pad["negative"]) <= 0.02 * (pad["positive"] + pad["negative"])
    counts = np.load(smoke_corpus / "token_counts.npy")
    assert counts.sum() > 0 and len(counts) == Tokenizer(smoke_corpus / "tokenizer.model").vocab_size
    table = pq.read_table(sorted((smoke_corpus / "shards" / "train").glob("*.parquet"))[0])
    assert {"a_ids", "b_ids", "whp_a", "pad_acronym", "pad_label", "has_next"} <= set(table.column_names)
    row = table.slice(0, 1).to_pylist()[0]
    assert len(row["a_ids"]) <= Preset.named("smoke").corpus.chunk_len
    assert not list(smoke_corpus.parent.glob("*.tmp-*")), "no half-built corpus left behind"


@pytest.mark.ray
def test_a_second_build_of_the_same_config_reuses_the_finished_corpus(smoke_corpus, storage_root):
    from alignlab.platform.corpus.corpus import build_corpus

    before = (smoke_corpus / MANIFEST).stat().st_mtime_ns
    assert build_corpus(Preset.named("smoke").corpus, storage_root, progress=False) == smoke_corpus
    assert (smoke_corpus / MANIFEST).stat().st_mtime_ns == before


def _web_cfg(paths) -> CorpusConfig:
    # A dozen distinct words cannot fill even 100 pieces: take what sentencepiece reaches.
    return dataclasses.replace(Preset.named("smoke").corpus, source="web", paths=tuple(str(p) for p in paths),
                               vocab_size=100, tokenizer_sample_docs=50, allow_smaller_vocab=True)


@pytest.mark.ray
def test_a_web_corpus_has_no_link_labels(ray_session, tmp_path):
    from alignlab.platform.corpus.corpus import build_corpus

    f = tmp_path / "web.jsonl"
    rng = np.random.default_rng(0)
    words = "data science model train loss token layer head query snippet acronym concept".split()
    f.write_text("".join(json.dumps({"text": " ".join(rng.choice(words, 80))}) + "\n" for _ in range(40)))
    cdir = build_corpus(_web_cfg([f]), tmp_path / "root", progress=False)
    stats = json.loads((cdir / "stats.json").read_text())
    assert stats["linked_documents"] == 0 and stats["pad_pairs"]["positive"] == 0
    t = pq.read_table(sorted((cdir / "shards" / "train").glob("*.parquet"))[0])
    assert set(t.column("kind").to_pylist()) == {"web"}


def _bad_inputs(tmp_path):
    good = ("<mediawiki xmlns='http://www.mediawiki.org/xml/export-0.10/'><page><title>A</title><ns>0</ns><id>1</id>"
            "<revision><text>Some [[text]] here.</text></revision></page></mediawiki>")
    corrupt = bytearray(bz2.compress(good.encode() * 50))
    for i in range(40, 60):
        corrupt[i] ^= 0xFF
    (tmp_path / "corrupt.xml.bz2").write_bytes(bytes(corrupt))
    (tmp_path / "truncated.xml").write_text(good[:120])
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (tmp_path / "notext.jsonl").write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    (tmp_path / "empty.jsonl").write_text("")
    return {
        "missing": ("web", tmp_path / "nope.jsonl", "nope.jsonl"),
        "corrupt bz2": ("wikidump", tmp_path / "corrupt.xml.bz2", "corrupt.xml.bz2"),
        "truncated xml": ("wikidump", tmp_path / "truncated.xml", "truncated.xml"),
        "non-utf8": ("web", tmp_path / "latin1.txt", "latin1.txt"),
        "jsonl without text": ("web", tmp_path / "notext.jsonl", "notext.jsonl:line 2"),
        "empty corpus": ("web", tmp_path / "empty.jsonl", "empty corpus"),
    }


@pytest.mark.ray
@pytest.mark.parametrize("case", ["missing", "corrupt bz2", "truncated xml", "non-utf8", "jsonl without text",
                                  "empty corpus"])
def test_bad_input_names_the_file_and_cause_and_leaves_no_corpus(ray_session, tmp_path, case):
    from alignlab.platform.corpus.corpus import build_corpus

    source, path, expected = _bad_inputs(tmp_path)[case]
    cfg = dataclasses.replace(_web_cfg([path]), source=source)
    root = tmp_path / "root"
    with pytest.raises(CorpusInputError) as err:
        build_corpus(cfg, root, progress=False)
    assert expected in str(err.value)
    assert not list(root.glob("corpus/*/" + MANIFEST)) and not list(root.glob("corpus/*"))


def test_the_cli_exits_non_zero_with_the_file_named_for_a_missing_path(tmp_path):
    p = subprocess.run([sys.executable, "-m", "alignlab.platform.cli", "corpus", "build", "--source", "web",
                        "--path", str(tmp_path / "missing.jsonl"), "--preset", "smoke", "--storage", str(tmp_path)],
                       capture_output=True, text=True)
    assert p.returncode == 2
    assert "missing.jsonl" in p.stderr and "error" in p.stderr


def test_a_splits_shards_come_in_the_manifests_order_and_an_older_corpus_falls_back_to_its_sorted_folder(tmp_path):
    listed = {"shards": {"train": ["train/b.parquet", "train/a.parquet"], "eval": ["eval/c.parquet"]}}
    assert shard_names(tmp_path, listed, "train") == ["train/b.parquet", "train/a.parquet"]  # not re-sorted
    (tmp_path / "shards" / "train").mkdir(parents=True)
    for name in ("b.parquet", "a.parquet", "notes.txt"):
        (tmp_path / "shards" / "train" / name).write_text("")
    assert shard_names(tmp_path, {}, "train") == ["train/a.parquet", "train/b.parquet"]
