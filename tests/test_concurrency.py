"""Two runs of the same artifact at one root (issue #17): the second waits for the first's lock, then reuses
what the first finished -- one build, one Train run, no half-written folder, both exit 0. Through the real
command line, each run with its own local Ray instance, as two users' shells would be."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from alignlab.platform.storage.locks import LOCK_DIR, artifact_lock, lock_path
from alignlab.platform.storage.root import as_storage
from local_cluster import moto_server

REPO = Path(__file__).resolve().parents[1]
ALIGNLAB = [sys.executable, "-m", "alignlab.platform.cli"]


def _start(cmd: list[str], cwd: Path, **extra_env: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("ALIGNLAB_DEBUG", "RAY_ADDRESS")} | extra_env
    return subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _wait_for_holder(root: Path, prefix: str, proc: subprocess.Popen, timeout: float = 300) -> Path:
    """The lock file of the artifact `prefix-*` once `proc` holds it (its pid is written in it)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        for f in (root / LOCK_DIR).glob(f"{prefix}-*.lock") if (root / LOCK_DIR).exists() else []:
            if f.read_text().startswith(f"pid {proc.pid} "):
                return f
        time.sleep(0.2)
    raise AssertionError(f"no {prefix} lock held by pid {proc.pid} after {timeout}s")


def _finish(proc: subprocess.Popen, timeout: float = 600) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-3000:]
    return out


def test_a_lock_is_held_for_the_block_names_its_holder_and_is_free_after_it(tmp_path):
    with artifact_lock(as_storage(tmp_path), "corpus-x", progress=False):
        assert lock_path(tmp_path, "corpus-x").read_text().startswith(f"pid {os.getpid()} on ")
    assert lock_path(tmp_path, "corpus-x").read_text() == ""
    with artifact_lock(as_storage(tmp_path), "corpus-x", progress=False):  # taken again at once
        pass


