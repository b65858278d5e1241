"""The `software` corpus source: PyPI package summaries shipped with alignlab, the software-domain part of the
mini corpus (platform/sources/corpus_data/README.md). They must never hold a FEL test text, and a corpus built with them
must train MLM and NSP on them without link labels."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from alignlab.platform.corpus.corpus_config import CorpusConfig, SourceSpec
from alignlab.platform.corpus.corpus_identity import corpus_id, source_fingerprint
from alignlab.platform.presets import Preset
from alignlab.platform.sources.documents import CorpusInputError
from alignlab.platform.sources.sources import iter_documents
from alignlab.platform.sources.text_files import SOFTWARE_FILE, read_software

NPM = Path(__file__).resolve().parents[1] / "tasks" / "task_data" / "npm"
STOP = frozenset("""a an the for to of with and in on from by your you that this is are it as or into using based
at be can all any its via""".split())


def _near_duplicate_key(text: str) -> tuple[str, ...]:
    return tuple(sorted(set(re.findall(r"[a-z0-9]+", text.lower())) - STOP))


def test_the_software_source_reads_the_shipped_summaries_as_english_documents_without_links():
    docs = list(read_software())
    assert len(docs) == 40_000
    assert len({d.doc_id for d in docs}) == len(docs) and all(d.doc_id.startswith("software:") for d in docs)
    assert {d.lang for d in docs} == {"en"} and {d.kind for d in docs} == {"web"}
    assert not any(d.links for d in docs) and all(len(d.text.split()) >= 4 for d in docs)
    assert [d.doc_id for d in iter_documents("software", max_docs_per_lang=5)] == [d.doc_id for d in docs[:5]]


def test_no_shipped_software_summary_is_a_near_duplicate_of_a_fel_test_text():
    # The FEL test sets (npm CT texts, out-of-domain AD snippets) must stay out of every pretraining corpus.
    texts = (NPM / "ct_texts.txt").read_text(encoding="utf-8").splitlines()
    texts += [json.loads(ln)["snippet"] for ln in (NPM / "ad_ood.jsonl").read_text(encoding="utf-8").splitlines()
              if ln.strip()]
    assert len(texts) > 1000
    banned = {_near_duplicate_key(t) for t in texts if t.strip()}
    clashes = [d.text for d in read_software() if _near_duplicate_key(d.text) in banned]
    assert clashes == []


def test_a_malformed_software_line_is_refused_naming_the_file_and_line(tmp_path):
    f = tmp_path / "summaries.txt"
    f.write_text("good-pkg\tA library for parsing things well\nno tab on this line\n", encoding="utf-8")
    docs = read_software(path=f)
    assert next(docs).doc_id == "software:good-pkg"
    with pytest.raises(CorpusInputError, match=r"summaries\.txt.*line 2.*package name<TAB>summary"):
        next(docs)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"name": "software", "paths": ("x.txt",)}, r"SourceSpec\.paths: the software source reads no files"),
    ({"name": "software", "lang": "fr"}, r"SourceSpec\.lang: software documents carry their own language"),
])
def test_the_software_source_takes_no_files_and_no_language(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SourceSpec(**kwargs)
    with pytest.raises(ValueError, match="given twice"):
        CorpusConfig(sources=(SourceSpec(name="software"), SourceSpec(name="software")))


def test_the_mini_corpus_is_wikipedia_plus_software_and_is_named_by_the_files_content():
    mini = Preset.named("mini").corpus
    assert [s.name for s in mini.source_specs] == ["bundled", "software"] and mini.source == "bundled+software"
    digest = hashlib.sha256(SOFTWARE_FILE.read_bytes()).hexdigest()
    assert source_fingerprint(mini)["sources"][1] == {"software_summaries": digest}
    assert corpus_id(mini, []).startswith("bundled+software-")
    wiki_only = dataclasses.replace(mini, sources=(SourceSpec(name="bundled"),))
    assert corpus_id(wiki_only, []) != corpus_id(mini, [])


@pytest.mark.ray
def test_a_corpus_with_the_software_source_trains_mlm_on_it_without_link_labels(ray_session, tmp_path):
    from alignlab.platform.corpus.corpus import build_corpus

    cfg = dataclasses.replace(Preset.named("smoke").corpus, sources=(SourceSpec(name="bundled"), SourceSpec(name="software")),
                              max_docs_per_lang=300, hold_out_tasks=False)
    cdir = build_corpus(cfg, tmp_path, progress=False)
    stats = json.loads((cdir / "stats.json").read_text())
    assert [(s["source"], s["documents"]) for s in stats["documents_per_source"]] == [("bundled", 300), ("software", 300)]
    rows = [r for f in sorted((cdir / "shards" / "train").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    software = [r for r in rows if r["doc_id"].startswith("software:")]
    assert software and all(r["kind"] == "web" for r in software)
    # No links: no WHP tags and no PAD pair; the collator gives such rows MLM and NSP examples only.
    assert all(r["whp_a"] is None and r["pad_label"] == -1 for r in software)
    assert any(r["whp_a"] is not None for r in rows if r["doc_id"].startswith("bundled:"))
