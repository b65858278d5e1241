"""Issue #46 on a real Ray instance: a pretraining run that runs out of device memory, and a storage root that
fills up while a checkpoint is written. Real TorchTrainer, real checkpoints; the faults come in through
`pretrain(after_step=...)` (fault_hooks) and a real small filesystem (tmpfs)."""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


def _cfg(**kw):
    from alignlab.platform.presets import Preset

    return dataclasses.replace(Preset.named("smoke").pretrain, **{**dict(max_steps=6, checkpoint_every=2, log_every=1,
                                                                    precision="fp32"), **kw})


# -m slow (~40 s): one worker, and the rerun that finishes. The default run checks the same stop and the same line
# with two workers (below), where one rank's out-of-memory must also end the other's wait.
@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(600)
def test_a_pretraining_run_that_runs_out_of_memory_stops_at_once_naming_the_model_the_batch_and_what_to_lower(
        ray_session, smoke_corpus, tmp_path):
    """With unlimited Train retries (`max_failures=-1`) the run still ends at the first out-of-memory: retrying the
    same batch on the same device would run out of memory again, for ever."""
    from fault_hooks import OutOfMemoryAt, registered

    from alignlab.platform.pretrain.driver import pretrain
    from alignlab.platform.pretrain.models import is_finished
    from alignlab.platform.runtime.out_of_memory import RECORD, OutOfMemory

    cfg, root, out = _cfg(), tmp_path / "root", tmp_path / "out"
    out.mkdir()
    with pytest.raises(OutOfMemory) as err:
        pretrain(smoke_corpus, cfg, root, max_failures=-1, after_step=registered(OutOfMemoryAt(3, str(out))))
    line = str(err.value)
    assert "\n" not in line
    assert f"out of memory on cpu (CPU, " in line and "at step 3" in line, line
    assert f"model {cfg.model.label}, {cfg.worker_batch_size} sequences of up to" in line, line
    assert "lower the per-worker batch" in line and "--train-workers" in line, line
    assert (out / "raised").read_text() == "3\n"  # raised once: no retry ran that step again
    (mdir,) = (root / "models").iterdir()
    assert not is_finished(mdir) and not (mdir / RECORD).exists()  # the record is the driver's to read and drop
    # With the memory there (no fault), a rerun resumes from the last checkpoint and finishes.
    pretrain(smoke_corpus, cfg, root)
    assert is_finished(mdir)


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_one_of_two_data_parallel_workers_running_out_of_memory_ends_the_run_and_none_waits_for_the_other(
        ray_session, smoke_corpus, tmp_path):
    from fault_hooks import OutOfMemoryAt, registered

    from alignlab.platform.pretrain.driver import pretrain
    from alignlab.platform.pretrain.models import is_finished
    from alignlab.platform.runtime.out_of_memory import RECORD, OutOfMemory

    cfg, root, out = _cfg(num_workers=2, cpus_per_worker=0.5), tmp_path / "root", tmp_path / "out"
    out.mkdir()
    with pytest.raises(OutOfMemory, match=r"out of memory on cpu .* at step 3: .* over 2 workers") as err:
        pretrain(smoke_corpus, cfg, root, max_failures=-1,
                 after_step=registered(OutOfMemoryAt(3, str(out), rank=1)))
    line = str(err.value)
    assert "\n" not in line
    assert f"model {cfg.model.label}, {cfg.worker_batch_size} sequences of up to" in line, line
    assert "lower the per-worker batch" in line and "--train-workers" in line, line
    assert (out / "raised").read_text() == "3\n"  # raised once, with unlimited retries: no retry ran that step again
    (mdir,) = (root / "models").iterdir()
    assert not is_finished(mdir) and not (mdir / RECORD).exists()  # the record is the driver's to read and drop


