"""The corpus stage: documents → sentencepiece vocabulary → chunk rows with the objectives' labels → parquet shards.

Core (plain Python, unit-testable): `chunk_document` cuts a document into chunks of at most
`chunk_len` tokens at word boundaries and pairs each chunk with its next one (NSP needs "the next
segment"); `ChunkLabeler` turns a batch of documents into labelled rows. Ray edge: `build_corpus`
stages the documents of its sources to parquet (`corpus_sources`), trains the tokenizer on a sample,
and runs the labeller in a Ray Data actor pool that writes the shards.

Corpus-time labels belong to the objectives (`registry.CorpusLabels`): the shard schema, the labels and
the label statistics are whatever the registered objectives declare. Words are whitespace unigrams; a word's
label sits on its first subword, its other subwords carry IGNORE. A chunk never splits a word (too long: cut).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from alignlab.platform.config import PretrainConfig, to_dict
from alignlab.platform.corpus.corpus_config import CorpusConfig
from alignlab.platform.corpus.corpus_identity import (HELDOUT_FILE, content_holdout, corpus_id, heldout_doc_ids,
                                                    source_fingerprint)
from alignlab.platform.encoder.batching import IGNORE
# Staging is called through this module's name `_stage_documents` (benchmarks/throughput/corpus_throughput.py times it).
from alignlab.platform.corpus.corpus_sources import documents_from_columns, iter_sources, stage_documents as _stage_documents
from alignlab.platform.encoder.registry import CorpusLabels, corpus_labellers
from alignlab.platform.encoder.tokenizer import Tokenizer, check_vocab_size, train_tokenizer
from alignlab.platform.runtime.ray_env import ensure_ray
from alignlab.platform.sources.documents import CorpusInputError, Document
from alignlab.platform.sources.text import split_words
from alignlab.platform.storage.disk_space import full_disk_named
from alignlab.platform.storage.locks import build_once
from alignlab.platform.storage.root import (MARKER, as_storage, publish_dir, read_json, resolve_root, Storage,
                                            write_json, write_marker)
from alignlab.platform.tasks.holdout import holdout_record

MANIFEST = "manifest.json"
CHUNK_SCHEMA = pa.schema([
    ("doc_id", pa.string()), ("lang", pa.string()), ("kind", pa.string()), ("chunk_index", pa.int32()),
    ("a_ids", pa.list_(pa.int32())), ("b_ids", pa.list_(pa.int32())), ("has_next", pa.bool_()),
    ("a_text", pa.string()), ("b_text", pa.string()),
])
"""The columns of every shard row; the objectives' label columns follow (`shard_schema`)."""


# ---------------------------------------------------------------- core


def shard_schema(labellers: list[CorpusLabels]) -> pa.Schema:
    """The shard schema: the chunk columns, then each labeller's columns in order."""
    fields = list(CHUNK_SCHEMA)
    for lab in labellers:
        fields += [pa.field(name, typ) for name, typ in lab.shard_columns().items()]
    return pa.schema(fields)


def chunk_document(doc: Document, tok: Tokenizer, chunk_len: int,
                   labellers: list[CorpusLabels] | None = None) -> list[dict]:
    """Rows of (chunk, next chunk) for one document, with the per-token labels of the labellers (default: every
    registered objective's) that label words; a labeller with no labels for the document gives null columns."""
    labellers = corpus_labellers() if labellers is None else labellers
    spans = split_words(doc.text)
    if not spans:
        return []
    words = [doc.text[s:e] for s, e in spans]
    pieces = tok.encode_words(words)
    tagged = [lab for lab in labellers if lab.token_columns]
    word_tags = [lab.word_labels(doc, spans) for lab in tagged]
    chunks: list[tuple[list[int], list[list[int]], list[str]]] = []
    ids: list[int] = []
    labels: list[list[int]] = [[] for _ in tagged]
    cw: list[str] = []
    for w, (word, p) in enumerate(zip(words, pieces)):
        p = p[:chunk_len]
        if ids and len(ids) + len(p) > chunk_len:
            chunks.append((ids, labels, cw))
            ids, labels, cw = [], [[] for _ in tagged], []
        ids.extend(p)
        if p:
            for tags, lab in zip(word_tags, labels):
                if tags is not None:
                    lab.extend([int(tags[w])] + [IGNORE] * (len(p) - 1))
        cw.append(word)
    if ids:
        chunks.append((ids, labels, cw))
    rows = []
    for i, (a_ids, a_lab, a_words) in enumerate(chunks):
        nxt = chunks[i + 1] if i + 1 < len(chunks) else None
        row = {
            "doc_id": doc.doc_id, "lang": doc.lang, "kind": doc.kind, "chunk_index": i,
            "a_ids": a_ids, "b_ids": nxt[0] if nxt else [], "has_next": nxt is not None,
            "a_text": " ".join(a_words), "b_text": " ".join(nxt[2]) if nxt else "",
        }
        for k, (lab, tags) in enumerate(zip(tagged, word_tags)):
            a_col, b_col = lab.token_columns
            row[a_col] = a_lab[k] if tags is not None else None
            row[b_col] = (nxt[1][k] if nxt else []) if tags is not None else None
        rows.append(row)
    return rows


