"""Ray Train's list of a run's checkpoints, rebuilt when a full disk left it empty.

Ray Train lists a run's registered checkpoints in `checkpoint_manager_snapshot.json` in the run folder and
rewrites that file in place. When the disk fills while it is rewritten (seen here: a storage root that filled
during a checkpoint), the file is left empty, Ray refuses to resume the run ("Expecting value"), and every
checkpoint in the folder is orphaned. Before a rerun the driver rebuilds it from the checkpoint folders whose
`state.pt` is whole (every member of its zip archive passes its CRC): a folder whose copy the full disk cut
short is left out, so the run resumes from the last whole checkpoint. Plain Python and pyarrow: no Ray.
"""
from __future__ import annotations

import json
import zipfile

from alignlab.platform.storage.root import Storage

SNAPSHOT = "checkpoint_manager_snapshot.json"
STATE = "state.pt"
"""The file a pretraining checkpoint holds (`pretrain.driver`: rank 0's `torch.save`, a zip archive)."""


def _whole(fs, path: str) -> bool:
    try:
        with fs.open_input_file(path) as f, zipfile.ZipFile(f) as z:
            return z.testzip() is None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError):  # pyarrow's ArrowInvalid (a short file) is a ValueError
        return False


def repair(st: Storage, mid: str, name: str) -> str | None:
    """When the snapshot of model `mid`'s Train run `name` is there but not whole JSON, write it anew listing its
    whole checkpoints, oldest first (their folder names are timestamps); returns what was done, for the log, or
    None when nothing was wrong."""
    import pyarrow.fs as pafs

    fs, run = st.filesystem()[0], st.ray_path(st.model(mid, f"ray/{name}"))
    path = f"{run}/{SNAPSHOT}"
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    try:
        with fs.open_input_stream(path) as f:
            json.loads(f.read())
        return None
    except ValueError:
        pass
    shown = st.url(st.model(mid, f"ray/{name}/{SNAPSHOT}"))
    ckpts = sorted(i.base_name for i in fs.get_file_info(pafs.FileSelector(run, allow_not_found=True))
                   if i.type == pafs.FileType.Directory and i.base_name.startswith("checkpoint_")
                   and _whole(fs, f"{run}/{i.base_name}/{STATE}"))
    if not ckpts:  # nothing to resume from: Ray starts the run again without a snapshot
        fs.delete_file(path)
        return f"{shown} was damaged and no whole checkpoint is left; starting over"
    # Metrics are not needed to resume: the run keeps its checkpoints by age (no score attribute).
    results = [{"version": 0, "checkpoint_dir_name": d, "metrics": {}} for d in ckpts]
    snap = {"checkpoint_results": results, "checkpoint_report_indices": list(range(len(results))),
            "latest_checkpoint_result": results[-1], "pending_training_results": [], "pending_validation_specs": [],
            "current_report_index": len(results), "validated_checkpoint_dir_names": [],
            "timed_out_validation_checkpoint_dir_names": [], "failed_validation_checkpoint_dir_names": []}
    from importlib.metadata import version

    snap["ray_version"] = version("ray")  # Ray refuses a snapshot of another version
    with fs.open_output_stream(f"{path}.tmp") as out:
        out.write(json.dumps(snap).encode())
    fs.move(f"{path}.tmp", path)
    return f"{shown} was damaged (a full disk?): rebuilt from the whole checkpoints; resuming from {ckpts[-1]}"
