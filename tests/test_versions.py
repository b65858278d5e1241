"""Ids that change when the code does (issue #43): golden fingerprints of a smoke corpus's labelled rows and of a
smoke model's trained weights, each tied to the code version in the ids (corpus_identity.CORPUS_CODE_VERSION,
models.PRETRAIN_CODE_VERSION). A change that alters either without bumping its version fails here, so a storage
root never serves an old artifact under a new code's id.

The rows each rank trains on, step by step, through the Ray Data path (the shards read by Ray Data, split among
the ranks, shuffled locally, cut into batches and length buckets): an oracle independent of the resume tests, which
compare a run with another run of the same code. Pinned for the smoke preset's model (one worker), its two-worker
form (tests/test_data_parallel.py, per rank) and the first steps of the mini preset's pretraining on the smoke
corpus; tied to PRETRAIN_CODE_VERSION (data split and order) and to the corpus's versions (the rows themselves).

Regenerate after a deliberate change (and a bump):  ALIGNLAB_UPDATE_GOLDEN=1 python -m pytest tests/test_versions.py
tests/test_data_parallel.py

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
REGENERATE = "ALIGNLAB_UPDATE_GOLDEN=1 python -m pytest tests/test_versions.py tests/test_data_parallel.py"


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
    # The other versions an entry depends on (the batches: the corpus's, whose rows they are).
    if moved := [f"{k} is {now[k]}, not {gold.get(k)}" for k in now if k.endswith(" version") and gold.get(k) != now[k]]:
        pytest.fail(f"{key}: {', '.join(moved)} as when {GOLDEN.name} was generated: regenerate the golden values "
                    f"with `{REGENERATE}` and commit tests/{GOLDEN.name}")
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


# ---------------------------------------------------------------- the Ray Data path: the rows each rank trains on


def batch_digests(probe: Path, ranks: int) -> dict:
    """The golden entry of a run probed by `fault_hooks.Probe` at every step: per rank, how many steps it trained
    and a sha256 of the rows (document#chunk) of each step's batch, in step order; with the versions it depends
    on. The task data is one of them: its documents are held out of the corpus, so a task builder that picks other
    documents moves the corpus's rows (its "version" names the builders' versions and AD's size)."""
    from fault_hooks import probed_steps

    from alignlab.tasks.ad_data import AD_BUILDER_VERSION, AD_TARGET_SNIPPETS
    from alignlab.platform.corpus.corpus_identity import CORPUS_CODE_VERSION
    from alignlab.platform.pretrain.models import PRETRAIN_CODE_VERSION
    from alignlab.platform.tasks.holdout import HOLDOUT_RULE_VERSION
    from alignlab.platform.tasks.task_data import TASK_BUILDER_VERSION

    out = {}
    for rank in range(ranks):
        steps = [(r["step"], r["rows"]) for r in probed_steps(probe, rank)]
        assert steps and [s for s, _ in steps] == list(range(1, len(steps) + 1)), \
            f"rank {rank} was not probed once at every step: {[s for s, _ in steps]}"
        out[f"rank {rank}"] = {"steps": len(steps),
                               "sha256": hashlib.sha256(json.dumps(steps).encode()).hexdigest()}
    return {"version": PRETRAIN_CODE_VERSION, "corpus version": CORPUS_CODE_VERSION,
            "holdout version": HOLDOUT_RULE_VERSION,
            "task data version": f"tasks {TASK_BUILDER_VERSION}, AD {AD_BUILDER_VERSION} of {AD_TARGET_SNIPPETS} snippets",
            "ranks": out}


def check_batches(key: str, probe: Path, ranks: int) -> None:
    """Compare the rows each rank of a probed run trained on with the golden entry `key` (what to do when they
    differ: `_check`)."""
    _check(key, batch_digests(probe, ranks), "PRETRAIN_CODE_VERSION", "platform/pretrain/models.py",
           lambda g, n: g == n)


@pytest.mark.ray
def test_the_rows_the_smoke_model_trains_on_at_each_step_change_only_with_the_code_versions(smoke_model,
                                                                                          smoke_model_probe):
    """The session's smoke model (the smoke preset's pretraining under Ray Train, one worker) was probed at every
    step. The two-worker form, per rank: tests/test_data_parallel.py."""
    check_batches("batches smoke", smoke_model_probe, ranks=1)


@pytest.mark.ray
def test_the_rows_the_mini_preset_trains_on_in_its_first_steps_change_only_with_the_code_versions(smoke_corpus,
                                                                                                 tmp_path):
    """The mini preset's pretraining config (its batch, sequence-length phases, layout and bucketing) for its first
    6 steps, on the smoke corpus (the mini corpus takes minutes to build). `max_steps` is cut to 6, which also
    places the short-sequence phase in the first 3 steps; the model is the mini preset's own."""
    from fault_hooks import Probe, registered

    from alignlab.platform.pretrain.driver import pretrain

    cfg = dataclasses.replace(Preset.named("mini").pretrain, max_steps=6, checkpoint_every=6, log_every=1,
                              eval_batches=1, precision="fp32")
    probe = tmp_path / "probe"
    probe.mkdir()
    pretrain(smoke_corpus, cfg, tmp_path / "root", after_step=registered(Probe(str(probe))))
    check_batches("batches mini (first 6 steps)", probe, ranks=1)
