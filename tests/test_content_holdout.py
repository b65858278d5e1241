"""The content holdout (issue #43): whatever a corpus is built from -- a Wikipedia dump, web text, a user's files --
no document holding a task's test or pool text, or defining a task acronym, reaches a shard; the corpus id and
the manifest record the rule and what it removed; a study refuses a corpus without that record.
"""
from __future__ import annotations

import dataclasses

import pyarrow.parquet as pq
import pytest
from test_sources import dump_xml, page, write_dump

from alignlab.platform.corpus.corpus_config import SourceSpec
from alignlab.platform.corpus.corpus_identity import task_heldout_text
from alignlab.platform.presets import Preset
from alignlab.platform.tasks.holdout import HOLDOUT_RULE_VERSION, NGRAM, ContentHoldout, HeldOutText, require_holdout
from alignlab.platform.tasks.task_data import TaskData, build_tasks

SMOKE = Preset.named("smoke").corpus


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    return build_tasks(tmp_path_factory.mktemp("root"), max_docs_per_lang=SMOKE.task_max_docs_per_lang, seed=SMOKE.seed)


def test_a_document_sharing_eight_words_with_a_task_text_is_held_out_whatever_its_case_spacing_and_punctuation():
    rule = ContentHoldout(HeldOutText(("The quick brown fox jumps over the lazy dog near the river.",)))
    assert NGRAM == 8
    assert rule.reason("Yesterday, THE quick-brown   fox jumps over (the) lazy dog!") == "task_text"
    assert rule.reason("a quick brown fox jumps over the cat") is None  # 7 shared words: kept
    assert rule.reason("brown fox jumps over the lazy dog near") == "task_text"  # any 8-word run of it


def test_a_short_task_text_counts_whole_and_one_under_three_words_is_not_matched():
    rule = ContentHoldout(HeldOutText(("a JSON parser", "json", "Fast CSV reader for node")))
    assert rule.reason("This is a json parser, written in C.") == "task_text"
    assert rule.reason("a json stream parser") is None
    assert rule.reason("a fast csv reader for node.js") == "task_text"
    assert rule.reason("json everywhere") is None and rule.num_short_texts == 1


def test_a_document_defining_a_task_acronym_is_held_out_in_any_case_and_spacing():
    rule = ContentHoldout(HeldOutText(definitions=(("WHO", "World Health Organization"),)))
    assert rule.reason("It joined the world health   Organization ( who ) in 1948.") == "definition"
    assert rule.reason("The World Health Organization met in Geneva; the (WHO) too.") is None
    assert rule.reason("The Western Hockey Organization (WHO) is another.") is None


def test_the_rule_digest_counts_content_not_order_or_case():
    a = ContentHoldout(HeldOutText(("One two three four.", "Five six seven"), (("ab", "alpha beta"),)))
    b = ContentHoldout(HeldOutText(("five SIX seven", "one two, three four"), (("AB", "Alpha Beta"),)))
    c = ContentHoldout(HeldOutText(("one two three five", "five six seven"), (("ab", "alpha beta"),)))
    assert a.digest() == b.digest() != c.digest()


def test_the_tasks_hold_out_every_test_and_pool_text_and_every_positive_definition(task_dir):
    data = TaskData.load(task_dir)
    held = task_heldout_text([task_dir])
    texts = set(held.texts)
    assert {e.snippet for e in data.ad} <= texts and {e.snippet for e in data.ad_ood} <= texts
    assert {" ".join(e.tokens) for e in (*data.ct_pool, *data.ct_test)} <= texts
    positives = {(e.acronym, e.long_form) for e in data.ad if e.label == 1}
    assert positives and positives <= set(held.definitions)


def _planted(task_dir):
    data = TaskData.load(task_dir)
    snippet = next(e.snippet for e in data.ad if len(e.snippet.split()) > 12)
    definer = next(e for e in data.ad if e.label == 1 and len(e.long_form.split()) >= 2)
    ct_text = " ".join(next(e for e in data.ct_test if len(e.tokens) >= 10).tokens)
    ood = next(e.snippet for e in data.ad_ood if len(e.snippet.split()) > 12)
    return snippet, definer, ct_text, ood


FILLER = ("The village lies on a river between two hills and has a small market every week. "
          "Farmers bring apples, cheese and bread, and the old mill grinds wheat for the bakers. ")


