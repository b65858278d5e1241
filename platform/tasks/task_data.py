"""The task data: every registered task's files built once into one folder of the storage root (pools, test sets,
the texts every corpus holds out), read back as `TaskData`, and the protocol's fixed folds of a task's examples.

The first stage of the data flow: the corpus stage reads the held-out texts listed here before it builds a corpus,
and FEL samples its calculations from these files (`alignlab.platform.fel.protocol`).
"""
from __future__ import annotations

import importlib.util
import random
from dataclasses import dataclass
from pathlib import Path

from alignlab.platform.config import config_hash
from alignlab.platform.sources.sources import read_bundled
from alignlab.platform.storage.disk_space import full_disk_named
from alignlab.platform.storage.locks import build_once
from alignlab.platform.storage.root import MARKER, as_storage, Storage, write_json, write_marker, write_text
from alignlab.platform.tasks.task import Task, registered_tasks
from alignlab.platform.tasks.task_files import write_jsonl

NUM_FOLDS = 5
"""Folds of a task's examples (AD's cross-validation folds; CT's samples of its pool)."""


# The tasks room (a namespace package: no origin of its own) ships the real-text task data.
SHIPPED_TASK_DATA = Path(next(iter(importlib.util.find_spec("alignlab.tasks").submodule_search_locations))) / "task_data" / "npm"
TASK_BUILDER_VERSION = 3
"""Bumped when build_tasks writes different files for the same arguments (3: hand-labelled CT by default,
out-of-domain AD, article titles for the gazetteer baseline)."""


@dataclass
class TaskData:
    tdir: Path
    files: dict[str, list]
    """Every registered task's examples by its `Task.data_files` names, also readable as attributes
    (`data.<name>`): a new task brings its own files without a change here."""

    def __getattr__(self, name: str) -> list:
        files = self.__dict__.get("files") or {}
        if name in files:
            return files[name]
        raise AttributeError(f"TaskData has no task file named {name!r} (registered: {', '.join(files)})")

    @classmethod
    def load(cls, tdir: Path) -> "TaskData":
        """Every registered task's files (`Task.data_files`) from the task folder."""
        tdir = Path(tdir)
        fields = {}
        for t in registered_tasks():
            for field_name, (fname, required) in t.data_files.items():
                path = tdir / fname
                fields[field_name] = t.load_examples(path) if required or path.exists() else []
        return cls(tdir, fields)

    def extra_tests(self, task: Task) -> dict[str, list]:
        """Test sets every calculation of `task` is also scored on, besides its protocol test set."""
        return task.extra_tests(self)


def build_tasks(root: Path | Storage, *, langs=("en", "es", "fr"), max_docs_per_lang: int | None = None, seed: int = 0,
                **options) -> Path:
    """Build (or find) every registered task's data in one folder (`Task.build_data`); the documents a task
    marks are listed for holdout. `options` are the tasks' own (`Task.build_options`: AD's `target_snippets`,
    CT's `ct_data`), each at its default unless given."""
    tasks = registered_tasks()
    rel, options = tasks_rel(langs=langs, max_docs_per_lang=max_docs_per_lang, seed=seed, **options)
    st = as_storage(root)
    tdir = st.local / rel
    with full_disk_named(f"the task data {rel}", st.url(rel), None if st.remote else tdir):
        build_once(st, rel.replace("/", "-"), lambda: tasks_finished(st, rel),
                   lambda: _build_tasks(st, rel, tasks, langs, max_docs_per_lang, seed, options), label=f"[{rel}]",
                   leftovers=(f"{rel}/*.tmp", f"{rel}/.*.tmp-*"))
    return tdir


def tasks_rel(*, langs=("en", "es", "fr"), max_docs_per_lang: int | None = None, seed: int = 0,
              **options) -> tuple[str, dict]:
    """The task folder (relative to the root) that `build_tasks` with these arguments builds or finds, and the
    tasks' options completed with their defaults; nothing is built (`alignlab plan` asks this too)."""
    tasks = registered_tasks()
    defaults = {k: v for t in tasks for k, v in t.build_options.items()}
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise TypeError(f"build_tasks got unknown task options {', '.join(unknown)} (known: {', '.join(defaults)})")
    options = {**defaults, **options}
    parts = [t.build_key(options) for t in tasks]  # validates each task's options first
    key = config_hash({"langs": list(langs), "max_docs": max_docs_per_lang, "seed": seed,
                       "builder": TASK_BUILDER_VERSION, **{k: v for p in parts for k, v in p.items()}})
    return Storage.tasks("-".join([*(tag for t in tasks if (tag := t.folder_tag(options))), key])), options


def tasks_finished(st, rel: str) -> bool:
    """Is the task folder `rel` finished at the root (its size marker whole, or, built before markers, its
    stats.json) and present in this node's cache?"""
    return st.finished(rel, legacy="stats.json") and st.pull(rel, marker="stats.json")


def _build_tasks(st, rel: str, tasks: list, langs, max_docs_per_lang: int | None, seed: int, options: dict) -> None:
    tdir = st.local / rel
    docs = list(read_bundled(langs, max_docs_per_lang=max_docs_per_lang))
    built = [t.build_data(docs, seed=seed, options=options) for t in tasks]
    tdir.mkdir(parents=True, exist_ok=True)
    for b in built:
        for name, content in b.files.items():
            if isinstance(content, str):
                write_text(tdir / name, content)
            else:
                write_jsonl(tdir / name, content)
    doc_ids = sorted(set().union(*(b.heldout_doc_ids for b in built)))
    write_text(tdir / "heldout_doc_ids.txt", "".join(d + "\n" for d in doc_ids))
    # In name order, so the file is the same however the tasks are registered.
    stats = dict(sorted(((k, v) for b in built for k, v in b.stats.items()), key=lambda kv: kv[0]))
    write_json(tdir / "stats.json", {**stats, "heldout_documents": len(doc_ids)})
    write_marker(tdir)
    st.push(rel, last=("stats.json", MARKER))


def grouped_folds(examples: list, group) -> list[list[int]]:
    """Example indices per fold; examples of one `group(ex)` land in the same fold (fixed, seed-independent)."""
    groups = sorted({group(ex) for ex in examples})
    random.Random(12345).shuffle(groups)
    fold_of = {g: i % NUM_FOLDS for i, g in enumerate(groups)}
    folds: list[list[int]] = [[] for _ in range(NUM_FOLDS)]
    for i, ex in enumerate(examples):
        folds[fold_of[group(ex)]].append(i)
    return folds
