"""Corpus sources read from text files: the software summaries shipped with alignlab, and web text.

Split from `sources.py` (which dispatches on the source name); every problem with an input file raises
`CorpusInputError` naming the file, the line and the cause.
"""
from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

from alignlab.platform.documents import CorpusInputError, Document
from alignlab.platform.wikidump import require_file


# --------------------------------------------------------------------------------------------
# Software summaries shipped with alignlab
# --------------------------------------------------------------------------------------------

SOFTWARE_FILE = Path(__file__).parent / "corpus_data" / "software_summaries.txt"
"""`name<TAB>summary` per line, sorted by package name (corpus_data/make_software_summaries.py)."""


def read_software(*, max_docs: int | None = None, path: Path = SOFTWARE_FILE) -> Iterator[Document]:
    """The shipped PyPI package summaries, in file order: doc_id "software:<package name>", English, kind "web"
    (no links, so no WHP or PAD labels; MLM and NSP train on them)."""
    require_file(path, "the bundled software summaries")
    for number, line in _decoded_lines(path):
        if max_docs is not None and number > max_docs:
            return
        name, tab, summary = line.partition("\t")
        if not tab or not name.strip() or not summary.strip():
            raise CorpusInputError(path, "expected `package name<TAB>summary`", f"line {number}")
        yield Document(doc_id=f"software:{name.strip()}", text=summary.strip(), lang="en", kind="web")


# --------------------------------------------------------------------------------------------
# Web text
# --------------------------------------------------------------------------------------------

WEB_SUFFIXES = (".txt", ".jsonl", ".json")
_WEB_DIR_SUFFIXES = (".txt", ".jsonl")


def read_web(paths: Sequence[str | Path], *, lang: str = "und") -> Iterator[Document]:
    """Documents from plain-text and JSONL files (a directory means its *.txt and *.jsonl, sorted).

    - `.txt`: each block of consecutive non-blank lines is one document, in language `lang`; its doc_id
      carries the block's first line number.
    - `.jsonl` / `.json`: one JSON object per non-blank line with a string "text"; optional "lang"
      (default `lang`) and "id" (kept as the document's title). Blank texts are skipped.

    doc_id is "web:<file name>:<line number>"; kind is "web"; there are no links.
    """
    for path in _expand_web_paths(_as_paths(paths)):
        if path.suffix == ".txt":
            yield from _read_text_blocks(path, lang)
        else:
            yield from _read_jsonl(path, lang)


def _expand_web_paths(paths: list[Path]) -> list[Path]:
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and f.suffix in _WEB_DIR_SUFFIXES)
            if not found:
                raise CorpusInputError(p, "directory has no .txt or .jsonl files")
            files.extend(found)
        else:
            require_file(p, "a .txt, .jsonl or .json file")
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


def _read_text_blocks(path: Path, lang: str) -> Iterator[Document]:
    block: list[str] = []
    first = 0
    for number, line in _decoded_lines(path):
        if line.strip():
            if not block:
                first = number
            block.append(line.rstrip())
        elif block:
            yield _web_document(path, first, "\n".join(block).strip(), lang=lang)
            block = []
    if block:
        yield _web_document(path, first, "\n".join(block).strip(), lang=lang)


def _read_jsonl(path: Path, default_lang: str) -> Iterator[Document]:
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
        lang = obj.get("lang", default_lang)
        if not isinstance(lang, str) or not lang:
            raise CorpusInputError(path, f'"lang" must be a non-empty string, got {lang!r}', where)
        text = obj["text"].strip()
        if text:
            title = "" if obj.get("id") is None else str(obj["id"])
            yield _web_document(path, number, text, lang=lang, title=title)


def _web_document(path: Path, line: int, text: str, *, lang: str = "und", title: str = "") -> Document:
    return Document(doc_id=f"web:{path.name}:{line}", text=text, lang=lang, kind="web", title=title)


def _as_paths(paths: Sequence[str | Path] | str | Path) -> list[Path]:
    # A lone path is a common slip; iterating a str would read one "file" per character.
    return [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
