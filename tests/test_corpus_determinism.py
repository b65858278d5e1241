"""The corpus build is a pure function of its config: two builds of one config write the same corpus.

Content addressing (docs/guarantees.md) relies on it: a corpus id names a config and its
input, so every build under that id must hold the same tokenizer, token counts and shard rows in the
same order, or models pretrained "on the same corpus" would differ by where it happened to be built.

Why this holds: documents are staged by the driver into parts of `docs_per_shard` documents; each part
is labelled by one Ray Data task into one shard file named after the part, with PAD's generator
seeded by each batch's first document; the manifest lists the shards in order and pretraining reads
exactly that list. (An earlier pipeline that let Ray Data's `write_parquet` cut the files wrote whole
batches in a different order from build to build, even with `preserve_order` on.)

Compared between two builds into two storage roots: `tokenizer.model`, `token_counts.npy` and every
shard file byte for byte, the shards' rows in order, and `stats.json`, `config.json` and
`manifest.json` apart from the timings.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from alignlab.platform.presets import Preset

# 300 English documents in parts of 100: several train shards and an eval shard.
CONFIG = dataclasses.replace(Preset.named("smoke").corpus, max_docs_per_lang=300)
TIMING_KEYS = {"wall_time_s", "phase_seconds"}


def _without_timings(stats: dict) -> dict:
    return {k: v for k, v in stats.items() if k not in TIMING_KEYS}


def _shards(cdir: Path, split: str) -> list[Path]:
    manifest = json.loads((cdir / "manifest.json").read_text())
    return [cdir / "shards" / name for name in manifest["shards"][split]]


def _rows(cdir: Path, split: str) -> pa.Table:
    return pa.concat_tables([pq.read_table(f) for f in _shards(cdir, split)]).combine_chunks()


def assert_identical_corpora(a: Path, b: Path) -> None:
    """Everything a build writes is the same in `a` and `b`, the timings in the stats excepted."""
    assert a.name == b.name, "the same config must give the same corpus id"
    assert (a / "tokenizer.model").read_bytes() == (b / "tokenizer.model").read_bytes(), "tokenizer.model differs"
    counts_a, counts_b = np.load(a / "token_counts.npy"), np.load(b / "token_counts.npy")
    assert counts_a.dtype == counts_b.dtype and np.array_equal(counts_a, counts_b), "token_counts.npy differs"
    for split in ("train", "eval"):
        assert [f.name for f in _shards(a, split)] == [f.name for f in _shards(b, split)]
        rows_a, rows_b = _rows(a, split), _rows(b, split)
        if not rows_a.equals(rows_b):
            la, lb = rows_a.to_pylist(), rows_b.to_pylist()
            j = next((j for j, (ra, rb) in enumerate(zip(la, lb)) if ra != rb), min(len(la), len(lb)))
            raise AssertionError(f"{split}: the rows differ from row {j} on ({len(la)} vs {len(lb)} rows)")
        for fa, fb in zip(_shards(a, split), _shards(b, split)):
            assert fa.read_bytes() == fb.read_bytes(), f"{fa.name} differs byte for byte"
    stats_a = json.loads((a / "stats.json").read_text())
    stats_b = json.loads((b / "stats.json").read_text())
    assert TIMING_KEYS <= stats_a.keys(), "stats.json no longer reports the build's timings"
    assert _without_timings(stats_a) == _without_timings(stats_b)
    assert (a / "config.json").read_text() == (b / "config.json").read_text()
    man_a = json.loads((a / "manifest.json").read_text())
    man_b = json.loads((b / "manifest.json").read_text())
    man_a["stats"], man_b["stats"] = _without_timings(man_a["stats"]), _without_timings(man_b["stats"])
    assert man_a == man_b

    def files(c: Path) -> set[str]:
        return {str(p.relative_to(c)) for p in c.rglob("*") if p.is_file()}

    assert files(a) == files(b)


@pytest.mark.ray
def test_two_builds_of_the_same_config_write_identical_shards_tokenizer_and_counts(smoke_corpus, tmp_path):
    from alignlab.platform.corpus.corpus import build_corpus

    # The first build is the session's smoke corpus (conftest.py), its parts labelled by one actor; the second, at a
    # root of its own, labels them with two.
    assert CONFIG == Preset.named("smoke").corpus
    a = smoke_corpus
    b = build_corpus(CONFIG, tmp_path / "root-b", progress=False, num_workers=2)
    assert a != b, "the second build must not be a cache hit"

    # The config exercises what could make a build nondeterministic (several parts labelled by two actors in
    # the second build), or the comparison proves little.
    stats = json.loads((a / "stats.json").read_text())
    assert len(_shards(a, "train")) >= 2 and len(_shards(a, "eval")) >= 1
    assert stats["pad_pairs"]["positive"] > 0 and stats["pad_pairs"]["negative"] > 0
    assert_identical_corpora(a, b)