def _filler(i: int) -> str:
    words = FILLER.split()
    return " ".join(words[i % 7:] + words[:i % 7]) + f" Number {i} of the series."


@pytest.mark.ray
def test_no_task_text_or_acronym_definition_in_a_dump_or_web_folder_reaches_a_shard(ray_session, tmp_path, task_dir):
    from alignlab.platform.corpus.corpus import build_corpus, load_manifest

    root = task_dir.parent.parent  # the fixture's root: the corpus finds the same task folder there
    snippet, definer, ct_text, ood = _planted(task_dir)
    # Each planted document carries a marker word, so a shard row of it would show even where its task text
    # fell on a chunk boundary.
    pages = [page(100, "Quoted", f"Zzquoted writes: {snippet.upper()}, then more."),
             page(101, "Definer", f"Zzdefiner. In 1990 the {definer.long_form.title()} "
                                  f"({definer.acronym.upper()}) was founded.")]
    pages += [page(200 + i, f"Filler {i}", _filler(i)) for i in range(40)]
    dump = write_dump(tmp_path, "enwiki-pages-articles.xml.bz2", dump_xml(pages))
    web = tmp_path / "web"
    web.mkdir()
    blocks = [f"Zzctcopy: {ct_text}", f"Zzoodcopy -- {ood.replace(' ', '  ')}"] + [_filler(i + 50) for i in range(30)]
    (web / "pages.txt").write_text("\n\n".join(blocks) + "\n")
    cfg = dataclasses.replace(SMOKE, sources=(SourceSpec(name="wikidump", paths=(str(dump),), lang="en"),
                                              SourceSpec(name="web", paths=(str(web),), lang="en")),
                              vocab_size=200, tokenizer_sample_docs=100, allow_smaller_vocab=True)
    cdir = build_corpus(cfg, root, progress=False)

    rule = ContentHoldout(task_heldout_text([task_dir]))
    rows = 0
    for f in sorted((cdir / "shards").rglob("*.parquet")):
        t = pq.read_table(f, columns=["a_text", "b_text"]).to_pydict()
        for a in t["a_text"]:
            rows += 1
            assert "zz" not in a.lower(), a
            assert rule.reason(a) is None, a
    assert rows > 0
    rec = load_manifest(cdir)["holdout"]
    assert rec["rule_version"] == HOLDOUT_RULE_VERSION and rec["ngram"] == NGRAM
    assert rec["task_dirs"] == [task_dir.name] and rec["task_data"] == rule.digest()
    removed = {r["source"].split()[0]: r for r in rec["removed_per_source"]}
    assert removed["wikidump"]["task_text"] == 1 and removed["wikidump"]["definition"] == 1
    assert removed["web"]["task_text"] == 2 and removed["web"]["definition"] == 0
    require_holdout(load_manifest(cdir), task_dir.name)  # a study with this task folder takes it
    with pytest.raises(ValueError, match="this study needs tasks-other"):
        require_holdout(load_manifest(cdir), "tasks-other")


def test_a_study_refuses_a_corpus_without_a_holdout_record_with_a_clear_error():
    with pytest.raises(ValueError, match=r"corpus old-1 has no content-holdout record.*Rebuild"):
        require_holdout({"corpus_id": "old-1", "heldout": {"documents": 3}}, "npm-1")
    with pytest.raises(ValueError, match="under holdout rule 0"):
        require_holdout({"corpus_id": "c", "holdout": {"rule_version": 0, "task_dirs": ["npm-1"]}}, "npm-1")


@pytest.mark.ray
def test_a_study_stops_before_pretraining_on_a_corpus_built_before_the_rule(ray_session, tmp_path, monkeypatch):
    import json

    from test_studies import load_script

    import alignlab.platform.corpus.corpus as corpus
    from alignlab.platform.study.run import run_study

    old = tmp_path / "root" / "corpus" / "bundled-old"
    old.mkdir(parents=True)
    # A corpus as the code before the rule wrote it: held-out ids, no content-holdout record.
    (old / "manifest.json").write_text(json.dumps({"corpus_id": "bundled-old", "heldout": {"documents": 14}}))
    monkeypatch.setattr(corpus, "build_corpus", lambda *a, **k: old)  # a storage root that already holds it
    with pytest.raises(ValueError, match="corpus bundled-old has no content-holdout record"):
        run_study(load_script("objective_ablation").build("smoke"), tmp_path / "root", progress=False)
    assert not (tmp_path / "root" / "models").exists()
