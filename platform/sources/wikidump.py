"""MediaWiki XML dumps → `Document`s: wikitext becomes plain text with the article's real hyperlinks as `Link` spans.

`read_wikidump` streams a `*-pages-articles*.xml[.bz2]` export page by page; `wikitext_to_text` renders one page
(templates, references, tables, media/category links and markup are dropped; links to articles are kept). Every
problem with the file raises `CorpusInputError` naming it, the line where known, and the cause.
"""
from __future__ import annotations

import bz2
import codecs
import html
import re
import xml.etree.ElementTree as ET
from bisect import bisect_right
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from xml.parsers import expat

from alignlab.platform.sources.documents import CorpusInputError, Document, Link

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
    # Imported here, not at module load: only reading a dump needs the parser, and the corpus code that imports this
    # module also runs where it is not installed (the GPU machine's check, benchmarks/throughput/gpu_checks.sh).
    import mwparserfromhell

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
        from mwparserfromhell import nodes as mw

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
    require_file(path, "a MediaWiki .xml or .xml.bz2 dump")
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


def require_file(path: Path, what: str) -> None:
    """Refuse a missing path or a folder with a `CorpusInputError` naming it and what was expected there."""
    if not path.exists():
        raise CorpusInputError(path, f"no such file (expected {what})")
    if not path.is_file():
        raise CorpusInputError(path, f"not a file (expected {what})")
