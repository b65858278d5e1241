"""A corpus's documents, staged: its sources read in order, the non-English cap, the held-out and evaluation
splits, and the samples the vocabulary and the objectives' corpus-wide state are trained on.

Plain Python (no Ray): `stage_documents` writes the documents to parquet parts in bounded batches (memory does
not grow with the corpus); `corpus.build_corpus` labels the parts with Ray Data.
"""
from __future__ import annotations

import hashlib
import math
import shutil
import time
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from alignlab.platform.corpus.corpus_config import CorpusConfig, SourceSpec
from alignlab.platform.sources.documents import CorpusInputError, Document, Link, words_in_links
from alignlab.platform.sources.sources import check_paths_exist, iter_documents
from alignlab.platform.tasks.holdout import REASONS, ContentHoldout

DOC_SCHEMA = pa.schema([
    ("doc_id", pa.string()), ("text", pa.string()), ("lang", pa.string()), ("kind", pa.string()),
    ("link_starts", pa.list_(pa.int32())), ("link_ends", pa.list_(pa.int32())), ("source", pa.int32()),
])
"""A staged document; `source` is the index of its source in `CorpusConfig.source_specs` (null: documents
handed to `build_corpus`)."""
GIVEN = "documents given to build_corpus"


def doc_hash(doc_id: str) -> int:
    return int.from_bytes(hashlib.sha256(doc_id.encode()).digest()[:8], "little")


def is_eval_doc(doc_id: str, fraction: float) -> bool:
    return (doc_hash(doc_id) / 2**64) < fraction


def is_english(lang: str) -> bool:
    lang = lang.lower()
    return lang == "en" or lang.startswith(("en-", "en_"))


def iter_sources(cfg: CorpusConfig) -> Iterator[tuple[int, Document]]:
    """(source index, document) of every source of `cfg`, in order; every path is checked before the first."""
    specs = cfg.source_specs
    check_paths_exist([p for s in specs for p in s.paths])
    for i, spec in enumerate(specs):
        for doc in iter_documents(spec.name, spec.paths, langs=cfg.langs, max_docs_per_lang=cfg.max_docs_per_lang,
                                  lang=spec.lang):
            yield i, doc


def documents_from_columns(cols: dict) -> Iterator[Document]:
    """The documents of a staged part's columns (links without their targets, which no later stage reads)."""
    for i in range(len(cols["doc_id"])):
        links = tuple(Link(int(s), int(e), "") for s, e in zip(cols["link_starts"][i], cols["link_ends"][i]))
        yield Document(doc_id=str(cols["doc_id"][i]), text=str(cols["text"][i]), lang=str(cols["lang"][i]),
                       kind=str(cols["kind"][i]), links=links)


class _Parts:
    """Documents written to `folder/part-NNNNN.parquet`, `size` to a part."""

    def __init__(self, folder: Path, size: int):
        self.folder, self.size, self.rows, self.num_parts = folder, size, [], 0

    def add(self, source: int | None, doc: Document) -> None:
        self.rows.append({"doc_id": doc.doc_id, "text": doc.text, "lang": doc.lang, "kind": doc.kind,
                          "link_starts": [lk.start for lk in doc.links], "link_ends": [lk.end for lk in doc.links],
                          "source": source})
        if len(self.rows) >= self.size:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.folder.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.Table.from_pylist(self.rows, schema=DOC_SCHEMA),
                           self.folder / f"part-{self.num_parts:05d}.parquet")
            self.num_parts += 1
            self.rows = []


class _Reservoir:
    """A uniform sample of at most `size` texts from a stream (bounded memory)."""

    def __init__(self, size: int, rng: np.random.Generator):
        self.size, self.rng, self.texts, self.seen = size, rng, [], 0

    def offer(self, text: str) -> None:
        if len(self.texts) < self.size:
            self.texts.append(text)
        else:
            j = int(self.rng.integers(self.seen + 1))
            if j < self.size:
                self.texts[j] = text
        self.seen += 1


def cap_non_english(docs: Iterable[tuple[int | None, Document]], specs: tuple[SourceSpec, ...], holdout: set[str],
                    work: Path, docs_per_part: int, dropped: dict[int, int]) -> Iterator[tuple[int | None, Document]]:
    """`docs` less the non-English documents over each source's `max_non_english_share` (see SourceSpec).

    How many a source may keep is known only once it is read, so with a cap the documents are first staged
    to `work` (one read of the sources, bounded memory: one 8-byte hash per non-English document) and then
    yielded from there. `dropped` receives the number dropped per source index."""
    caps = {i: s.max_non_english_share for i, s in enumerate(specs) if s.max_non_english_share is not None}
    if not caps:
        yield from docs
        return
    english: Counter = Counter()
    others: dict[int, array] = {i: array("Q") for i in caps}
    raw = _Parts(work, docs_per_part)
    for i, doc in docs:
        if i in caps and doc.doc_id not in holdout and doc.text.strip():
            if doc.lang == "und":
                raise CorpusInputError(specs[i].label, f"document {doc.doc_id} has no language ('und'), so "
                                       "max_non_english_share cannot count it; give the source a lang (--lang)")
            if is_english(doc.lang):
                english[i] += 1
            else:
                others[i].append(doc_hash(doc.doc_id))
        raw.add(i, doc)
    raw.flush()
    # Keep the `allowed` non-English documents of smallest id hash: k / (english + k) <= share.
    cut: dict[int, float] = {}
    for i, share in caps.items():
        allowed = math.floor(share * english[i] / (1.0 - share) + 1e-9)
        hashes = np.sort(np.frombuffer(others[i], dtype=np.uint64)) if len(others[i]) else np.zeros(0, np.uint64)
        cut[i] = int(hashes[allowed]) if allowed < len(hashes) else math.inf
        dropped[i] = max(0, len(hashes) - allowed)
    for f in sorted(work.glob("part-*.parquet")):
        cols = pq.read_table(f).to_pydict()
        for i, doc in zip(cols["source"], documents_from_columns(cols)):
            if i in caps and not is_english(doc.lang) and doc.doc_id not in holdout and doc_hash(doc.doc_id) >= cut[i]:
                continue
            yield i, doc
    shutil.rmtree(work)


