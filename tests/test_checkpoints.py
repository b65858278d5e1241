"""Checkpoints that do not stall the run (issue #56): Ray Train uploads them in the background
(`CheckpointUploadMode.ASYNC`), a run also checkpoints every `PretrainConfig.checkpoint_every_minutes` (a runtime
field: the model id does not move), and a local storage root that some node of a multi-node cluster does not see is
refused in one line before anything is trained."""
from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fault_hooks import CrashOnce, Each, Probe, registered

from alignlab.platform.presets import Preset

# Checkpoints by steps only at the last step: whatever else is checkpointed is the minutes' doing.
SMOKE = dataclasses.replace(Preset.named("smoke").pretrain, objectives="mlm", max_steps=6, checkpoint_every=100,
                            log_every=1, cpus_per_worker=0.25, threads_per_worker=1, precision="fp32")


def test_checkpoint_every_minutes_is_a_runtime_field_and_refuses_a_negative_interval():
    from alignlab.platform.config import to_dict
    from alignlab.platform.pretrain.models import model_id

    timed = dataclasses.replace(SMOKE, checkpoint_every_minutes=30.0)
    assert model_id("c1", timed) == model_id("c1", SMOKE)
    assert "checkpoint_every_minutes" not in to_dict(SMOKE)  # omitted at its default: old configs read the same
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="checkpoint_every_minutes must be a finite number >= 0"):
            dataclasses.replace(SMOKE, checkpoint_every_minutes=bad)


def test_the_loop_checkpoints_when_the_minutes_are_up_and_asks_every_rank(tmp_path):
    from tiny_model import batches, tiny_tokenizer

    from alignlab.platform.pretrain.loop import train_loop
    from alignlab.platform.pretrain.pretrain import Pretrainer

    tok = tiny_tokenizer(tmp_path / "tok")
    data = batches(tok)

    def run(cfg, any_rank=lambda flag: flag):
        reports = []
        train_loop(Pretrainer(cfg, tok), lambda epoch: iter(data), report=lambda m, ck: reports.append((m["step"], ck)),
                   log_every=2, any_rank=any_rank)
        return [step for step, ck in reports if ck]

    assert run(dataclasses.replace(SMOKE, checkpoint_every=4)) == [4, 6]  # by steps
    asked = []
    # A due time at every reporting step (0.01 s), and ranks that agree: only at the steps that report (2, 4 and
    # 6; 6 is the last step, checkpointed anyway), every rank is asked.
    assert run(dataclasses.replace(SMOKE, checkpoint_every_minutes=1e-9),
               any_rank=lambda flag: asked.append(flag) or flag) == [2, 4, 6]
    assert asked == [True, True]
    # A rank whose clock is not due yet still checkpoints with the others when one of them is.
    assert run(dataclasses.replace(SMOKE, checkpoint_every_minutes=60.0), any_rank=lambda flag: True) == [2, 4, 6]
    assert run(dataclasses.replace(SMOKE, checkpoint_every_minutes=60.0)) == [6]


