"""The domain-adaptive final phase (`PretrainConfig.domain_sources`, `domain_fraction`): the last fraction of the
steps trains on the rows of the named corpus sources only, the steps before it on the other sources; the loop
resumes exactly inside either phase, and a corpus without the sources is refused before training."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from fault_hooks import Probe, registered

from alignlab.platform.corpus.corpus_config import SourceSpec
from alignlab.platform.encoder.tokenizer import Tokenizer
from alignlab.platform.presets import Preset
from alignlab.platform.pretrain.loop import train_loop
from alignlab.platform.pretrain.pretrain import Pretrainer

SMOKE = dataclasses.replace(Preset.named("smoke").pretrain, objectives="mlm,nsp,whp,pad", log_every=1)
# Rows in stream order (no length bucketing), so that which rows each step trains on can be read off the stream.
PHASED = dataclasses.replace(SMOKE, max_steps=8, domain_sources=("software",), domain_fraction=0.25, bucket_batches=1)


@pytest.fixture(scope="module")
def two_source_corpus(ray_session, tmp_path_factory):
    """A smoke corpus of Wikipedia summaries and software summaries."""
    from alignlab.platform.corpus.corpus import build_corpus

    cfg = dataclasses.replace(Preset.named("smoke").corpus, sources=(SourceSpec(name="bundled"), SourceSpec(name="software")),
                              max_docs_per_lang=300, hold_out_tasks=False)
    return build_corpus(cfg, tmp_path_factory.mktemp("two-sources"), progress=False)


def _batches(cdir, source: str, keep: bool, batch_size: int) -> list[dict]:
    rows = [r for f in sorted((cdir / "shards" / "train").glob("*.parquet")) for r in pq.read_table(f).to_pylist()
            if r["doc_id"].startswith(f"{source}:") == keep]
    cols = {k: np.asarray([r[k] for r in rows], dtype=object) for k in rows[0]}
    return [{k: v[i * batch_size:(i + 1) * batch_size] for k, v in cols.items()} for i in range(len(rows) // batch_size)]


def test_a_domain_phase_takes_known_sources_with_a_fraction_that_leaves_steps_to_both_phases():
    assert PHASED.domain_start_step == 6 and SMOKE.domain_start_step == SMOKE.max_steps
    with pytest.raises(ValueError, match="distinct source names"):
        dataclasses.replace(PHASED, domain_sources=("pypi",))
    with pytest.raises(ValueError, match="go together"):
        dataclasses.replace(PHASED, domain_fraction=0.0)
    with pytest.raises(ValueError, match="go together"):
        dataclasses.replace(SMOKE, domain_fraction=0.5)
    with pytest.raises(ValueError, match="leaves no step"):
        dataclasses.replace(PHASED, domain_fraction=0.01)


def test_the_domain_phase_is_part_of_the_model_id_and_off_keeps_the_ids_from_before_it_existed():
    from alignlab.platform.config import config_hash, pretrain_from_dict, to_dict
    from alignlab.platform.pretrain.models import ADDED_MODEL_FIELDS, PRETRAIN_CODE_VERSION, RUNTIME_FIELDS, model_id
    from alignlab.platform.pretrain.pretrain import with_resolved_precision

    assert model_id("c", PHASED) != model_id("c", dataclasses.replace(PHASED, domain_fraction=0.5))
    assert model_id("c", PHASED) != model_id("c", dataclasses.replace(PHASED, domain_sources=("web",)))
    assert pretrain_from_dict(to_dict(PHASED)) == PHASED
    # Off, the id is the hash of a config dict without the domain fields: the id every model had before them.
    off = dataclasses.replace(PHASED, domain_sources=(), domain_fraction=0.0)
    before = {k: v for k, v in to_dict(with_resolved_precision(off)).items()
              if k not in (*RUNTIME_FIELDS, "domain_sources", "domain_fraction", "curriculum_fraction")}
    before["model"] = {k: v for k, v in before["model"].items() if ADDED_MODEL_FIELDS.get(k, v) != v or k not in ADDED_MODEL_FIELDS}
    code = {"code": PRETRAIN_CODE_VERSION}
    assert model_id("c", off) == f"{off.model.label}-mlm+nsp+whp+pad-{config_hash('c', before, code)}"


def test_a_presets_domain_phase_is_turned_off_on_a_corpus_without_its_sources(capsys):
    from alignlab.platform.corpus.corpus_flags import fit_domain_phase

    assert fit_domain_phase(PHASED, ["bundled", "software"]) is PHASED
    assert fit_domain_phase(SMOKE, ["bundled"]) is SMOKE
    for sources in (["bundled"], ["software"]):  # no software rows; no rows for the steps before the phase
        off = fit_domain_phase(PHASED, sources)
        assert (off.domain_sources, off.domain_fraction) == ((), 0.0)
        assert "final pretraining phase on software is off" in capsys.readouterr().out


def _run(trainer, general, domain, upto, seen=None):
    trainer.cfg = dataclasses.replace(PHASED, max_steps=8)
    stop = {"at": upto}

    def report(metrics, ckpt):
        if seen is not None:
            seen[metrics["step"]] = (metrics["phase"], list(trainer.last_row_ids))
        if metrics["step"] >= stop["at"]:
            raise _Stop

    try:
        train_loop(trainer, lambda epoch: iter(general), report=report, log_every=1,
                   domain_batches=lambda epoch: iter(domain))
    except _Stop:
        pass


class _Stop(Exception):
    pass


@pytest.mark.ray
def test_the_last_steps_train_on_the_domain_rows_only_and_a_resume_inside_the_domain_phase_is_exact(
        two_source_corpus, tmp_path):
    tok = Tokenizer(two_source_corpus / "tokenizer.model")
    general = _batches(two_source_corpus, "software", False, PHASED.batch_size)[:3]  # 3 batches: the phase wraps
    domain = _batches(two_source_corpus, "software", True, PHASED.batch_size)[:1]  # 1 batch: a pass per step
    seen: dict = {}
    straight = Pretrainer(PHASED, tok)
    _run(straight, general, domain, 8, seen)
    assert [seen[s][0] for s in range(1, 9)] == [0] * 6 + [1] * 2
    assert all(not r.startswith("software:") for s in range(1, 7) for r in seen[s][1])
    assert all(r.startswith("software:") for s in (7, 8) for r in seen[s][1])
    # The general phase wrapped around its 3 batches (a new pass), and the domain phase started at its own pass 0.
    assert seen[4][1] == seen[1][1] and seen[7][1] == seen[8][1] == [f"{d}#{c}" for d, c in
                                                                     zip(domain[0]["doc_id"], domain[0]["chunk_index"])]
    assert straight.state.phase == 1
    with pytest.raises(ValueError, match="needs domain_batches"):
        train_loop(Pretrainer(PHASED, tok), lambda epoch: iter(general), report=lambda m, c: None)

    first = Pretrainer(PHASED, tok)
    _run(first, general, domain, 7)  # stops inside the domain phase
    torch.save(first.state_dict(), tmp_path / "state.pt")
    resumed = Pretrainer(PHASED, tok)
    resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=False))
    assert (resumed.state.step, resumed.state.phase, resumed.state.epoch, resumed.state.batches_in_epoch) == (7, 1, 0, 1)
    _run(resumed, general, domain, 8)
    for (k, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), f"{k} differs after a resume inside the domain phase"


@pytest.mark.ray
def test_pretraining_under_ray_ends_on_the_domain_sources_rows(two_source_corpus, tmp_path):
    from alignlab.platform.pretrain.driver import pretrain

    out = tmp_path / "probe"
    out.mkdir()
    cfg = dataclasses.replace(PHASED, checkpoint_every=4)
    mdir = pretrain(two_source_corpus, cfg, tmp_path, after_step=registered(Probe(str(out))))
    steps = [json.loads(line) for line in (out / "rank0.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, 9))
    sources = [{r.split(":")[0] for r in s["rows"]} for s in steps]
    assert all(src == {"bundled"} for src in sources[:6]) and all(src == {"software"} for src in sources[6:])
    assert json.loads((mdir / "config.json").read_text())["pretrain"]["domain_sources"] == ["software"]


@pytest.mark.ray
def test_a_domain_phase_on_a_corpus_without_its_source_is_refused_naming_the_corpus(smoke_corpus, tmp_path):
    from alignlab.platform.corpus.corpus import load_manifest
    from alignlab.platform.pretrain.driver import pretrain

    cid = load_manifest(smoke_corpus)["corpus_id"]
    with pytest.raises(ValueError, match=rf"names software, which corpus {cid} has no documents of \(it has bundled\)"):
        pretrain(smoke_corpus, PHASED, tmp_path)
    with pytest.raises(ValueError, match="are all of corpus .*'s sources"):
        pretrain(smoke_corpus, dataclasses.replace(PHASED, domain_sources=("bundled",)), tmp_path)
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())