def test_a_second_process_waits_for_the_lock_and_takes_it_when_the_holder_is_killed(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from alignlab.platform.storage.locks import artifact_lock\n"
                               "from alignlab.platform.storage.root import as_storage\n"
                               "with artifact_lock(as_storage(sys.argv[1]), 'model-m', progress=False): "
                               "print('held', flush=True); time.sleep(600)", str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    waiter = _start([sys.executable, "-c", "import sys; from alignlab.platform.storage.locks import artifact_lock\n"
                     "from alignlab.platform.storage.root import as_storage\n"
                     "with artifact_lock(as_storage(sys.argv[1]), 'model-m'): print('got it', flush=True)", str(tmp_path)], tmp_path)
    time.sleep(2)
    assert waiter.poll() is None, "the second process did not wait for the lock"
    holder.kill()  # a SIGKILLed holder leaves no stale lock: the kernel drops it
    holder.wait()
    out = _finish(waiter, timeout=60)
    assert f"another run is building it (pid {holder.pid} on " in out and "got it" in out, out


def test_a_build_killed_midway_leaves_temporaries_that_the_next_build_of_the_same_id_deletes_first(tmp_path, capsys):
    """SIGKILL skips every `finally`: a build's temporary folder (named after the dead pid) stays. The next build of
    that id deletes it under the lock, before building; another id's temporaries and finished folders stay."""
    from alignlab.platform.storage.locks import build_once

    dead = tmp_path / "corpus" / "c1.tmp-99999"
    (dead / "shards").mkdir(parents=True)
    (dead / "shards" / "part-0.parquet").write_bytes(b"half")
    (tmp_path / "models" / "m1" / "final.k2j3x").mkdir(parents=True)
    other = tmp_path / "corpus" / "c2.tmp-12345"
    other.mkdir()
    (tmp_path / "models" / "m1" / "final").mkdir()
    built = []
    build_once(as_storage(tmp_path), "corpus-c1", lambda: bool(built), lambda: built.append(1),
               leftovers=("corpus/c1.tmp-*", "models/m1/final.*"))
    assert built == [1]
    assert not dead.exists() and not (tmp_path / "models" / "m1" / "final.k2j3x").exists()
    assert other.exists() and (tmp_path / "models" / "m1" / "final").exists()
    assert "removed 2 leftover(s) of an interrupted build" in capsys.readouterr().out
    build_once(as_storage(tmp_path), "corpus-c1", lambda: bool(built), lambda: built.append(2), leftovers=("corpus/c2.tmp-*",))
    assert built == [1] and other.exists()  # finished: nothing is built and nothing deleted


# -m slow (~30 s): two whole `alignlab corpus build` processes. The default run checks the lock they meet at
# (`test_a_second_process_waits_for_the_lock_and_takes_it_when_the_holder_is_killed`, below) and two processes building
# one artifact at an S3 root (test_remote_lock.py).
@pytest.mark.slow
@pytest.mark.ray
def test_two_concurrent_builds_of_one_corpus_build_it_once_and_both_use_it(tmp_path):
    root = tmp_path / "st"
    cmd = ALIGNLAB + ["corpus", "build", "--preset", "smoke", "--storage", str(root)]
    first = _start(cmd, tmp_path)
    lock = _wait_for_holder(root, "corpus", first)
    second = _start(cmd, tmp_path)
    out1, out2 = _finish(first), _finish(second)
    cid = lock.name[len("corpus-"):-len(".lock")]
    assert "another run is building it" in out2 and "labelled" not in out2, out2
    assert "labelled" in out1, out1
    assert [p.name for p in (root / "corpus").iterdir()] == [cid], "a temporary or second corpus folder was left"
    assert (root / "corpus" / cid / "manifest.json").exists()
    assert cid in out1 and cid in out2


# -m slow (~29 s): a model and a corpus are built once through the same `locks.build_once`; the default suite runs
# the lock's waiting and take-over (below) and two processes building one artifact at an S3 root
# (test_remote_lock.py).
@pytest.mark.slow
@pytest.mark.ray
def test_two_concurrent_pretrainings_of_one_model_id_train_it_once_and_both_return_it(smoke_corpus, tmp_path):
    root = tmp_path / "st"
    # The session's smoke corpus, given as a folder: the two runs meet at the model's lock, not the corpus's
    # (two concurrent corpus builds are the test above).
    cmd = ALIGNLAB + ["pretrain", "--preset", "smoke", "--storage", str(root), "--max-steps", "6",
                      "--corpus", str(smoke_corpus)]
    first = _start(cmd, tmp_path)
    lock = _wait_for_holder(root, "model", first)
    second = _start(cmd, tmp_path)
    out1, out2 = _finish(first), _finish(second)
    mid = lock.name[len("model-"):-len(".lock")]
    assert "another run is building it" in out2, out2
    assert f"[pretrain {mid}] precision" in out1 and f"[pretrain {mid}] precision" not in out2, out2
    assert [p.name for p in (root / "models").iterdir()] == [mid]
    assert (root / "models" / mid / "final" / "model.pt").exists()
    assert [p.name for p in (root / "models" / mid / "ray").iterdir()] == ["train"], "a second Train run was started"
    assert mid in out2


# -m slow (~18 s): its parts run in the default suite, faster -- two processes with caches of their own build one
# artifact at one S3 root once (test_remote_lock.py), and two concurrent corpus builds build it once (above).
@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.cluster
def test_two_machines_sharing_only_an_s3_root_build_one_corpus_once(tmp_path):
    """As two machines would: each run has its own local cache (`ALIGNLAB_CACHE`) and its own Ray; they share
    only the bucket, so only the lock object at the root (`remote_lock`) can make the second wait."""
    import boto3

    proc, endpoint = moto_server()
    try:
        aws = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_ENDPOINT_URL": endpoint}
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="test",
                          aws_secret_access_key="test")
        s3.create_bucket(Bucket="alignlab-test")
        cmd = ALIGNLAB + ["corpus", "build", "--preset", "smoke", "--storage", "s3://alignlab-test/runs"]
        first = _start(cmd, tmp_path, ALIGNLAB_CACHE=str(tmp_path / "cache1"), **aws)

        def lock_of_first():
            assert first.poll() is None, first.stdout.read()[-3000:]
            for o in s3.list_objects_v2(Bucket="alignlab-test", Prefix="runs/.locks/corpus-").get("Contents", []):
                body = s3.get_object(Bucket="alignlab-test", Key=o["Key"])["Body"].read()
                if json.loads(body)["pid"] == first.pid:
                    return o["Key"]

        t0 = time.monotonic()
        while (key := lock_of_first()) is None:
            assert time.monotonic() - t0 < 300, "the first run took no lock at the root"
            time.sleep(0.2)
        second = _start(cmd, tmp_path, ALIGNLAB_CACHE=str(tmp_path / "cache2"), **aws)
        out1, out2 = _finish(first), _finish(second)
        cid = key[len("runs/.locks/corpus-"):-len(".lock")]
        assert f"another run is building it (pid {first.pid} on " in out2 and "labelled" not in out2, out2
        assert "labelled" in out1, out1
        keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket="alignlab-test")
                for o in page.get("Contents", []) if not o["Key"].endswith("/")]  # not folder markers
        assert {k.split("/")[2] for k in keys if k.startswith("runs/corpus/")} == {cid}, keys
        assert not [k for k in keys if k.startswith("runs/.locks/")], "a lock object was left at the root"
        assert cid in out1 and cid in out2
        assert list((tmp_path / "cache2").glob(f"s3-*/corpus/{cid}/manifest.json")), "the second run did not pull it"
    finally:
        proc.kill()
        proc.wait()
