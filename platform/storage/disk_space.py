"""A storage root that fills up while a run writes to it: found in the nested errors Ray and pyarrow hand back, and
said in one line that names the artifact's folder and what to do.

Ray Train copies each checkpoint into the run folder at the root and registers it only once the copy is whole, so
a copy cut short by a full disk never becomes the checkpoint a rerun resumes from: the previous one stays. What
is lost is the training since that one. Plain Python: no Ray.
"""
from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

NO_SPACE = "No space left on device"


def no_space_left(e: BaseException) -> bool:
    """Does `e`, or any error inside it (causes, contexts, a Train worker group's failures), say the disk is full?"""
    seen, todo = set(), [e]
    while todo:
        x = todo.pop()
        if not isinstance(x, BaseException) or id(x) in seen:  # None, or a `cause` that is a message
            continue
        seen.add(id(x))
        if (isinstance(x, OSError) and x.errno == errno.ENOSPC) or NO_SPACE in str(x):
            return True
        todo += [x.__cause__, x.__context__, getattr(x, "cause", None)]
        todo += list(getattr(x, "worker_failures", {}).values())
    return False


class DiskFull(OSError):
    """A full disk, said once: the folder of the artifact being written, the room left and what to do."""


def disk_full(what: str, shown: str, local: Path | None, then: str) -> DiskFull:
    """The error for `what` ("a checkpoint", "corpus <id>") that did not fit under the folder `shown` (`local`: the
    same folder on this machine, to say how much room is left; None at a remote root); `then`: what is kept and
    what to do."""
    free = ""
    if local is not None:
        probe = next((p for p in [Path(local), *Path(local).parents] if p.exists()), None)
        if probe is not None:
            free = f" ({shutil.disk_usage(probe).free / 2**20:.1f} MiB free now)"
    return DiskFull(errno.ENOSPC, f"no space left on the device while {what} was written here{free}; {then}", shown)


def checkpoint_disk_full(shown: str, local: Path | None) -> DiskFull:
    """The error for a checkpoint that did not fit under the run folder `shown`."""
    return disk_full("a checkpoint", shown, local, "the last whole checkpoint is kept: free space (or use another "
                     "--storage) and rerun, and pretraining resumes from it")


@contextmanager
def full_disk_named(what: str, shown: str, local: Path | None) -> Iterator[None]:
    """Turn a full disk anywhere inside the block (a local write, pyarrow's "Error writing bytes to file", Ray's
    wrapping of either) into one `disk_full` line naming the artifact's folder. The block's build leaves nothing
    that looks finished (its marker is written last), so a rerun builds it again."""
    try:
        yield
    except DiskFull:
        raise
    except Exception as e:  # noqa: BLE001 -- only a full disk is renamed; anything else goes up as it is
        if no_space_left(e):
            raise disk_full(what, shown, local, "what it wrote is not taken for finished: free space (or use another "
                            "--storage) and rerun, and it is built again") from e
        raise
