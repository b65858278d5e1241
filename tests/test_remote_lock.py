"""The lock across machines at a remote root (issue #17), against a real local S3 server (moto's server mode):
processes with separate local caches share only the bucket, as two machines would. Leases are a few seconds
here (`ALIGNLAB_LOCK_LEASE_S`), so a dead holder's lock lapses quickly."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from alignlab.platform import remote_lock
from alignlab.platform.locks import artifact_lock, lock_path
from alignlab.platform.remote_lock import LEASE_ENV, lease_seconds
from alignlab.platform.storage import Storage
from local_cluster import moto_server

PLATFORM = Path(__file__).resolve().parents[1] / "platform"
AWS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}

BUILD = """
import sys, time
from alignlab.platform.locks import build_once
from alignlab.platform.storage import MARKER, resolve_root, write_marker

st, rel = resolve_root(sys.argv[1]), "corpus/c1"

def build():
    print("building", flush=True)
    d = st.local / rel
    d.mkdir(parents=True, exist_ok=True)
    (d / "data.txt").write_text("x" * 1000)
    time.sleep(float(sys.argv[2]))
    write_marker(d)
    st.push(rel, last=(MARKER,))

build_once(st, "corpus-c1", lambda: st.finished(rel) and st.pull(rel, marker=MARKER), build, label="[c1]")
print("have", (st.local / rel / "data.txt").read_text() == "x" * 1000, flush=True)
"""

HOLD = """
import sys, time
from alignlab.platform.locks import artifact_lock
from alignlab.platform.storage import resolve_root

with artifact_lock(resolve_root(sys.argv[1]), "model-m", label="[m]"):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


@pytest.fixture(scope="module")
def endpoint():
    proc, url = moto_server()
    yield url
    proc.kill()
    proc.wait()


@pytest.fixture
def bucket(endpoint, monkeypatch):
    """A fresh bucket on the module's S3 server, with this process's environment pointed at it; (s3 client,
    root URI)."""
    import boto3

    for k, v in {**AWS, "AWS_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(k, v)
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    name = f"locks-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return s3, f"s3://{name}/runs"


def _lock_object(s3, uri: str, what: str) -> dict | None:
    """The holder record of the lock object `what` at the root `uri`, or None when there is none."""
    bucket = uri.split("/")[2]
    try:
        return json.loads(s3.get_object(Bucket=bucket, Key=f"runs/.locks/{what}.lock")["Body"].read())
    except s3.exceptions.NoSuchKey:
        return None


def _start(script: str, uri: str, arg: str, cache: Path, **env) -> subprocess.Popen:
    """A process of its own "machine": its own local cache, the shared bucket."""
    env = {**os.environ, "ALIGNLAB_CACHE": str(cache), **env}
    env.pop("ALIGNLAB_DEBUG", None)
    return subprocess.Popen([sys.executable, "-c", script, uri, arg], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)


def _wait_until(predicate, timeout: float, what: str):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if (value := predicate()):
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} after {timeout}s")


def test_two_processes_with_separate_caches_build_an_artifact_at_one_s3_root_once(bucket, tmp_path):
    s3, uri = bucket
    first = _start(BUILD, uri, "4", tmp_path / "cache1")
    holder = _wait_until(lambda: _lock_object(s3, uri, "corpus-c1"), 60, "the first process took no remote lock")
    assert holder["pid"] == first.pid and holder["lease_s"] == 120 and holder["expires"] > holder["renewed"]
    second = _start(BUILD, uri, "4", tmp_path / "cache2")
    out1, _ = first.communicate(timeout=120)
    out2, _ = second.communicate(timeout=120)
    assert first.returncode == 0 and second.returncode == 0, out1 + out2
    assert "building" in out1 and "have True" in out1, out1
    assert f"another run is building it (pid {first.pid} on " in out2, out2
    assert "building\n" not in out2 and "have True" in out2, "the second process built the artifact again"
    assert _lock_object(s3, uri, "corpus-c1") is None, "the lock object was left behind"


def test_a_live_holder_keeps_its_lock_and_a_sigkilled_ones_is_taken_over_once_its_lease_lapses(bucket, tmp_path):
    s3, uri = bucket
    lease = {LEASE_ENV: "2"}
    holder = _start(HOLD, uri, "600", tmp_path / "cache1", **lease)
    assert holder.stdout.readline().strip() == "held"
    waiter = _start(HOLD, uri, "0", tmp_path / "cache2", **lease)
    time.sleep(7)  # three leases and more: the heartbeat renews the lock every half second
    assert waiter.poll() is None, "the waiter took a lock whose holder is alive: " + waiter.stdout.read()
    holder.kill()
    holder.wait()
    t0 = time.monotonic()
    out, _ = waiter.communicate(timeout=60)
    assert waiter.returncode == 0, out
    assert f"another run is building it (pid {holder.pid} on " in out, out
    assert f"the lock of pid {holder.pid} on " in out and "taking it over" in out and "held" in out, out
    assert time.monotonic() - t0 < 15, "the dead holder's lock was not taken over soon after its lease lapsed"
    assert _lock_object(s3, uri, "model-m") is None


