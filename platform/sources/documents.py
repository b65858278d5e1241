"""The unit every corpus source yields: a document with its text and (for linked sources) hyperlinks.

Sources (MediaWiki dumps, the bundled summaries, web text) all produce `Document`s; everything
downstream (tokenizing, chunking, WHP/PAD labels, task datasets) consumes them and nothing else.
`kind` decides which objectives apply: "wiki" documents carry link spans (WHP, PAD apply); "web"
documents do not (MLM and NSP only; subword regularization may apply).
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

KINDS = ("wiki", "web")


@dataclass(frozen=True, slots=True)
class Link:
    """A hyperlink: `text[start:end]` is the anchor text, `target` the linked article's title."""

    start: int
    end: int
    target: str


@dataclass(frozen=True, slots=True)
class Document:
    doc_id: str
    """Stable across runs, e.g. "bundled:en:Alan Turing", "wikidump:12345", "web:notes.jsonl:17"."""
    text: str
    lang: str = "und"
    """ISO 639-1 code ("en", "es", "fr") or "und" when unknown."""
    kind: str = "web"
    """"wiki" (linked source: WHP/PAD labels are made) or "web" (no link labels)."""
    links: tuple[Link, ...] = ()
    """Non-overlapping, sorted by start; character offsets into `text`."""
    title: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"document {self.doc_id!r}: kind must be one of {KINDS}, got {self.kind!r}")
        prev_end = 0
        for link in self.links:
            if not (prev_end <= link.start < link.end <= len(self.text)):
                raise ValueError(
                    f"document {self.doc_id!r}: link {link} is out of order, empty, overlapping or outside the text"
                )
            prev_end = link.end


class CorpusInputError(ValueError):
    """Bad input to the corpus stage. The message names the file, the place in it, and the cause."""

    def __init__(self, path: str, cause: str, where: str | None = None):
        self.path, self.where, self.cause = str(path), where, cause
        loc = f"{self.path}:{where}" if where else self.path
        super().__init__(f"{loc}: {cause}")


def words_in_links(doc: Document) -> tuple[int, int]:
    """(whitespace-separated words, those of them that overlap a link) of a document: its link density's parts."""
    spans = [m.span() for m in re.finditer(r"\S+", doc.text)]
    ends = [lk.end for lk in doc.links]
    inside = 0
    for s, e in spans:
        j = bisect.bisect_right(ends, s)
        if j < len(doc.links) and doc.links[j].start < e:
            inside += 1
    return len(spans), inside