LABEL_BATCH_DOCS = 256
"""Documents whose rows the objectives label together (`CorpusLabels.label_rows`, e.g. pairs drawn among a
batch's chunks)."""


class ChunkLabeler:
    """Documents → labelled chunk rows. One instance per Ray Data actor: the tokenizer loads once.

    `label(docs)` is the core (plain Python): it cuts a batch of documents into rows and lets every labeller
    (`labellers`: the objectives' fitted `CorpusLabels`, pickled to the actor) label them. Called by Ray Data,
    an instance takes rows {src, dst} naming one staged part of documents and
    the shard file to write (paths under the storage root `storage`): it labels the part in batches of
    `LABEL_BATCH_DOCS` documents, each seeded by its first document, and writes the part's shard. A shard
    depends only on its part, so every build of a corpus writes the same files."""

    def __init__(self, tokenizer_path: str, chunk_len: int, labellers: list[CorpusLabels], seed: int,
                 storage: str | None = None):
        self.st = resolve_root(storage) if storage else None
        if self.st is not None:  # the tokenizer comes from the root (pitfall 15: small args); local: no copy
            self.st.pull_file(tokenizer_path)
            tokenizer_path = str(self.st.local / tokenizer_path)
        self.tok = Tokenizer(tokenizer_path)
        self.chunk_len, self.seed, self.labellers = chunk_len, seed, list(labellers)
        self.schema = shard_schema(self.labellers)

    def label(self, docs: dict) -> pa.Table:
        rows: list[dict] = []
        for doc in documents_from_columns(docs):
            rows.extend(chunk_document(doc, self.tok, self.chunk_len, self.labellers))
        # Each labeller gets a generator seeded by the seed and the batch's first document, so the output is
        # reproducible and one labeller's draws do not depend on another's.
        key = rows[0]["doc_id"] if rows else ""
        seed = [self.seed, int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")]
        for lab in self.labellers:
            lab.label_rows(rows, np.random.default_rng(seed))
        # A typed table, so that columns that are all null in a batch (web chunks' link labels) keep their type.
        return pa.Table.from_pylist(rows, schema=self.schema)

    def __call__(self, parts: dict) -> dict:
        fs, _ = self.st.filesystem()
        out = {"dst": [], "rows": []}
        for src, dst in zip(parts["src"], parts["dst"]):
            docs = pq.read_table(self.st.ray_path(str(src)), filesystem=fs).to_pydict()
            n = len(docs["doc_id"])
            tables = [self.label({k: v[i: i + LABEL_BATCH_DOCS] for k, v in docs.items()})
                      for i in range(0, n, LABEL_BATCH_DOCS)]
            table = pa.concat_tables(tables) if tables else self.schema.empty_table()
            path = self.st.ray_path(str(dst))
            if self.st.remote:  # an object appears whole or not at all
                fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
                pq.write_table(table, path, filesystem=fs)
            else:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(table, path + ".tmp")
                os.replace(path + ".tmp", path)
            out["dst"].append(str(dst))
            out["rows"].append(table.num_rows)
        return out


CORPUS_SMALL_FILES_ONLY = ("shards/",)
"""What a node pulls of a remote corpus: everything but the shards, which Ray Data reads from the root."""


def corpus_finished(st: Storage, cid: str) -> bool:
    """Is corpus `cid` finished at the root (every file its size marker lists whole, shards too; before markers,
    its manifest) and in this node's cache (pulled without the shards from a remote root)?"""
    rel = st.corpus(cid)
    return st.finished(rel, legacy=MANIFEST, announce=MANIFEST) and \
        st.pull(rel, marker=MANIFEST, exclude=CORPUS_SMALL_FILES_ONLY)


def load_manifest(cdir: Path) -> dict:
    """A finished corpus's manifest; a clear error for a folder that is not one."""
    m = Path(cdir) / MANIFEST
    if not m.exists():
        raise ValueError(f"{cdir}: not a finished corpus (no {MANIFEST}); build it with `alignlab corpus build`")
    return read_json(m)


def shard_names(cdir: Path, manifest: dict, split: str) -> list[str]:
    """A split's shards, relative to the corpus's `shards/` folder, in the manifest's order: the one order every
    reader of a split uses (pretraining's row stream, `corpus_embeddings`' counts). Corpora built before the
    manifest listed its shards: the split's folder, sorted."""
    if "shards" in manifest:
        return list(manifest["shards"][split])
    return sorted(f"{split}/{p.name}" for p in (Path(cdir) / "shards" / split).glob("*.parquet"))


def corpus_sources(manifest: dict) -> set[str] | None:
    """The sources a finished corpus holds documents of (its manifest's stats); None for a corpus built before
    they were counted."""
    per_source = manifest.get("stats", {}).get("documents_per_source")
    return None if per_source is None else {d["source"] for d in per_source if d["documents"]}


# ---------------------------------------------------------------- Ray edge


def build_corpus(cfg: CorpusConfig, root: Path | Storage, *, docs: Iterable[Document] | None = None,
                 num_workers: int = 1, progress: bool = True, task_dir: Path | None = None) -> Path:
    """Build (or find) the corpus for `cfg` under `root`; returns its (local) folder. `docs` overrides the
    source. Every document, whatever its source, is checked against the task texts of `cfg`'s task folder and
    of `task_dir` (a study's own) by the content holdout rule (`holdout`); the manifest records it. With a
    remote root the folder holds everything but the shards, which stay at the root. A corpus whose vocabulary
    fell short of `cfg.vocab_size` is refused unless `cfg.allow_smaller_vocab`, whether it
    was just built (then before it is labelled; nothing is left behind) or found."""
    if docs is not None and (cfg.sources or cfg.tokenizer_sources):
        raise ValueError("build_corpus: `docs` replaces the config's sources, so its source options (sources, "
                         "tokenizer_sources) cannot apply; leave them unset")
    st = as_storage(root)
    heldout, cfg_tasks = heldout_doc_ids(cfg, st)
    tdirs = sorted({Path(p) for p in (cfg_tasks and st.here(st.tasks(cfg_tasks)), task_dir) if p})
    content = content_holdout(tdirs)
    labellers = corpus_labellers()
    cid = corpus_id(cfg, heldout, custom=docs is not None, labellers=labellers, content=content)
    final = st.here(st.corpus(cid))
    held = (heldout, cfg_tasks, content, [p.name for p in tdirs])
    with full_disk_named(f"corpus {cid}", st.url(st.corpus(cid)), None if st.remote else final):
        build_once(st, f"corpus-{cid}", lambda: corpus_finished(st, cid),
                   lambda: _build(cfg, st, cid, final, held, labellers, docs, num_workers, progress),
                   label=f"[corpus {cid}]", progress=progress, leftovers=(st.corpus(f"{cid}.tmp-*"),))
    stats = load_manifest(final)["stats"]
    check_vocab_size(cfg.vocab_size, stats["vocab_size"], allow_smaller=cfg.allow_smaller_vocab,
                     sample_docs=stats.get("tokenizer_sample_documents", "?"))
    return final


def _build(cfg: CorpusConfig, st: Storage, cid: str, final: Path, held: tuple, labellers: list,
           docs: Iterable[Document] | None, num_workers: int, progress: bool) -> None:
    """Build the corpus `cid` under a temporary name and publish it at `final` (its lock held); `held`: the
    held-out ids, the config's task folder, the content rule and the task folders it applies."""
    import ray

    heldout, task_dir, content, content_dirs = held
    started = time.time()
    tmp = final.with_name(f"{cid}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "docs" / "train").mkdir(parents=True)
    (tmp / "docs" / "eval").mkdir(parents=True)
    try:
        holdout = set(heldout)
        (tmp / HELDOUT_FILE).write_text("".join(i + "\n" for i in heldout))
        source = iter_sources(cfg) if docs is None else ((None, d) for d in docs)
        phase = {}
        t = time.time()
        staged = _stage_documents(source, tmp / "docs", cfg, holdout, progress, content=content)
        if staged["documents"] == 0:
            raise CorpusInputError(",".join(p for s in cfg.source_specs for p in s.paths) or cfg.source,
                                   "empty corpus: no documents with text")
        fit_sample = staged.pop("fit_sample")
        for lab in labellers:  # corpus-wide label state, from a sample of every source's documents
            lab.fit(fit_sample)
        phase["staging"] = round(time.time() - t, 2)
        t = time.time()
        sample = staged.pop("sample")
        staged["tokenizer_sample_documents"] = len(sample)
        reached = train_tokenizer(sample, tmp / "tokenizer.model", vocab_size=cfg.vocab_size, seed=cfg.seed,
                                  lowercase=cfg.lowercase)
        check_vocab_size(cfg.vocab_size, reached, allow_smaller=cfg.allow_smaller_vocab, sample_docs=len(sample))
        if reached < cfg.vocab_size:
            print(f"[corpus {cid}] vocabulary: {reached} of the requested {cfg.vocab_size} pieces "
                  "(allow_smaller_vocab)", flush=True)
        phase["tokenizer"] = round(time.time() - t, 2)
        ensure_ray()
        t_label = time.time()
        # The labelling tasks read the staged parts and write the shards under the root, so that they can run
        # on any node: a local root is one folder (on a cluster, a shared one); a remote root first receives
        # the parts and the tokenizer, and then the shards, straight into the corpus's own folder there
        # (unfinished until its manifest arrives, last).
        work = st.corpus(tmp.name)
        shard_base = st.corpus(cid, "shards") if st.remote else f"{work}/shards"
        if st.remote:
            st.push(work)
        shards: dict[str, list[str]] = {}
        for split in ("train", "eval"):
            parts = sorted(p.name for p in (tmp / "docs" / split).glob("*.parquet"))
            (tmp / "shards" / split).mkdir(parents=True)
            shards[split] = [f"{split}/{p}" for p in parts]
            if not parts:
                continue
            items = [{"src": f"{work}/docs/{split}/{p}", "dst": f"{shard_base}/{split}/{p}"} for p in parts]
            ds = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
                ChunkLabeler,
                fn_constructor_kwargs=dict(tokenizer_path=f"{work}/tokenizer.model", chunk_len=cfg.chunk_len,
                                           labellers=labellers, seed=cfg.seed, storage=st.uri),
                # Half a CPU per actor: on a 2-CPU machine two actors must leave Ray Data a whole CPU for its
                # own tasks, or the pipeline waits forever at 0 rows (docs/cluster.md#ray-data-needs-a-whole-cpu).
                compute=ray.data.ActorPoolStrategy(size=max(1, min(num_workers, len(items)))), batch_size=1,
                num_cpus=0.5,
            )
            done = 0
            for _ in ds.iter_rows():
                done += 1
                if progress:
                    el = time.time() - t_label
                    print(f"[corpus] {split}: labelled {done}/{len(items)} parts ({el:.0f}s, "
                          f"ETA {el / done * (len(items) - done):.0f}s)", flush=True)
        label_s = time.time() - t_label
        counts, stats = _shard_stats(st, shard_base, shards, tmp / "tokenizer.model", labellers)
        np.save(tmp / "token_counts.npy", counts)
        shutil.rmtree(tmp / "docs")
        if st.remote:
            fs, _ = st.filesystem()
            fs.delete_dir(st.ray_path(work))
        stats.update(staged, vocab_size_requested=cfg.vocab_size)
        stats["phase_seconds"] = {**phase, "labelling": round(label_s, 2)}
        stats["wall_time_s"] = round(time.time() - started, 2)
        write_json(tmp / "stats.json", stats)
        write_json(tmp / "config.json", to_dict(cfg))
        write_json(tmp / MANIFEST, {"corpus_id": cid, "config": to_dict(cfg), "fingerprint": source_fingerprint(cfg)
                                    if docs is None else {}, "columns": shard_schema(labellers).names, "shards": shards, "stats": stats,
                                    "heldout": {"documents": len(heldout), "task_dir": task_dir, "file": HELDOUT_FILE},
                                    "holdout": holdout_record(content, content_dirs, staged["documents_per_source"]),
                                    "vocab": {"requested": cfg.vocab_size, "reached": stats["vocab_size"]},
                                    "marker": MARKER})
        # The size marker, last: a shard or file cut short (a full disk, an interrupted upload) is unfinished.
        write_marker(tmp, extra={f"shards/{f}": n for f, n in st.sizes(shard_base).items()} if st.remote else None)
        publish_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if st.remote:  # best effort: the staged parts at the root (shards without a manifest count as unfinished)
            try:
                st.filesystem()[0].delete_dir(st.ray_path(st.corpus(tmp.name)))
            except Exception:  # noqa: BLE001 -- nothing there, or no permission: the original error matters
                pass
        raise
    st.push(st.corpus(cid), last=(MANIFEST, MARKER))


def _shard_stats(st: Storage, base: str, shards: dict[str, list[str]], tokenizer_path: Path,
                 labellers: list[CorpusLabels]) -> tuple[np.ndarray, dict]:
    """Token counts (for MLM's rare-token masking) and corpus statistics (the labellers' among them), streamed
    file by file."""
    stats: dict = {"chunks": {}, "tokens_per_lang": Counter()}
    acc = [Counter() for _ in labellers]
    columns = ["lang", "a_ids"] + [c for lab in labellers for c in lab.stats_columns]
    vocab = Tokenizer(tokenizer_path).vocab_size
    counts = np.zeros(vocab, dtype=np.int64)
    fs = st.ray_filesystem()
    for split in ("train", "eval"):
        n = 0
        for name in shards[split]:
            t = pq.read_table(st.ray_path(f"{base}/{name}"), columns=list(dict.fromkeys(columns)), filesystem=fs)
            ids = t.column("a_ids").combine_chunks()
            flat = ids.flatten().to_numpy()
            if split == "train":
                counts += np.bincount(flat, minlength=vocab)[:vocab]
            lens = np.diff(ids.offsets.to_numpy())
            for lang, ln in zip(t.column("lang").to_pylist(), lens):
                stats["tokens_per_lang"][lang] += int(ln)
            for lab, a in zip(labellers, acc):
                lab.count(t, a)
            n += t.num_rows
        stats["chunks"][split] = n
    for lab, a in zip(labellers, acc):
        stats.update(lab.stats(a))
    stats["tokens_per_lang"] = dict(stats["tokens_per_lang"])
    stats["tokens"] = int(sum(stats["tokens_per_lang"].values()))
    stats["vocab_size"] = vocab
    return counts, stats


# ---------------------------------------------------------------- what a pretraining run makes of it


MAX_CORPUS_EPOCHS = 4
"""Passes over a corpus's training rows beyond which a pretraining run is warned: a model that sees the same
rows this often starts to memorise them (the paper's run made 10 passes over 4.4B tokens of Wikipedia)."""


def corpus_epochs(train_rows: int, max_steps: int, batch_size: int) -> float:
    """Passes over the training rows that `max_steps` steps of `batch_size` rows (the global batch) make; a
    row is one example (rows are never duplicated into several: PretrainConfig.layout_fraction)."""
    return max_steps * batch_size / max(train_rows, 1)


def check_corpus_fills_a_batch(manifest: dict, cfg: PretrainConfig) -> None:
    """Refuse, before Ray Train starts, a run whose corpus has fewer training rows than one global batch: every rank
    reads its share of the rows in whole batches (`drop_last`), so it would train on nothing and each worker would
    fail (three times, with Ray's retries) only after the workers had started."""
    rows = int(manifest["stats"]["chunks"].get("train", 0))
    if rows < cfg.batch_size:
        raise ValueError(f"corpus {manifest['corpus_id']} has {rows} training row{'s' if rows != 1 else ''}, fewer "
                         f"than one global batch of {cfg.batch_size}: pretraining would have nothing to train on; "
                         "give it more text (--source/--path) or use a preset with a smaller batch_size")


def warn_if_corpus_repeats(manifest: dict, cfg: PretrainConfig) -> float:
    """Warn (stderr) when a run of `cfg` would repeat the corpus of `manifest` more than MAX_CORPUS_EPOCHS
    times; returns the number of passes."""
    rows = int(manifest["stats"]["chunks"].get("train", 0))
    epochs = corpus_epochs(rows, cfg.max_steps, cfg.batch_size)
    if epochs > MAX_CORPUS_EPOCHS:
        print(f"[pretrain] warning: {cfg.max_steps} steps x batch {cfg.batch_size} go over the {rows} training rows "
              f"of corpus {manifest['corpus_id']} {epochs:.1f} times (more than {MAX_CORPUS_EPOCHS}); give it more "
              "text (--source/--path) or train fewer steps", file=sys.stderr, flush=True)
    return epochs
