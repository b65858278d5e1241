"""A study's trial files, `trials/<calc-id>.json`: which calculations count as finished, and reading one.

A trial file is written whole (temp name, fsync, rename), but a power cut on a filesystem that orders metadata
before data can still leave a renamed, zero-length file, and a copy can be cut short. Such a file is no result:
the report names it, and a rerun of the study runs its calculation again. A calculation that failed for want of
memory (`RETRY`) is also run again by a rerun; one that diverged is not (the same setting diverges again).
"""
from __future__ import annotations

from pathlib import Path

from alignlab.platform.storage.root import Storage, read_json

RETRY = "retry_on_rerun"
"""Set in a failed calculation's row when a rerun of the study should run it again (out of memory)."""


class DamagedTrialFile(ValueError):
    """A trial file that is empty or not whole JSON."""


def read_trial(path: Path) -> dict:
    """The row of the trial file `path`; a damaged file is refused naming it."""
    path = Path(path)
    try:
        row = read_json(path)
    except ValueError as e:
        what = "is empty" if path.stat().st_size == 0 else f"is not whole JSON ({e})"
        raise DamagedTrialFile(f"{path}: trial file {what}, as a crash or power cut while it was written leaves; "
                               "a rerun of the study runs that calculation again") from None
    if not isinstance(row, dict):
        raise DamagedTrialFile(f"{path}: trial file holds {type(row).__name__}, not a calculation's row; "
                               "a rerun of the study runs that calculation again")
    return row


def finished_calculations(st: Storage, srel: str) -> set[str]:
    """Ids of the calculations of the study folder `srel` (at the root) whose trial file is whole and not marked
    to be run again."""
    done = set()
    for name, size in st.sizes(f"{srel}/trials").items():
        if "/" in name or not name.endswith(".json") or size == 0:
            continue
        try:
            row = st.read_json(f"{srel}/trials/{name}")
        except ValueError:  # cut short: unfinished
            continue
        if isinstance(row, dict) and not row.get(RETRY):
            done.add(name[: -len(".json")])
    return done
