"""Where a result came from: the commit of the code (and whether its tree had uncommitted changes), the date, the
machine and the versions of torch, Ray and Python. A study records it when it runs and every FEL calculation
records its commit, so a report can say which code and machine produced each number."""
from __future__ import annotations

import datetime
import os
import platform as _platform
import subprocess
from functools import lru_cache
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent
"""The checkout alignlab runs from (an editable install: the repository)."""


@lru_cache(maxsize=1)
def code_commit() -> tuple[str, bool | None]:
    """(commit, dirty) of the checkout alignlab is imported from; ("unknown", None) outside a git checkout (an
    installed wheel, a Ray job's uploaded working_dir without .git). Dirty = tracked files changed."""
    def git(*args) -> str:
        return subprocess.run(["git", "-C", str(SOURCE), *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("ALIGNLAB_COMMIT", "unknown"), None
    return commit, dirty


def machine() -> str:
    """This machine in words: its GPU where torch sees one, else its CPU model, with the core count."""
    try:
        import torch

        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            return f"{n} x {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return f"{os.cpu_count()}-core {cpu_model() or _platform.processor() or _platform.machine()}"


def cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo (Linux); None where it cannot be read."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _version(package: str) -> str:
    """An installed distribution's version, read from its metadata (no import: Ray stays at the edges)."""
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def provenance() -> dict:
    """The record a study writes into study.json when it runs."""
    commit, dirty = code_commit()
    return {"commit": commit, "dirty": dirty, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "machine": machine(), "torch": _version("torch"), "ray": _version("ray"),
            "python": _platform.python_version()}


def describe_commit(prov: dict) -> str:
    """"abc1234 (clean)", "abc1234 (with uncommitted changes)" or "unknown"."""
    commit = str(prov.get("commit", "unknown"))
    short = commit[:7] if len(commit) == 40 else commit
    dirty = prov.get("dirty")
    return short if dirty is None else f"{short} ({'with uncommitted changes' if dirty else 'clean'})"
