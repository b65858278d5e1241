"""The corpus-holdout rule: no corpus, however it is built, holds a document behind the FEL tasks.

A document is behind the tasks when an AD snippet was cut from it, or when it defines one of the AD
positives' acronyms ("long form (ACRO)"): a model pretrained on either has read the answer to a test pair.
The rule holds for the study path, the CLI (`alignlab corpus build`) and `build_corpus` alike, and the
corpus id is one: a CLI-built corpus is the one a study uses.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from alignlab.tasks.ad_data import ADExample, defining_doc_ids
from alignlab.platform.presets import Preset
from alignlab.platform.sources.documents import Document
from alignlab.platform.tasks.task import load_examples


def _ad(acronym: str, long_form: str, label: int = 1) -> ADExample:
    return ADExample(acronym, f"... {long_form} ...", label, "d-src", long_form)


def test_a_document_defines_a_task_acronym_when_the_long_form_is_followed_by_the_parenthesised_acronym():
    examples = [_ad("who", "world health organization"), _ad("nba", "national basketball association"),
                _ad("xyz", "world health organization", label=0)]  # a negative's letters define nothing
    docs = [
        Document(doc_id="defines", text="It joined the World Health Organization (WHO) in 1948."),
        Document(doc_id="defines-lowercase", text="la national basketball association  ( nba ) fue"),
        Document(doc_id="long-form-only", text="The World Health Organization met in Geneva."),
        Document(doc_id="acronym-only", text="The (WHO) met, as did the (NBA)."),
        Document(doc_id="other-long-form", text="The Western Hockey Organisation (WHO) is unrelated."),
        Document(doc_id="negative-only", text="The World Health Organization (XYZ) is a negative's pair."),
        Document(doc_id="the-source", text="d: The National Basketball Association (NBA) is a league."),
    ]
    assert defining_doc_ids(docs, examples) == {"defines", "defines-lowercase", "the-source"}
    assert defining_doc_ids(docs, []) == set()


def _shard_doc_ids(cdir: Path) -> set[str]:
    ids: set[str] = set()
    for f in sorted((cdir / "shards").rglob("*.parquet")):
        ids |= set(pq.read_table(f, columns=["doc_id"]).column("doc_id").to_pylist())
    return ids


@pytest.mark.ray
def test_a_cli_built_corpus_holds_out_every_task_document_and_is_the_corpus_a_study_uses(ray_session, tmp_path, capsys):
    from test_studies import load_script

    from alignlab.platform.cli import main
    from alignlab.platform.corpus.corpus import MANIFEST, build_corpus, load_manifest
    from alignlab.platform.sources.sources import read_bundled
    from alignlab.platform.tasks.task_data import build_tasks

    root = tmp_path / "root"
    # The README's stage-by-stage path, corpus first: the task data does not exist yet.
    assert main(["corpus", "build", "--preset", "smoke", "--storage", str(root)]) == 0
    cdir = Path(capsys.readouterr().out.strip().splitlines()[-1].removeprefix("Corpus: "))
    manifest = load_manifest(cdir)
    (tdir,) = (root / "tasks").iterdir()  # built by the corpus build, under the same root
    ad = load_examples("ad", tdir / "ad.jsonl")
    heldout = {ln for ln in (tdir / "heldout_doc_ids.txt").read_text().splitlines() if ln}

    # The held-out list has every snippet's document and every document that defines a positive's acronym
    # (at smoke, one of those is not a snippet's document).
    task_docs = list(read_bundled(("en", "es", "fr"), max_docs_per_lang=Preset.named("smoke").corpus.task_max_docs_per_lang))
    sources = {ex.doc_id for ex in ad}
    defining = defining_doc_ids(task_docs, ad)
    assert sources and defining - sources
    assert sources | defining <= heldout

    # None of them is in any shard, though some are among the documents the corpus reads.
    in_shards = _shard_doc_ids(cdir)
    corpus_input = {d.doc_id for d in read_bundled(("en",), max_docs_per_lang=Preset.named("smoke").corpus.max_docs_per_lang)}
    assert in_shards and in_shards <= corpus_input
    assert corpus_input & sources, "the smoke corpus's documents include snippet sources: the check is not vacuous"
    assert not in_shards & (sources | defining)
    assert manifest["heldout"]["documents"] == len(heldout) and manifest["heldout"]["task_dir"] == tdir.name
    assert (cdir / "heldout_doc_ids.txt").read_text().splitlines() == sorted(heldout)
    stats = json.loads((cdir / "stats.json").read_text())
    assert stats["held_out_documents"] == len(corpus_input & heldout)

    # The study path (run_study: its task data, then the corpus with that task folder's list) finds this
    # very corpus: same id, nothing rebuilt.
    study = load_script("objective_ablation").build("smoke")
    stdir = build_tasks(root, langs=study.task_langs, max_docs_per_lang=study.task_max_docs_per_lang,
                        seed=study.corpus.seed, **dict(study.task_options))
    assert stdir == tdir
    before = (cdir / MANIFEST).stat().st_mtime_ns
    study_cdir = build_corpus(dataclasses.replace(study.corpus, holdout_ids_file=str(stdir / "heldout_doc_ids.txt")),
                              root, progress=False)
    assert study_cdir == cdir and (cdir / MANIFEST).stat().st_mtime_ns == before

    # The Python API holds out by the same rule: documents given to build_corpus that define a task acronym
    # (a defining document that is no snippet's source included) never reach a shard.
    given = [d for d in task_docs if d.doc_id in defining] + [d for d in task_docs if d.lang == "en"][:150]
    cfg = dataclasses.replace(Preset.named("smoke").corpus, docs_per_shard=1000)
    custom = build_corpus(cfg, root, docs=given, progress=False)
    assert _shard_doc_ids(custom) and not _shard_doc_ids(custom) & (sources | defining)


def test_every_study_holds_out_the_task_data_it_finetunes_on():
    """A study's corpus holds out its own task folder's documents and the rule's; the two are one folder
    (so its corpus is the CLI's), which needs the study's task parameters to be its corpus's."""
    import inspect

    from test_studies import SCRIPTS, load_script

    from alignlab.platform.tasks.task import registered_tasks
    from alignlab.platform.tasks.task_data import build_tasks

    defaults = {k: p.default for k, p in inspect.signature(build_tasks).parameters.items()}
    defaults.update({k: v for t in registered_tasks() for k, v in t.build_options.items()})  # the tasks' own options
    assert len(SCRIPTS) >= 6
    for name in SCRIPTS:
        for preset in ("smoke", "mini", "paper"):
            s = load_script(name).build(preset)
            assert s.corpus.hold_out_tasks, s.name
            if s.corpus.source == "synthetic" and not s.corpus.sources:
                # The alignment control's corpus is generated text that no task document is drawn from (its task
                # snippets come from another namespace of the generator): there is no CLI corpus to be.
                continue
            assert (tuple(s.task_langs), s.task_max_docs_per_lang, s.task_options) == \
                (tuple(defaults["langs"]), s.corpus.task_max_docs_per_lang, ()), s.name
