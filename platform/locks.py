"""One lock per artifact id, so that two runs asking for the same corpus, task data, model or study do not
build it side by side: the second waits for the first and then finds the artifact finished (and reuses it)
or, when the first died, builds it itself.

The lock is an OS advisory lock (`fcntl.flock`) on a file under `<local root>/.locks/`; the kernel drops it
when its holder exits, however it exits, so a lock is never stale. It covers the processes that share the
local root's file system: one machine, or every node of a cluster whose root is a shared mount that honours
flock. Two machines building the same id at a remote root (`s3://`, `gs://`) with separate local caches are
not serialised: each builds under its own temporary name and the later publish wins (README "Failure
behaviour" says so).
"""
from __future__ import annotations

import fcntl
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

LOCK_DIR = ".locks"


def lock_path(root: Path, what: str) -> Path:
    return Path(root) / LOCK_DIR / f"{what}.lock"


@contextmanager
def artifact_lock(root: Path, what: str, *, label: str = "", progress: bool = True) -> Iterator[None]:
    """Hold the lock of artifact `what` (e.g. "corpus-<id>") under `root` for the `with` block; waits, saying
    so once with the holder's pid and host, while another process holds it."""
    path = lock_path(root, what)
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


def build_once(root: Path, what: str, finished: Callable[[], bool], build: Callable[[], None], *, label: str = "",
               progress: bool = True) -> None:
    """Make sure artifact `what` is finished: build it under its lock unless it is finished already, before
    the lock or once the run this one waited for let go."""
    if finished():
        return
    with artifact_lock(root, what, label=label, progress=progress):
        if not finished():
            build()
