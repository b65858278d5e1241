"""Where things are written: one storage root, laid out so a person can find things by eye (DESIGN.md).

Every write that a crash could leave half-done goes to a temporary name and is renamed last.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

DEFAULT_ROOT = "alignlab-storage"


def resolve_root(root: str | os.PathLike | None) -> Path:
    """The storage root as a local path. `file://` URIs are accepted; object stores come with the cluster issue."""
    root = str(root or os.environ.get("ALIGNLAB_STORAGE", DEFAULT_ROOT))
    if root.startswith("file://"):
        root = root[len("file://"):]
    if "://" in root:
        raise ValueError(f"storage root {root!r}: only local paths and file:// URIs are supported so far")
    return Path(root).expanduser().resolve()


def corpus_dir(root: Path, corpus_id: str) -> Path:
    return root / "corpus" / corpus_id


def model_dir(root: Path, model_id: str) -> Path:
    return root / "models" / model_id


def study_dir(root: Path, name: str) -> Path:
    return root / "studies" / name


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
    os.replace(tmp, path)


def write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    with open(path) as f:
        return json.load(f)


def publish_dir(tmp: Path, final: Path) -> None:
    """Move a fully written folder into place; an older unfinished one at `final` is replaced."""
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