# -m slow (~40 s): the default run checks when the loop takes a minutes' checkpoint (above) and a killed run's exact
# resume from a checkpoint uploaded in the background (test_pretrain.py, test_data_parallel.py: every checkpoint is).
@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(900)
def test_a_killed_run_resumes_from_a_checkpoint_taken_by_the_minute_and_uploaded_in_the_background(
        smoke_corpus, smoke_model, smoke_model_cfg, tmp_path):
    """No step-based checkpoint before the last step; the minutes' checkpoints (due at every step) are uploaded by
    Ray Train's upload thread while the run goes on. Rank 0 dies after step 4: the run resumes from one of them and
    ends with the weights of the run that never stopped (the session's `smoke_model`, conftest.py), under the same
    model id."""
    from alignlab.platform.pretrain.driver import pretrain

    straight = smoke_model
    timed = dataclasses.replace(smoke_model_cfg, checkpoint_every=100, checkpoint_every_minutes=1e-9)
    out = tmp_path / "probe"
    out.mkdir()
    hook = registered(Each(Probe(str(out)), CrashOnce(4)))
    resumed = pretrain(smoke_corpus, timed, tmp_path / "killed", max_failures=1, after_step=hook)
    assert resumed.name == straight.name  # the minutes are a runtime field
    assert (resumed / ".crashed-once").exists()
    steps = [json.loads(line)["step"] for line in (out / "rank0.jsonl").read_text().splitlines()]
    # Resumed from one of the minutes' checkpoints (steps 1-3), not from the start. Which one depends on how many
    # of them the controller had registered when the worker died: it takes one report per poll (about every 2 s),
    # and an upload counts once it is registered.
    first, again = steps[:4], steps[4:]
    assert first == [1, 2, 3, 4] and 2 <= again[0] <= 4 and again == list(range(again[0], timed.max_steps + 1)), steps
    a, b = (torch.load(m / "final" / "model.pt", weights_only=True) for m in (straight, resumed))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # The kept checkpoint uploaded whole.
    kept = sorted(c for c in (resumed / "ray" / "train").glob("checkpoint_*") if c.is_dir())
    assert kept and all((c / "state.pt").stat().st_size > 0 for c in kept)


def _can_hide_a_folder_from_a_node() -> str | None:
    """Why the multi-node test cannot run here, or None: it needs `unshare` and `mount` (root)."""
    if not (shutil.which("unshare") and shutil.which("mount")):
        return "needs unshare and mount"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs tmpfs /mnt && umount /mnt"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"cannot mount in a namespace of its own: {probe.stderr.strip()}"


@pytest.mark.ray
@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_a_multi_node_cluster_refuses_a_local_root_one_of_its_nodes_does_not_see_in_one_line(tmp_path):
    """A head and a second node on this machine. The second node's processes live in a mount namespace of their
    own with an empty tmpfs over the root's folder: what a node of another machine sees of this machine's disk.
    `alignlab pretrain` is refused in one line before the corpus is built or anything trained; a root both nodes
    see passes the same check."""
    import psutil
    from local_cluster import RAY, LocalCluster, wait_for

    if why := _can_hide_a_folder_from_a_node():
        pytest.skip(why)
    local_disk, shared = tmp_path / "this-machine-only", tmp_path / "shared"
    local_disk.mkdir(), shared.mkdir()
    node = None
    with LocalCluster(num_cpus=2) as cluster:
        try:
            node = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                 f"mount -t tmpfs tmpfs {local_disk} && exec {RAY} start --address={cluster.address} --num-cpus=1 "
                 "--node-ip-address=127.0.0.1 --block"],
                env=cluster.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            assert wait_for(lambda: len(cluster.alive_nodes()) == 2, timeout=120), "the second node never joined"
            alignlab = str(Path(sys.executable).with_name("alignlab"))
            run = subprocess.run([alignlab, "pretrain", "--preset", "smoke", "--objectives", "mlm", "--storage",
                                  str(local_disk / "root")], env=cluster.driver_env(), capture_output=True, text=True,
                                 timeout=300)
            lines = [ln for ln in run.stderr.splitlines() if ln.startswith("alignlab:")]
            assert run.returncode == 2 and len(lines) == 1, run.stdout[-2000:] + run.stderr[-3000:]
            assert lines[0].startswith(f"alignlab: error: storage root {local_disk / 'root'} is a folder that 1 of "
                                       "the cluster's 2 nodes do not see"), lines[0]
            assert "s3://" in lines[0] and not (local_disk / "root" / "corpus").exists()
            ok = cluster.ask(f"check_root_on_every_node(as_storage({str(shared / 'root')!r})) is None",
                             imports="import ray; from alignlab.platform.runtime.resources import check_root_on_every_node; "
                                     "from alignlab.platform.storage.root import as_storage")
            assert ok is True
        finally:
            if node is not None:
                procs = [node] + psutil.Process(node.pid).children(recursive=True) if node.poll() is None else []
                for p in procs:
                    try:
                        p.kill()
                    except psutil.NoSuchProcess:
                        pass
