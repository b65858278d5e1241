"""One lock per artifact id, so that two runs asking for the same corpus, task data, model or study do not
build it side by side: the second waits for the first and then finds the artifact finished (and reuses it)
or, when the first died, builds it itself.

The lock is an OS advisory lock (`fcntl.flock`) on a file under `<local root>/.locks/`; the kernel drops it
when its holder exits, however it exits, so a lock is never stale. It covers the processes that share the
local root's file system: one machine, or every node of a cluster whose root is a shared mount that honours
flock. Given the `Storage` of a remote root, the lock also takes, inside the local one, the lock object
`<remote root>/.locks/<what>.lock` (`remote_lock`: a conditional create with a lease renewed by a heartbeat),
which serialises machines that share only the root, each with its own local cache. Where the store offers no
conditional create here (`hdfs://`, `abfs://`, ...; s3:// and gs:// do) it warns once and two machines are
not serialised: each builds under its own temporary name and the later publish wins
(docs/guarantees.md#failure-behaviour).
"""
from __future__ import annotations

import fcntl
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from alignlab.platform.storage.remote_lock import remote_lock
from alignlab.platform.storage.root import Storage

LOCK_DIR = ".locks"


def lock_path(root: Path, what: str) -> Path:
    return Path(root) / LOCK_DIR / f"{what}.lock"


@contextmanager
def artifact_lock(st: Storage, what: str, *, label: str = "", progress: bool = True) -> Iterator[None]:
    """Hold the lock of artifact `what` (e.g. "corpus-<id>") for the `with` block: under the root's local folder
    and, for a remote root, at the root too. Waits, saying so once with the holder's pid and host, while another
    process holds it."""
    with _folder_lock(st.local, what, label=label, progress=progress), \
            remote_lock(st, what, label=label, progress=progress):
        yield


@contextmanager
def _folder_lock(local: Path, what: str, *, label: str, progress: bool) -> Iterator[None]:
    """The lock file of `what` under the local folder `local`, held with flock."""
    path = lock_path(local, what)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            t0 = time.time()
            if progress:
                print(f"{label or '[' + what + ']'} another run is building it ({holder}); waiting for it to finish",
                      flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
            if progress:
                print(f"{label or '[' + what + ']'} the other run let go after {time.time() - t0:.0f}s", flush=True)
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        f.flush()
        try:
            yield
        finally:
            f.seek(0)
            f.truncate()
            f.flush()
            fcntl.flock(f, fcntl.LOCK_UN)


def build_once(st: Storage, what: str, finished: Callable[[], bool], build: Callable[[], None], *,
               label: str = "", progress: bool = True, leftovers: tuple[str, ...] = ()) -> None:
    """Make sure artifact `what` is finished: build it under its lock unless it is finished already, before
    the lock or once the run this one waited for let go. `finished` must look at the root (for a remote root,
    not only this machine's cache), since the run waited for may have been on another machine.

    `leftovers`: glob patterns, under the local folder, of the temporary files and folders a build of this
    artifact writes before it renames them into place. A build killed with SIGKILL leaves them behind; the next
    build of the same id deletes them first. Holding the lock means no live run of this id is writing them."""
    if finished():
        return
    with artifact_lock(st, what, label=label, progress=progress):
        if not finished():
            remove_leftovers(st.local, leftovers, label or what, progress=progress)
            build()


def remove_leftovers(local: Path, patterns: tuple[str, ...], label: str, *, progress: bool = True) -> list[Path]:
    """Delete what `patterns` match under `local` (see `build_once`); returns what was deleted."""
    import shutil

    gone = sorted({p for pat in patterns for p in Path(local).glob(pat)})
    for p in gone:
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
    if gone and progress:
        print(f"{label} removed {len(gone)} leftover(s) of an interrupted build: "
              f"{', '.join(p.name for p in gone[:3])}{' ...' if len(gone) > 3 else ''}", flush=True)
    return gone