@pytest.fixture
def small_disk(tmp_path):
    """A real filesystem of its own, 256 MiB: tmpfs (needs root, as the CI runs), else a loop-mounted ext4 image."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    tries = [["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(mnt)]]
    if shutil.which("mkfs.ext4"):
        img = tmp_path / "small.img"
        tries.append(["sh", "-c", f"truncate -s 256M {img} && mkfs.ext4 -q {img} && mount -o loop {img} {mnt}"])
    why = []
    for cmd in tries:
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode == 0:
            break
        why.append(f"{cmd[0]}: {p.stderr.strip() or p.returncode}")
    else:
        pytest.skip("cannot mount a small filesystem here (needs root): " + "; ".join(why))
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_a_disk_that_fills_while_a_checkpoint_is_written_names_the_folder_and_the_run_resumes_once_space_is_freed(
        ray_session, smoke_corpus, small_disk, tmp_path):
    """The storage root is a small filesystem that fills up just before the step-4 checkpoint: the run stops with
    one line naming the run's checkpoint folder, the step-2 checkpoint stays usable, and once the space is freed a
    rerun resumes from it (its first step is 3) and finishes."""
    import json

    from fault_hooks import FillDiskAt, Probe, registered

    from alignlab.platform.pretrain.driver import pretrain
    from alignlab.platform.pretrain.models import is_finished
    from alignlab.platform.runtime.errors import _describe

    cfg, root, out = _cfg(), small_disk / "root", tmp_path / "out"
    out.mkdir()
    filler = small_disk / "filler"
    with pytest.raises(OSError) as err:
        pretrain(smoke_corpus, cfg, root, max_failures=1,
                 after_step=registered(FillDiskAt(4, str(filler), str(out / "filled"))))
    (mdir,) = (root / "models").iterdir()
    line = _describe(err.value)  # what the command line prints after "alignlab: error: "
    assert line.startswith(f"{mdir / 'ray' / 'train'}: no space left on the device while a checkpoint was written"), line
    assert "rerun" in line and "resumes" in line and "\n" not in line, line
    assert (out / "filled").exists() and not is_finished(mdir)
    filler.unlink()
    probe = tmp_path / "probe"
    probe.mkdir()
    pretrain(smoke_corpus, cfg, root, after_step=registered(Probe(str(probe))))
    assert is_finished(mdir)
    steps = [json.loads(l)["step"] for l in (probe / "rank0.jsonl").read_text().splitlines()]
    assert steps == [3, 4, 5, 6], steps  # resumed from the step-2 checkpoint, not from scratch


def test_an_empty_run_snapshot_is_rebuilt_from_the_whole_checkpoints_leaving_out_one_cut_short(tmp_path):
    """What a full disk leaves in a Train run folder: the snapshot emptied, the newest checkpoint's state.pt cut
    short. The rebuilt snapshot lists the whole checkpoints only, the newest of them as the one to resume from."""
    import json

    import torch

    from alignlab.platform.pretrain.run_snapshot import SNAPSHOT, repair
    from alignlab.platform.storage.root import as_storage

    run = tmp_path / "models" / "m" / "ray" / "train"
    names = ["checkpoint_2026-01-01_00-00-01.000000", "checkpoint_2026-01-01_00-00-02.000000",
             "checkpoint_2026-01-01_00-00-03.000000"]
    for n in names:
        (run / n).mkdir(parents=True)
        torch.save({"w": torch.arange(1000.0)}, run / n / "state.pt")
    cut = run / names[2] / "state.pt"
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    (run / "checkpoint_2026-01-01_00-00-04.000000").mkdir()
    (run / "checkpoint_2026-01-01_00-00-04.000000" / "state.pt").write_bytes(b"")  # a copy the full disk stopped at once
    (run / SNAPSHOT).write_text("")
    st = as_storage(tmp_path)
    assert "resuming from " + names[1] in repair(st, "m", "train")
    snap = json.loads((run / SNAPSHOT).read_text())
    assert [r["checkpoint_dir_name"] for r in snap["checkpoint_results"]] == names[:2]
    assert snap["latest_checkpoint_result"]["checkpoint_dir_name"] == names[1]
    assert repair(st, "m", "train") is None  # a whole snapshot is left alone


@pytest.mark.ray
def test_a_disk_that_fills_while_a_corpus_is_built_names_the_corpus_folder_in_one_line(ray_session, small_disk):
    """The storage root fills up in the middle of a corpus build (its task data already there): one line names
    the corpus's folder and says what to do, not pyarrow's "Error writing bytes to file"; no corpus looks finished,
    and once the space is freed the same build finishes."""
    from alignlab.platform.corpus.corpus import build_corpus, corpus_finished
    from alignlab.platform.presets import Preset
    from alignlab.platform.runtime.errors import _describe
    from alignlab.platform.storage.root import as_storage
    from alignlab.platform.tasks.task_data import build_tasks

    cfg, root = Preset.named("smoke").corpus, small_disk / "root"
    build_tasks(as_storage(root), max_docs_per_lang=cfg.task_max_docs_per_lang, seed=cfg.seed)
    filler = small_disk / "filler"
    with open(filler, "wb") as f:  # all but 16 KiB: less than the staged documents need
        try:
            while True:
                f.write(b"\0" * 2**20)
                f.flush()
        except OSError:
            pass
    with open(filler, "r+b") as f:
        f.truncate(max(0, filler.stat().st_size - 2**14))
    with pytest.raises(OSError) as err:
        build_corpus(cfg, root, progress=False)
    line = _describe(err.value)  # what the command line prints after "alignlab: error: "
    assert re.match(rf"{root / 'corpus'}/[\w-]+: no space left on the device while corpus [\w-]+ was written here "
                    r"\(\d+\.\d MiB free now\); .* rerun", line), line
    assert "\n" not in line and "Error writing bytes" not in line, line
    cid = line.split(": ")[0].rsplit("/", 1)[1]
    assert not corpus_finished(as_storage(root), cid)
    filler.unlink()
    assert build_corpus(cfg, root, progress=False).name == cid
    assert corpus_finished(as_storage(root), cid)


def test_a_full_disk_is_found_inside_wrapped_errors_and_an_error_whose_cause_is_a_message_is_not_one():
    import errno

    from alignlab.platform.sources.documents import CorpusInputError
    from alignlab.platform.storage.disk_space import DiskFull, full_disk_named, no_space_left

    try:
        try:
            raise OSError("Error writing bytes to file. Detail: [errno 28] No space left on device")
        except OSError as inner:
            raise RuntimeError("a Ray Data task failed") from inner
    except RuntimeError as wrapped:
        assert no_space_left(wrapped)
    bad = CorpusInputError("/x/nope.jsonl", "no such file or directory")  # its `cause` is a message
    assert not no_space_left(bad)
    with pytest.raises(CorpusInputError):  # anything but a full disk goes up as it is
        with full_disk_named("corpus c", "/root/corpus/c", None):
            raise bad
    with pytest.raises(DiskFull) as err:
        with full_disk_named("corpus c", "/root/corpus/c", None):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert str(err.value).startswith("[Errno 28] no space left on the device while corpus c was written here; ")
    assert err.value.filename == "/root/corpus/c"
