"""Ids that change when the code does (issue #43): golden fingerprints of a smoke corpus's labelled rows and of a
smoke model's trained weights, each tied to the code version in the ids (corpus_identity.CORPUS_CODE_VERSION,
models.PRETRAIN_CODE_VERSION). A change that alters either without bumping its version fails here, so a storage
root never serves an old artifact under a new code's id.

Regenerate after a deliberate change (and a bump):  ALIGNLAB_UPDATE_GOLDEN=1 python -m pytest tests/test_versions.py

Stable across machines: one torch thread and fp32 (no bf16, whatever the CPU), and the weights compared to a
relative 1e-4 per tensor (summation order differs across CPUs' SIMD kernels in the last digits; a change of
code moves them far more). The shard rows are token ids, labels and text: compared exactly, by content (not
parquet bytes, whose metadata names the writer's version).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from alignlab.platform.presets import Preset

GOLDEN = Path(__file__).with_name("golden_versions.json")
UPDATE = os.environ.get("ALIGNLAB_UPDATE_GOLDEN") == "1"
REGENERATE = "ALIGNLAB_UPDATE_GOLDEN=1 python -m pytest tests/test_versions.py"


def _golden() -> dict:
    return json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}


def _save(key: str, value: dict) -> None:
    g = _golden()
    g[key] = value
    GOLDEN.write_text(json.dumps(g, indent=1, sort_keys=True) + "\n")


def _check(key: str, now: dict, constant: str, where: str, same) -> None:
    """Compare `now` (with its "version") to the golden entry; say exactly what to do when they differ."""
    if UPDATE:
        _save(key, now)
        return
    gold = _golden().get(key)
    assert gold is not None, f"{GOLDEN.name} has no {key!r}: generate it with `{REGENERATE}`"
    if gold["version"] != now["version"]:
        pytest.fail(f"{constant} is {now['version']} but {GOLDEN.name} was generated at {gold['version']}: "
                    f"regenerate the golden values with `{REGENERATE}` and commit tests/{GOLDEN.name}")
    if not same(gold, now):
        pytest.fail(f"the {key} changed but {constant} ({where}) is still {now['version']}: a cached artifact "
                    f"of the old code would be served under the same id. If the change is meant, bump {constant} "
                    f"to {now['version'] + 1}, then regenerate the golden values with `{REGENERATE}` and commit "
                    f"{GOLDEN.name}; if it is not, the change altered what gets {'labelled' if 'corpus' in key else 'trained'}.")


# ---------------------------------------------------------------- the corpus: staging, tokenizer, labels


def _smoke_corpus_rows(tmp: Path) -> list[dict]:
    """The labelled rows of a small bundled corpus, made by the corpus stage's own code without Ray: staging
    (`stage_documents`), the objectives' fit, the tokenizer, and `ChunkLabeler` called as Ray Data calls it."""
    from alignlab.platform.corpus.corpus import ChunkLabeler
    from alignlab.platform.corpus.corpus_sources import stage_documents
    from alignlab.platform.encoder.registry import corpus_labellers
    from alignlab.platform.encoder.tokenizer import train_tokenizer
    from alignlab.platform.sources.sources import read_bundled

    cfg = dataclasses.replace(Preset.named("smoke").corpus, max_docs_per_lang=60, vocab_size=400, docs_per_shard=40,
                              allow_smaller_vocab=True)
    root = tmp / "root"
    docs = ((0, d) for d in read_bundled(cfg.langs, max_docs_per_lang=cfg.max_docs_per_lang))
    staged = stage_documents(docs, root / "docs", cfg, set(), progress=False)
    labellers = corpus_labellers()
    for lab in labellers:
        lab.fit(staged["fit_sample"])
    train_tokenizer(staged["sample"], root / "tokenizer.model", vocab_size=cfg.vocab_size, seed=cfg.seed,
                    lowercase=cfg.lowercase)
    labeler = ChunkLabeler("tokenizer.model", cfg.chunk_len, labellers, cfg.seed, storage=str(root))
    parts = sorted(str(p.relative_to(root)) for p in (root / "docs").rglob("part-*.parquet"))
    labeler({"src": parts, "dst": [p.replace("docs/", "shards/") for p in parts]})
    return [r for p in parts for r in pq.read_table(root / p.replace("docs/", "shards/")).to_pylist()]


def test_labelled_shards_change_only_with_the_corpus_code_version(tmp_path):
    from alignlab.platform.corpus.corpus_identity import CORPUS_CODE_VERSION

    rows = _smoke_corpus_rows(tmp_path)
    assert len(rows) > 50
    digest = hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()
    _check("corpus rows", {"version": CORPUS_CODE_VERSION, "rows": len(rows), "sha256": digest},
           "CORPUS_CODE_VERSION", "platform/corpus/corpus_identity.py", lambda g, n: g == n)


# ---------------------------------------------------------------- pretraining: model, objectives, collation, optimizer


WEIGHT_RTOL = 1e-4


def _fingerprint(model: torch.nn.Module) -> dict[str, list[float]]:
    """Per tensor: its sum, the sum of its absolute values and its first element (float64)."""
    out = {}
    for name, t in sorted(model.state_dict().items()):
        if t.is_floating_point():
            x = t.detach().double().flatten()
            out[name] = [float(x.sum()), float(x.abs().sum()), float(x[0])]
    return out


def _close(gold: dict, now: dict) -> bool:
    if gold.keys() != now.keys() or gold["weights"].keys() != now["weights"].keys():
        return False
    for name, (s, a, first) in gold["weights"].items():
        s2, a2, f2 = now["weights"][name]
        tol = WEIGHT_RTOL * max(a, 1e-3)  # relative to the tensor's size; a sum can be near zero
        if abs(s - s2) > tol or abs(a - a2) > tol or abs(first - f2) > WEIGHT_RTOL * max(abs(first), 1e-2):
            return False
    return True


def test_trained_weights_change_only_with_the_pretraining_code_version(tmp_path):
    from tiny_model import batches, tiny_tokenizer

    from alignlab.platform.pretrain.models import PRETRAIN_CODE_VERSION
    from alignlab.platform.pretrain.pretrain import Pretrainer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tok = tiny_tokenizer(tmp_path / "tok")
        cfg = dataclasses.replace(Preset.named("smoke").pretrain, precision="fp32", max_steps=4)
        tr = Pretrainer(cfg, tok)
        for step, b in enumerate(batches(tok)):
            tr.train_step(tr.collate(b, step=step))
        weights = _fingerprint(tr.model)
    finally:
        torch.set_num_threads(threads)
    assert weights and all(np.isfinite(v).all() for v in weights.values())
    _check("model weights", {"version": PRETRAIN_CODE_VERSION, "weights": weights},
           "PRETRAIN_CODE_VERSION", "platform/pretrain/models.py", _close)
