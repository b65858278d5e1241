"""The corpus flags, one spec for `alignlab corpus build`, `alignlab pretrain` and every study script:

    --source NAME [--path P ...] [--lang L] [--max-non-english-share X]    one group per source, repeatable
    --tokenizer-sources NAMES   --vocab-size N   --allow-smaller-vocab

Each `--path`, `--lang` and `--max-non-english-share` belongs to the `--source` before it, so
`--source wikidump --path enwiki.xml.bz2 --source web --path docs/ --lang en` is a Wikipedia dump plus
English web text. Without `--source` the preset's corpus is used.
"""
from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable

from alignlab.platform.config import SOURCES, PretrainConfig
from alignlab.platform.corpus.corpus_config import CorpusConfig, SourceSpec
from alignlab.platform.runtime.errors import nonneg_float, positive_int

_GROUP_OPTIONS = {"--path": "paths", "--lang": "lang", "--max-non-english-share": "max_non_english_share"}


class _NewSource(argparse.Action):
    """`--source NAME`: opens a group that the flags after it fill."""

    def __call__(self, parser, namespace, value, option_string=None):
        groups = list(getattr(namespace, self.dest) or [])
        groups.append({"name": value, "paths": []})
        setattr(namespace, self.dest, groups)


class _SourceOption(argparse.Action):
    """`--path`, `--lang`, `--max-non-english-share`: an option of the last `--source`."""

    def __call__(self, parser, namespace, value, option_string=None):
        groups = getattr(namespace, "sources", None)
        if not groups:
            parser.error(f"argument {option_string}: give --source first (each {option_string} belongs to the "
                         "--source before it)")
        field = _GROUP_OPTIONS[option_string]
        if field == "paths":
            groups[-1]["paths"].append(value)
        elif field in groups[-1]:
            parser.error(f"argument {option_string}: given twice for one --source {groups[-1]['name']}")
        else:
            groups[-1][field] = value


def _source_names(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    bad = [n for n in names if n not in SOURCES]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"expected source names from {', '.join(SOURCES)}, comma-separated, "
                                         f"got {text!r}")
    return names


def add_corpus_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("corpus", "which text the corpus is built from (default: the preset's corpus)")
    g.add_argument("--source", dest="sources", action=_NewSource, choices=SOURCES, default=None,
                   help="start a source of the corpus (repeatable: several sources make one corpus)")
    g.add_argument("--path", action=_SourceOption, default=None, metavar="P",
                   help="input file or folder of the --source before it (repeatable)")
    g.add_argument("--lang", action=_SourceOption, default=None, metavar="L",
                   help="language of that source's documents where they do not say (e.g. en)")
    g.add_argument("--max-non-english-share", action=_SourceOption, type=nonneg_float, default=None, metavar="X",
                   help="keep at most this fraction of that source's documents non-English (below 1)")
    g.add_argument("--tokenizer-sources", type=_source_names, default=None, metavar="NAMES",
                   help="train the vocabulary on these sources' documents only, e.g. web (as the paper did)")
    g.add_argument("--vocab-size", type=positive_int, default=None, help="sentencepiece vocabulary size")
    g.add_argument("--allow-smaller-vocab", action="store_true",
                   help="accept a vocabulary smaller than requested when the text cannot fill it (else: refused)")


def corpus_flags_given(args: argparse.Namespace) -> bool:
    return bool(args.sources or args.tokenizer_sources or args.vocab_size or args.allow_smaller_vocab)


def corpus_from_args(base: CorpusConfig, args: argparse.Namespace) -> CorpusConfig:
    """`base` (a preset's corpus) with the corpus flags of `args` applied."""
    changes: dict = {}
    if args.sources:
        specs = []
        for g in args.sources:
            try:
                specs.append(SourceSpec(**g))
            except ValueError as e:
                raise ValueError(f"--source {g['name']}: {e}") from None
        changes.update(paths=(), sources=tuple(specs))
    if args.tokenizer_sources:
        changes["tokenizer_sources"] = args.tokenizer_sources
    if args.vocab_size:
        changes["vocab_size"] = args.vocab_size
    if args.allow_smaller_vocab:
        changes["allow_smaller_vocab"] = True
    return dataclasses.replace(base, **changes) if changes else base


def fit_domain_phase(cfg: PretrainConfig, sources: Iterable[str]) -> PretrainConfig:
    """A preset's pretraining config for a corpus the flags chose, of these source names: the preset's domain phase
    (`PretrainConfig.domain_sources`, e.g. the mini preset's final steps on the software summaries) is kept when
    the corpus has those sources and others, and turned off, with a printed line, when it has not: the preset
    chose it for its own corpus. (A config given in Python with such a phase is refused instead: pretrain.driver.)"""
    sources = set(sources)
    if not cfg.domain_sources or (set(cfg.domain_sources) <= sources and sources - set(cfg.domain_sources)):
        return cfg
    why = "has no other source for the steps before it" if set(cfg.domain_sources) >= sources else \
        f"has no {'+'.join(sorted(set(cfg.domain_sources) - sources))} text"
    print(f"[corpus] the preset's final pretraining phase on {'+'.join(cfg.domain_sources)} is off: this corpus "
          f"({'+'.join(sorted(sources))}) {why}", flush=True)
    return dataclasses.replace(cfg, domain_sources=(), domain_fraction=0.0)
