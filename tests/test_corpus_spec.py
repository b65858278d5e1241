"""One corpus from several sources (issue #18): the spec, its flags, its id, its options, and what it tells a run.

A Wikipedia dump plus web text in one corpus, a vocabulary trained on the web text alone, a cap on the
non-English share, the vocabulary size actually reached, and a warning when a pretraining run would go over
its corpus too many times.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from test_sources import dump_xml, page, write_dump

from alignlab.platform.config import to_dict
from alignlab.platform.corpus.corpus import MANIFEST, corpus_epochs, load_manifest, warn_if_corpus_repeats
from alignlab.platform.corpus.corpus_config import CorpusConfig, SourceSpec, corpus_from_dict
from alignlab.platform.corpus.corpus_flags import add_corpus_arguments, corpus_from_args
from alignlab.platform.corpus.corpus_identity import corpus_id
from alignlab.platform.corpus.corpus_sources import cap_non_english, doc_hash, stage_documents
from alignlab.platform.encoder.tokenizer import Tokenizer, check_vocab_size, train_tokenizer
from alignlab.platform.presets import Preset
from alignlab.platform.runtime.errors import Parser
from alignlab.platform.sources.documents import CorpusInputError, Document

HELD_OUT = ["bundled:en:Alan Turing", "bundled:fr:Paris"]
WIKI_ONLY_WORD = "zanzibar"
WEB_WORDS = "data science model train loss token layer head query snippet acronym concept".split()


# ---------------------------------------------------------------- identity


def test_the_preset_corpora_have_pinned_ids_that_carry_the_code_and_holdout_versions(monkeypatch):
    # Pinned so that an id never moves by accident; they moved on purpose when the corpus code version and the
    # content holdout's rule and task data entered the id (issue #43: older ids named shards of older code).
    import alignlab.platform.corpus.corpus_identity as ci

    smoke, mini = Preset.named("smoke").corpus, Preset.named("mini").corpus
    ordered = dataclasses.replace(smoke, shuffle_documents=False)
    assert corpus_id(ordered, []) == "bundled-e7fb4276b994"
    assert corpus_id(ordered, HELD_OUT) == "bundled-b35e3d04e654"
    assert corpus_id(ordered, [], custom=True) == "custom-6182ae38b365"
    wiki_mini = dataclasses.replace(mini, sources=(SourceSpec(name="bundled"),), shuffle_documents=False)
    assert corpus_id(wiki_mini, []) == "bundled-210d03b35c58"
    assert corpus_id(wiki_mini, HELD_OUT) == "bundled-fec76f3a0f67"
    assert corpus_id(smoke, HELD_OUT) == "bundled-ca6e9a9a68d1"
    assert corpus_id(mini, HELD_OUT) == "bundled+software-a0fd266b9f5d"
    # Accepting a smaller vocabulary changes whether a corpus is taken, not what it is.
    assert corpus_id(dataclasses.replace(smoke, allow_smaller_vocab=True), HELD_OUT) == "bundled-ca6e9a9a68d1"
    # A new labelling code version is a new corpus.
    monkeypatch.setattr(ci, "CORPUS_CODE_VERSION", ci.CORPUS_CODE_VERSION + 1)
    assert corpus_id(smoke, HELD_OUT) != "bundled-ca6e9a9a68d1"


def test_one_source_written_as_a_spec_is_the_same_corpus_as_source_and_paths(tmp_path):
    (tmp_path / "a.txt").write_text("some web text\n")
    plain = CorpusConfig(source="web", paths=(str(tmp_path / "a.txt"),))
    spec = CorpusConfig(sources=(SourceSpec(name="web", paths=(str(tmp_path / "a.txt"),)),), tokenizer_sources=("web",))
    assert spec == plain and spec.sources == () and spec.tokenizer_sources == ()
    assert corpus_id(spec, []) == corpus_id(plain, [])


def test_a_two_source_corpus_is_another_corpus_than_either_of_its_sources(tmp_path):
    (tmp_path / "a.txt").write_text("some web text\n")
    web = SourceSpec(name="web", paths=(str(tmp_path / "a.txt"),))
    both = CorpusConfig(sources=(SourceSpec(name="bundled"), web))
    assert both.source == "bundled+web"
    ids = {corpus_id(c, HELD_OUT) for c in (both, CorpusConfig(), CorpusConfig(sources=(web,)))}
    assert len(ids) == 3 and corpus_id(both, HELD_OUT).startswith("bundled+web-")
    assert corpus_from_dict(json.loads(json.dumps(to_dict(both)))) == both
    assert dataclasses.replace(both, sources=(web,)) == CorpusConfig(sources=(web,))  # a variant is a replace


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"sources": (SourceSpec(name="bundled"), SourceSpec(name="bundled"))}, "given twice"),
    ({"sources": (SourceSpec(name="web", paths=("a",)), SourceSpec(name="web", paths=("a",), lang="en"))},
     "path belongs to two sources"),
    ({"source": "web", "paths": ("a",), "sources": (SourceSpec(name="bundled"),)},
     "give either source/paths .* or sources, not both"),
    ({"tokenizer_sources": ("web",)}, "tokenizer_sources must name sources of the corpus"),
])
def test_a_corpus_config_refuses_sources_that_contradict_each_other(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CorpusConfig(**kwargs)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"name": "bundled", "paths": ("x",)}, r"SourceSpec\.paths: the bundled source reads no files"),
    ({"name": "bundled", "lang": "en"}, r"SourceSpec\.lang: bundled documents carry their own language"),
    ({"name": "web"}, r"SourceSpec\.paths: source 'web' needs at least one input path"),
    ({"name": "books", "paths": ("x",)}, r"SourceSpec\.name must be one of"),
    ({"name": "web", "paths": ("x",), "lang": "english please"}, r"SourceSpec\.lang must be a language code"),
    ({"name": "web", "paths": ("x",), "max_non_english_share": 1.0}, r"max_non_english_share must be in \[0, 1\)"),
])
def test_a_source_spec_names_the_field_and_the_bad_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SourceSpec(**kwargs)


# ---------------------------------------------------------------- flags


def _parse(argv: list[str]):
    ap = Parser(prog="prog")
    add_corpus_arguments(ap)
    return ap.parse_args(argv)


def test_each_path_lang_and_share_flag_belongs_to_the_source_before_it():
    args = _parse(["--source", "wikidump", "--path", "en.xml.bz2", "--path", "fr.xml", "--lang", "fr",
                   "--source", "web", "--path", "docs/", "--max-non-english-share", "0.5", "--source", "bundled",
                   "--tokenizer-sources", "web", "--vocab-size", "500", "--allow-smaller-vocab"])
    cfg = corpus_from_args(Preset.named("smoke").corpus, args)
    assert cfg.sources == (SourceSpec(name="wikidump", paths=("en.xml.bz2", "fr.xml"), lang="fr"),
                           SourceSpec(name="web", paths=("docs/",), max_non_english_share=0.5),
                           SourceSpec(name="bundled"))
    assert cfg.tokenizer_sources == ("web",) and cfg.vocab_size == 500 and cfg.allow_smaller_vocab
    assert cfg.max_len == Preset.named("smoke").corpus.max_len  # the rest is the preset's
    assert corpus_from_args(Preset.named("smoke").corpus, _parse([])) == Preset.named("smoke").corpus


@pytest.mark.parametrize("argv", [["--path", "docs/", "--source", "web"], ["--lang", "en"],
                                  ["--max-non-english-share", "0.3"]])
def test_a_source_option_before_any_source_is_refused_in_one_line_naming_the_flag(argv, capsys):
    with pytest.raises(SystemExit) as e:
        _parse(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1
    assert f"argument {argv[0]}: give --source first" in err


def test_the_cli_refuses_a_path_without_its_source(capsys):
    from alignlab.platform.cli import main

    with pytest.raises(SystemExit) as e:
        main(["corpus", "build", "--path", "docs/", "--source", "web"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "argument --path: give --source first" in err and "Traceback" not in err


def test_a_study_script_builds_the_corpus_its_source_flags_name(tmp_path, monkeypatch):
    from test_studies import load_script

    from alignlab.platform.study import run as study_run

    (tmp_path / "docs").mkdir()
    ran = []
    monkeypatch.setattr(study_run, "run_study", lambda study, root, **kw: ran.append(study) or tmp_path / "r.md")
    script = load_script("objective_ablation")
    study_run.study_main(script.build, ["--preset", "smoke", "--storage", str(tmp_path / "st"), "--source", "web",
                                        "--path", str(tmp_path / "docs"), "--source", "bundled"],
                         extra_objective_sets=True)
    (study,) = ran
    plain = script.build("smoke")
    assert study.corpus == dataclasses.replace(plain.corpus, sources=(
        SourceSpec(name="web", paths=(str(tmp_path / "docs"),)), SourceSpec(name="bundled")))
    # Another corpus, another study: the preset study's folder and report stay its own.
    assert study.name.startswith(f"{plain.name}-web+bundled-") and study.models == plain.models


# ---------------------------------------------------------------- options


def _docs(lang: str, n: int, prefix: str) -> list[Document]:
    return [Document(doc_id=f"{prefix}:{i}", text=f"text number {i}", lang=lang, kind="web") for i in range(n)]


def test_the_non_english_cap_drops_the_same_non_english_documents_and_never_an_english_one(tmp_path):
    specs = (SourceSpec(name="web", paths=("a",), max_non_english_share=0.25), SourceSpec(name="web", paths=("b",)))
    capped = _docs("en", 6, "en") + _docs("fr", 5, "fr") + _docs("es-mx", 3, "es")
    free = _docs("de", 4, "de")
    docs = [(0, d) for d in capped] + [(1, d) for d in free]

    def run(sub):
        dropped: dict = {}
        kept = [d.doc_id for _, d in cap_non_english(iter(docs), specs, {"fr:0"}, tmp_path / sub, 100, dropped)]
        return kept, dropped

    kept, dropped = run("a")
    # 6 English documents allow 2 others (2 / 8 = 0.25); the held-out one passes through uncounted.
    assert [k for k in kept if k.startswith("en")] == [f"en:{i}" for i in range(6)]
    others = [d.doc_id for d in capped[6:] if d.doc_id != "fr:0"]
    chosen = sorted(others, key=doc_hash)[:2]
    assert [k for k in kept if k[:2] in ("fr", "es") and k != "fr:0"] == [o for o in others if o in chosen]
    assert "fr:0" in kept and [k for k in kept if k.startswith("de")] == [f"de:{i}" for i in range(4)]
    assert dropped == {0: 5} and run("b") == (kept, dropped)
    assert not (tmp_path / "a").exists(), "the staged copy is removed once read"


def test_a_capped_source_refuses_documents_of_unknown_language(tmp_path):
    specs = (SourceSpec(name="web", paths=("notes.txt",), max_non_english_share=0.5),)
    with pytest.raises(CorpusInputError, match=r"web \(notes\.txt\): document u:0 has no language"):
        list(cap_non_english(iter([(0, d) for d in _docs("und", 2, "u")]), specs, set(), tmp_path, 10, {}))


def test_the_tokenizer_sample_comes_from_the_named_sources_and_the_objectives_sample_from_all(tmp_path):
    cfg = CorpusConfig(sources=(SourceSpec(name="wikidump", paths=("w.xml",)), SourceSpec(name="web", paths=("d",))),
                       tokenizer_sources=("web",), docs_per_shard=10)
    wiki = [Document(doc_id=f"w:{i}", text=f"wiki {i}", lang="en", kind="wiki") for i in range(7)]
    web = _docs("en", 5, "web")
    staged = stage_documents([(0, d) for d in wiki] + [(1, d) for d in web], tmp_path, cfg, set(), progress=False)
    assert sorted(staged["sample"]) == sorted(d.text for d in web)
    assert sorted(staged["fit_sample"]) == sorted(d.text for d in wiki + web)
    assert staged["documents_per_kind"] == {"wiki": 7, "web": 5} and staged["tokenizer_documents"] == 5
    assert [s["documents"] for s in staged["documents_per_source"]] == [7, 5]


def test_sentencepiece_falls_short_on_small_text_and_the_shortfall_is_refused_unless_allowed(tmp_path):
    reached = train_tokenizer(["the quick brown fox jumps over the lazy dog"] * 50, tmp_path / "t.model",
                              vocab_size=500)
    assert reached == Tokenizer(tmp_path / "t.model").vocab_size < 500
    with pytest.raises(ValueError, match=rf"vocab_size 500: sentencepiece reached only {reached} pieces .*"
                                         "--allow-smaller-vocab"):
        check_vocab_size(500, reached, allow_smaller=False, sample_docs=50)
    check_vocab_size(500, reached, allow_smaller=True, sample_docs=50)
    check_vocab_size(reached, reached, allow_smaller=False, sample_docs=50)


def test_the_epoch_count_is_steps_times_global_batch_over_training_rows(capsys):
    from alignlab.platform.presets import Preset

    assert corpus_epochs(1000, 100, 64) == pytest.approx(6.4)
    manifest = {"corpus_id": "c-1", "stats": {"chunks": {"train": 1000, "eval": 10}}}
    cfg = dataclasses.replace(Preset.named("smoke").pretrain, max_steps=100, batch_size=64)
    assert warn_if_corpus_repeats(manifest, cfg) == pytest.approx(6.4)
    err = capsys.readouterr().err
    assert "6.4 times" in err and "1000 training rows" in err and "c-1" in err
    assert warn_if_corpus_repeats(manifest, dataclasses.replace(cfg, max_steps=62)) == pytest.approx(3.968)
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------- a real two-source build on Ray


def _inputs(tmp_path):
    pages = [page(100 + i, f"Island {i}", f"The {WIKI_ONLY_WORD} island number {i} lies near [[Tanzania]] and "
                  f"{WIKI_ONLY_WORD} town; {WIKI_ONLY_WORD} spice trade.") for i in range(30)]
    dump = write_dump(tmp_path, "enwiki-20240601-pages-articles.xml", dump_xml(pages))
    web = tmp_path / "web"
    web.mkdir()
    rng = np.random.default_rng(0)
    (web / "a.jsonl").write_text("".join(json.dumps({"text": " ".join(rng.choice(WEB_WORDS, 60))}) + "\n"
                                         for _ in range(40)))
    return ["corpus", "build", "--preset", "smoke", "--storage", str(tmp_path / "root"),
            "--source", "wikidump", "--path", str(dump), "--source", "web", "--path", str(web), "--lang", "en",
            "--tokenizer-sources", "web"]


def test_a_vocabulary_the_text_cannot_fill_is_refused_by_the_cli_and_nothing_is_left_finished(tmp_path, capsys):
    from alignlab.platform.cli import main

    assert main(_inputs(tmp_path)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("alignlab: error: vocab_size 1000: sentencepiece reached "
                                                         "only ")
    assert "--allow-smaller-vocab" in err and "Traceback" not in err
    assert not list((tmp_path / "root").glob("corpus/*")), "no corpus folder, finished or half-written"


@pytest.fixture(scope="module")
def mixed_corpus(ray_session, tmp_path_factory):
    """A Wikipedia dump plus a web folder, vocabulary from the web text only, built by the CLI on Ray."""
    from alignlab.platform.cli import main

    tmp_path = tmp_path_factory.mktemp("mixed")
    argv = _inputs(tmp_path) + ["--allow-smaller-vocab"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    (cdir,) = (tmp_path / "root" / "corpus").glob("wikidump+web-*")
    return cdir, tmp_path, out.getvalue()


@pytest.mark.ray
def test_a_dump_plus_web_text_builds_one_corpus_whose_stats_count_both(mixed_corpus):
    cdir, _, _ = mixed_corpus
    stats = json.loads((cdir / "stats.json").read_text())
    assert stats["documents_per_kind"] == {"wiki": 30, "web": 40} and stats["linked_documents"] == 30
    assert [(s["source"].split(" ")[0], s["documents"]) for s in stats["documents_per_source"]] == \
        [("wikidump", 30), ("web", 40)]
    manifest = load_manifest(cdir)
    assert manifest["config"]["source"] == "wikidump+web" and len(manifest["fingerprint"]["sources"]) == 2
    kinds = {k for f in (cdir / "shards" / "train").glob("*.parquet")
             for k in pq.read_table(f, columns=["kind"]).column("kind").to_pylist()}
    assert kinds == {"wiki", "web"}


@pytest.mark.ray
def test_the_vocabulary_of_web_text_only_does_not_know_the_letters_of_a_word_of_the_wiki_part(mixed_corpus):
    from alignlab.platform.sources.wikidump import read_wikidump

    cdir, tmp_path, _ = mixed_corpus
    tok = Tokenizer(cdir / "tokenizer.model")
    # "z" and "b" are in no web word: a vocabulary of the web text alone has no piece for them.
    assert tok.unk_id in tok.sp.encode(WIKI_ONLY_WORD) and tok.unk_id not in tok.sp.encode(" ".join(WEB_WORDS))
    # The control: with the wiki part in its sample, the same request knows every letter of it.
    wiki = [d.text for d in read_wikidump(next(tmp_path.glob("enwiki-*.xml")))]
    web = [json.loads(line)["text"] for line in (tmp_path / "web" / "a.jsonl").read_text().splitlines()]
    train_tokenizer(web + wiki, tmp_path / "both.model", vocab_size=1000)
    both = Tokenizer(tmp_path / "both.model")
    assert both.unk_id not in both.sp.encode(WIKI_ONLY_WORD)


@pytest.mark.ray
def test_the_manifest_records_the_vocabulary_size_requested_and_reached_and_the_build_says_so(mixed_corpus):
    cdir, _, printed = mixed_corpus
    manifest = json.loads((cdir / MANIFEST).read_text())
    reached = Tokenizer(cdir / "tokenizer.model").vocab_size
    assert manifest["vocab"] == {"requested": 1000, "reached": reached} and reached < 1000
    assert manifest["stats"]["vocab_size"] == reached and manifest["stats"]["vocab_size_requested"] == 1000
    assert f"vocabulary: {reached} of the requested 1000 pieces" in printed


@pytest.mark.ray
def test_a_corpus_with_a_smaller_vocabulary_is_refused_when_found_without_the_permission(mixed_corpus):
    from alignlab.platform.corpus.corpus import build_corpus

    cdir, tmp_path, _ = mixed_corpus
    cfg = corpus_from_dict(load_manifest(cdir)["config"])
    assert build_corpus(cfg, tmp_path / "root", progress=False) == cdir  # found, not rebuilt
    with pytest.raises(ValueError, match=r"vocab_size 1000: sentencepiece reached only \d+ pieces"):
        build_corpus(dataclasses.replace(cfg, allow_smaller_vocab=False), tmp_path / "root", progress=False)