def test_of_waiters_racing_for_a_stale_lock_one_takes_it_over_and_the_others_wait_their_turn(
        bucket, tmp_path, monkeypatch, capsys):
    s3, uri = bucket
    monkeypatch.setenv(LEASE_ENV, "2")
    stale = {"holder": "pid 1 on gone-host since yesterday", "pid": 1, "host": "gone-host", "lease_s": 1}
    s3.put_object(Bucket=uri.split("/")[2], Key="runs/.locks/model-r.lock", Body=json.dumps(stale).encode())
    time.sleep(2.5)  # older than its 1 s lease on the server's clock
    barrier, spans, errors = threading.Barrier(4), [], []

    def contend(i: int) -> None:
        try:
            barrier.wait()
            with artifact_lock(Storage(uri, tmp_path / f"cache{i}"), "model-r", label=f"[r{i}]"):
                start = time.monotonic()
                time.sleep(0.6)
                spans.append((start, time.monotonic()))
        except BaseException as e:  # noqa: BLE001 -- reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(spans) == 4, errors
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), f"two threads held the lock at once: {spans}"
    out = capsys.readouterr().out
    assert out.count("the lock of pid 1 on gone-host since yesterday was not renewed") == 1, out
    assert _lock_object(s3, uri, "model-r") is None


def test_release_leaves_a_lock_that_another_run_took_over_in_place(bucket, tmp_path, capsys):
    s3, uri = bucket
    rival = {"holder": "pid 7 on elsewhere", "pid": 7, "host": "elsewhere", "lease_s": 120, "token": "theirs"}
    with artifact_lock(Storage(uri, tmp_path / "cache"), "model-t", label="[t]"):
        assert _lock_object(s3, uri, "model-t")["pid"] == os.getpid()
        s3.put_object(Bucket=uri.split("/")[2], Key="runs/.locks/model-t.lock", Body=json.dumps(rival).encode())
    assert _lock_object(s3, uri, "model-t") == rival, "release deleted a lock that was no longer ours"
    assert "was no longer ours at release; left it to its holder" in capsys.readouterr().out


def test_a_holder_whose_lock_was_taken_over_says_so_at_its_next_renewal_and_leaves_it(
        bucket, tmp_path, monkeypatch, capsys):
    s3, uri = bucket
    monkeypatch.setenv(LEASE_ENV, "2")
    rival = {"holder": "pid 7 on elsewhere", "pid": 7, "host": "elsewhere", "lease_s": 2, "token": "theirs"}
    with artifact_lock(Storage(uri, tmp_path / "cache"), "model-h", label="[h]", progress=False):
        s3.put_object(Bucket=uri.split("/")[2], Key="runs/.locks/model-h.lock", Body=json.dumps(rival).encode())
        time.sleep(1.2)  # two heartbeats
    assert "warning: lost the lock" in capsys.readouterr().out
    assert _lock_object(s3, uri, "model-h") == rival


def test_credentials_and_endpoint_in_the_root_uri_reach_the_lock(endpoint, tmp_path, monkeypatch):
    import boto3

    for k in (*AWS, "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k, raising=False)
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **{
        "aws_access_key_id": "test", "aws_secret_access_key": "test"})
    s3.create_bucket(Bucket="uri-configured")
    host = endpoint.split("://")[1]
    uri = f"s3://test:test@uri-configured/runs?region=us-east-1&endpoint_override={host}&scheme=http"
    with artifact_lock(Storage(uri, tmp_path / "cache"), "corpus-u", progress=False):
        assert _lock_object(s3, "s3://uri-configured/runs", "corpus-u")["pid"] == os.getpid()
    assert _lock_object(s3, "s3://uri-configured/runs", "corpus-u") is None


def test_a_root_without_a_conditional_create_keeps_the_local_lock_and_warns_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(remote_lock, "_warned", set())
    st = Storage("hdfs://namenode:8020/runs", tmp_path / "cache")  # no conditional create here; never contacted
    for _ in range(2):
        with artifact_lock(st, "corpus-h", progress=False):
            assert lock_path(st.local, "corpus-h").read_text().startswith(f"pid {os.getpid()} on ")
    out = capsys.readouterr().out
    assert out.count("warning: no lock across machines for hdfs:// roots") == 1, out


@pytest.mark.parametrize("text", ["0", "-5", "nan", "two minutes"])
def test_a_bad_lease_is_refused_naming_the_variable_and_the_value(text, monkeypatch):
    monkeypatch.setenv(LEASE_ENV, text)
    with pytest.raises(ValueError, match=f"{LEASE_ENV}: must be a number of seconds >= 1, got '{text}'"):
        lease_seconds()


def test_every_lock_the_engine_takes_is_given_the_storage_so_remote_roots_are_locked_across_machines():
    """A call site that passes `st.local` (a path) would take only this machine's lock."""
    calls = []
    for p in sorted(PLATFORM.glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("build_once", "artifact_lock") \
                    and p.name != "locks.py":
                calls.append((f"{p.name}:{node.lineno}", ast.unparse(node.args[0])))
    assert len(calls) >= 4, calls  # corpus, task data, model, study
    assert not [c for c in calls if c[1].endswith(".local")], f"a lock given a local path, not the Storage: {calls}"
