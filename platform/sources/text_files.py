"""Corpus sources read from text files: the software summaries shipped with alignlab, and web text.

Split from `sources.py` (which dispatches on the source name); every problem with an input file raises
`CorpusInputError` naming the file, the line and the cause.
"""
from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

from alignlab.platform.sources.documents import CorpusInputError, Document, Link
from alignlab.platform.sources.wikidump import require_file


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

WEB_SUFFIXES = (".txt", ".jsonl", ".json", ".parquet")
_WEB_DIR_SUFFIXES = (".txt", ".jsonl", ".parquet")


def read_web(paths: Sequence[str | Path], *, lang: str = "und") -> Iterator[Document]:
    """Documents from plain-text, JSONL and parquet files (a directory means its *.txt, *.jsonl and *.parquet,
    sorted).

    - `.txt`: each block of consecutive non-blank lines is one document, in language `lang`; its doc_id
      carries the block's first line number.
    - `.jsonl` / `.json`: one JSON object per non-blank line with a string "text"; optional "lang"
      (default `lang`) and "id" (kept as the document's title). Blank texts are skipped.
    - `.parquet`: one row per document, the same fields as columns ("text" required), row numbers from 1.
    - optional "links": `[[start, end, target], ...]` (in parquet: a list of {start, end, target} structs),
      character spans of the text that link to the page titled target; a document with links is of kind "wiki", so WHP and PAD label it as they label
      Wikipedia's links. Without links a document is "web" (MLM and NSP).

    doc_id is "web:<file name>:<line number>".
    """
    for path in _expand_web_paths(_as_paths(paths)):
        if path.suffix == ".txt":
            yield from _read_text_blocks(path, lang)
        elif path.suffix == ".parquet":
            yield from _read_parquet(path, lang)
        else:
            yield from _read_jsonl(path, lang)


def _expand_web_paths(paths: list[Path]) -> list[Path]:
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and f.suffix in _WEB_DIR_SUFFIXES)
            if not found:
                raise CorpusInputError(p, "directory has no .txt, .jsonl or .parquet files")
            files.extend(found)
        else:
            require_file(p, "a .txt, .jsonl, .json or .parquet file")
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
        if not isinstance(obj, dict):
            raise CorpusInputError(path, 'expected a JSON object with a string "text" field', where)
        doc = _record_document(path, number, obj, default_lang, where)
        if doc is not None:
            yield doc


def _read_parquet(path: Path, default_lang: str) -> Iterator[Document]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # noqa: BLE001 -- any unreadable file is the user's input problem, named with its cause
        raise CorpusInputError(path, f"not a readable parquet file ({e})") from None
    if "text" not in table.column_names:
        raise CorpusInputError(path, f'no "text" column (columns: {", ".join(table.column_names)})')
    for number, obj in enumerate(table.to_pylist(), start=1):
        doc = _record_document(path, number, {k: v for k, v in obj.items() if v is not None}, default_lang,
                               f"row {number}")
        if doc is not None:
            yield doc


def _record_document(path: Path, number: int, obj: dict, default_lang: str, where: str) -> Document | None:
    """The document of one JSONL line or parquet row (None for a blank text)."""
    if not isinstance(obj.get("text"), str):
        raise CorpusInputError(path, 'expected a string "text" field', where)
    lang = obj.get("lang", default_lang)
    if not isinstance(lang, str) or not lang:
        raise CorpusInputError(path, f'"lang" must be a non-empty string, got {lang!r}', where)
    raw = obj["text"]
    text = raw.strip()
    if not text:
        return None
    shift = len(raw) - len(raw.lstrip())  # link offsets count in the text as given
    links = []
    for i, span in enumerate(obj.get("links") or ()):
        if isinstance(span, dict):  # parquet holds a span as a struct: {"start", "end", "target"}
            span = [span.get("start"), span.get("end"), span.get("target")]
        if not (isinstance(span, (list, tuple)) and len(span) == 3 and all(isinstance(x, int) for x in span[:2])
                and isinstance(span[2], str) and span[2].strip()):
            raise CorpusInputError(path, f'"links"[{i}] must be [start, end, target title], got {span!r}', where)
        start, end = span[0] - shift, span[1] - shift
        if not (0 <= start < end <= len(text)) or (links and start < links[-1].end):
            raise CorpusInputError(path, f'"links"[{i}] {list(span)} is empty, outside the text or overlaps the '
                                   "link before it (give them sorted, as character offsets)", where)
        links.append(Link(start, end, span[2].strip()))
    title = "" if obj.get("id") is None else str(obj["id"])
    return Document(doc_id=f"web:{path.name}:{number}", text=text, lang=lang, kind="wiki" if links else "web",
                    links=tuple(links), title=title)


def _web_document(path: Path, line: int, text: str, *, lang: str = "und", title: str = "") -> Document:
    return Document(doc_id=f"web:{path.name}:{line}", text=text, lang=lang, kind="web", title=title)


def _as_paths(paths: Sequence[str | Path] | str | Path) -> list[Path]:
    # A lone path is a common slip; iterating a str would read one "file" per character.
    return [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