def shuffle_parts(folder: Path) -> None:
    """Redistribute the documents of `folder`'s parts over as many parts, each to the part its id hash picks,
    ordered by that hash within it: every part becomes a uniform sample of the documents, in a fixed order (the
    same on every build). Bounded memory: one part read at a time, one writer per part."""
    files = sorted(folder.glob("part-*.parquet"))
    if not files:
        return
    buckets = folder / "buckets"
    buckets.mkdir()
    writers: dict[int, pq.ParquetWriter] = {}
    for f in files:
        t = pq.read_table(f)
        bucket = np.array([doc_hash(d) % len(files) for d in t.column("doc_id").to_pylist()], dtype=np.int64)
        for b in np.unique(bucket):
            if b not in writers:
                writers[b] = pq.ParquetWriter(buckets / f"part-{b:05d}.parquet", DOC_SCHEMA)
            writers[b].write_table(t.filter(pa.array(bucket == b)))
        f.unlink()
    for w in writers.values():
        w.close()
    for b in sorted(writers):
        t = pq.read_table(buckets / f"part-{b:05d}.parquet")
        order = np.argsort(np.array([doc_hash(d) for d in t.column("doc_id").to_pylist()], dtype=np.uint64),
                           kind="stable")
        pq.write_table(t.take(order), folder / f"part-{b:05d}.parquet")
    shutil.rmtree(buckets)


def stage_documents(source: Iterable[tuple[int | None, Document]], out: Path, cfg: CorpusConfig, holdout: set[str],
                    progress: bool, content: ContentHoldout | None = None) -> dict:
    """Write documents to `out/{train,eval}` parts in bounded batches; return the samples and the counts.

    A document is held out when its id is in `holdout` or the content rule `content` gives a reason; each
    source's entry of "documents_per_source" counts them by reason ("held_out").

    "sample" is the tokenizer's: a uniform sample of `tokenizer_sample_docs` documents of the sources that
    `cfg.tokenizer_sources` names (all when empty); "fit_sample" the objectives' (`CorpusLabels.fit`), of every
    source: the same list unless `tokenizer_sources` narrows the tokenizer's."""
    specs = cfg.source_specs
    dropped: dict[int, int] = {}
    source = cap_non_english(source, specs, holdout, out / "raw", cfg.docs_per_shard, dropped)
    tok_sources = {i for i, s in enumerate(specs) if not cfg.tokenizer_sources or s.name in cfg.tokenizer_sources}
    sample = _Reservoir(cfg.tokenizer_sample_docs, np.random.default_rng(cfg.seed))
    fit_sample = _Reservoir(cfg.tokenizer_sample_docs, np.random.default_rng([cfg.seed, 1])) \
        if cfg.tokenizer_sources else sample
    words_total, words_linked = 0, 0
    parts = {split: _Parts(out / split, cfg.docs_per_shard) for split in ("train", "eval")}
    n_docs, n_linked, n_held = 0, 0, 0
    per_lang: Counter = Counter()
    per_kind: Counter = Counter()
    per_source: Counter = Counter()
    held_out: dict = {}
    t0 = time.time()
    for i, doc in source:
        if not doc.text.strip():
            continue
        why = "doc_id" if doc.doc_id in holdout else content.reason(doc.text) if content else None
        if why:
            n_held += 1
            held_out.setdefault(i, Counter())[why] += 1
            continue
        n_docs += 1
        per_lang[doc.lang] += 1
        per_kind[doc.kind] += 1
        per_source[i] += 1
        n_linked += doc.kind == "wiki"
        if i is None or i in tok_sources:
            sample.offer(doc.text)
        if fit_sample is not sample:
            fit_sample.offer(doc.text)
        if doc.kind == "wiki":
            total, inside = words_in_links(doc)
            words_total += total
            words_linked += inside
        parts["eval" if is_eval_doc(doc.doc_id, cfg.eval_fraction) else "train"].add(i, doc)
        if progress and n_docs % 5000 == 0:
            print(f"[corpus] {n_docs} documents read ({time.time() - t0:.0f}s)", flush=True)
    for p in parts.values():
        p.flush()
        if cfg.shuffle_documents:
            shuffle_parts(p.folder)
    if n_docs and not sample.texts:
        raise ValueError(f"CorpusConfig.tokenizer_sources {list(cfg.tokenizer_sources)}: those sources gave no "
                         "documents to train the vocabulary on")
    sources = [{"source": GIVEN if i is None else specs[i].label, "documents": per_source[i],
                "held_out": {r: held_out.get(i, {}).get(r, 0) for r in REASONS},
                **({"non_english_dropped": dropped[i]} if i in dropped else {})}
               for i in ([None] if None in per_source or None in held_out else range(len(specs)))]
    return {"sample": sample.texts, "fit_sample": fit_sample.texts,
            "link_density": round(words_linked / words_total, 4) if words_total else 0.0, "documents": n_docs,
            "linked_documents": n_linked, "held_out_documents": n_held, "documents_per_lang": dict(per_lang),
            "documents_per_kind": dict(per_kind), "documents_per_source": sources,
            "tokenizer_documents": sample.seen}
