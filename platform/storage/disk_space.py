"""A storage root that fills up while a run writes to it: found in the nested errors Ray hands back, and said in
one line that names the folder and what to do.

Ray Train copies each checkpoint into the run folder at the root and registers it only once the copy is whole, so
a copy cut short by a full disk never becomes the checkpoint a rerun resumes from: the previous one stays. What
is lost is the training since that one. Plain Python: no Ray.
"""
from __future__ import annotations

import errno
import shutil
from pathlib import Path

NO_SPACE = "No space left on device"


def no_space_left(e: BaseException) -> bool:
    """Does `e`, or any error inside it (causes, contexts, a Train worker group's failures), say the disk is full?"""
    seen, todo = set(), [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if (isinstance(x, OSError) and x.errno == errno.ENOSPC) or NO_SPACE in str(x):
            return True
        todo += [x.__cause__, x.__context__, getattr(x, "cause", None)]
        todo += list(getattr(x, "worker_failures", {}).values())
    return False


def checkpoint_disk_full(shown: str, local: Path | None) -> OSError:
    """The error for a checkpoint that did not fit under the folder `shown` (`local`: the same folder on this
    machine, to say how much room is left; None at a remote root)."""
    free = ""
    if local is not None:
        probe = next((p for p in [Path(local), *Path(local).parents] if p.exists()), None)
        if probe is not None:
            free = f" ({shutil.disk_usage(probe).free / 2**20:.1f} MiB free now)"
    return OSError(errno.ENOSPC, f"no space left on the device while a checkpoint was written here{free}; the last "
                   "whole checkpoint is kept: free space (or use another --storage) and rerun, and pretraining "
                   "resumes from it", shown)
