"""The lock across machines at a remote root (issue #17), against real local servers: S3 (moto's server mode)
and GCS (fake-gcs-server). Processes with separate local caches share only the bucket, as two machines would.
Leases are a few seconds here (`ALIGNLAB_LOCK_LEASE_S`), so a dead holder's lock lapses quickly."""
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
from urllib.parse import quote

import pytest

from alignlab.platform.storage.locks import artifact_lock, lock_path
from alignlab.platform.storage.remote_lock import LEASE_ENV, lease_seconds
from alignlab.platform.storage import remote_lock
from alignlab.platform.storage.root import Storage
from local_cluster import fake_gcs_server, moto_server

PLATFORM = Path(__file__).resolve().parents[1] / "platform"
AWS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}

BUILD = """
import sys, time
from alignlab.platform.storage.locks import build_once
from alignlab.platform.storage.root import MARKER, resolve_root, write_marker

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
from pathlib import Path
from alignlab.platform.storage.locks import artifact_lock
from alignlab.platform.storage.root import Storage

# The Storage made directly: the lock is all this holds (pyarrow's GCS client needs real Google credentials).
with artifact_lock(Storage(sys.argv[1], Path(sys.argv[3])), "model-m", label="[m]"):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


class Bucket:
    """A fresh bucket on a real local server, read and written by the test directly (not through the code
    under test)."""

    def __init__(self, scheme: str, endpoint: str):
        self.scheme, self.endpoint, self.name = scheme, endpoint, f"locks-{uuid.uuid4().hex[:12]}"
        self.uri = f"{scheme}://{self.name}/runs"
        if scheme == "s3":
            import boto3

            self.s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="test",
                                   aws_secret_access_key="test")
            self.s3.create_bucket(Bucket=self.name)
        else:
            import requests

            requests.post(f"{endpoint}/storage/v1/b", json={"name": self.name}, timeout=30).raise_for_status()

    def lock(self, what: str) -> dict | None:
        """The holder record of the lock object `what`, or None when there is none."""
        key = f"runs/.locks/{what}.lock"
        if self.scheme == "s3":
            try:
                return json.loads(self.s3.get_object(Bucket=self.name, Key=key)["Body"].read())
            except self.s3.exceptions.NoSuchKey:
                return None
        import requests

        r = requests.get(f"{self.endpoint}/storage/v1/b/{self.name}/o/{quote(key, safe='')}", params={"alt": "media"},
                         timeout=30)
        return None if r.status_code == 404 else json.loads(r.content)

    def put_lock(self, what: str, record: dict) -> None:
        """Write the lock object `what` unconditionally, as a rival (or a run from long ago) would have."""
        key, body = f"runs/.locks/{what}.lock", json.dumps(record).encode()
        if self.scheme == "s3":
            self.s3.put_object(Bucket=self.name, Key=key, Body=body)
            return
        import requests

        requests.post(f"{self.endpoint}/upload/storage/v1/b/{self.name}/o", params={"uploadType": "media",
                      "name": key}, data=body, timeout=30).raise_for_status()


# The lock's logic is the same on every backend; the default run checks it on S3 (moto), and `-m slow` also on
# Google Cloud Storage's emulator (its conditional create is another request: about 20 s more).
@pytest.fixture(scope="module", params=["s3", pytest.param("gs", marks=pytest.mark.slow)])
def server(request):
    """(scheme, endpoint) of a real local server of that kind, one per module."""
    if request.param == "s3":
        proc, url = moto_server()
        yield "s3", url
        proc.kill()
        proc.wait()
    else:
        gcs = fake_gcs_server()
        yield "gs", gcs.url
        gcs.stop()


@pytest.fixture
def bucket(server, monkeypatch) -> Bucket:
    """A fresh bucket, with this process's environment (and so its subprocesses') pointed at its server."""
    scheme, endpoint = server
    env = {**AWS, "AWS_ENDPOINT_URL": endpoint} if scheme == "s3" else {"STORAGE_EMULATOR_HOST": endpoint}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return Bucket(scheme, endpoint)


def _start(script: str, uri: str, *args: str, cache: Path, **env) -> subprocess.Popen:
    """A process of its own "machine": its own local cache, the shared bucket."""
    env = {**os.environ, "ALIGNLAB_CACHE": str(cache), **env}
    env.pop("ALIGNLAB_DEBUG", None)
    return subprocess.Popen([sys.executable, "-c", script, uri, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)


def _wait_until(predicate, timeout: float, what: str):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if (value := predicate()):
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} after {timeout}s")


# S3 only: the artifact itself goes through pyarrow, whose GCS client waits for real Google credentials.
@pytest.mark.parametrize("server", ["s3"], indirect=True)
def test_two_processes_with_separate_caches_build_an_artifact_at_one_s3_root_once(bucket, tmp_path):
    first = _start(BUILD, bucket.uri, "4", cache=tmp_path / "cache1")
    holder = _wait_until(lambda: bucket.lock("corpus-c1"), 60, "the first process took no remote lock")
    assert holder["pid"] == first.pid and holder["lease_s"] == 120 and holder["expires"] > holder["renewed"]
    second = _start(BUILD, bucket.uri, "4", cache=tmp_path / "cache2")
    out1, _ = first.communicate(timeout=120)
    out2, _ = second.communicate(timeout=120)
    assert first.returncode == 0 and second.returncode == 0, out1 + out2
    assert "building" in out1 and "have True" in out1, out1
    assert f"another run is building it (pid {first.pid} on " in out2, out2
    assert "building\n" not in out2 and "have True" in out2, "the second process built the artifact again"
    assert bucket.lock("corpus-c1") is None, "the lock object was left behind"


def test_a_live_holder_keeps_its_lock_and_a_sigkilled_ones_is_taken_over_once_its_lease_lapses(bucket, tmp_path):
    lease = {LEASE_ENV: "2"}
    holder = _start(HOLD, bucket.uri, "600", str(tmp_path / "cache1"), cache=tmp_path / "cache1", **lease)
    assert holder.stdout.readline().strip() == "held"
    assert bucket.lock("model-m")["pid"] == holder.pid
    waiter = _start(HOLD, bucket.uri, "0", str(tmp_path / "cache2"), cache=tmp_path / "cache2", **lease)
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
    assert bucket.lock("model-m") is None


def test_of_waiters_racing_for_a_stale_lock_one_takes_it_over_and_the_others_wait_their_turn(
        bucket, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(LEASE_ENV, "2")
    bucket.put_lock("model-r", {"holder": "pid 1 on gone-host since yesterday", "pid": 1, "lease_s": 1})
    time.sleep(2.5)  # older than its 1 s lease on the server's clock
    barrier, spans, errors = threading.Barrier(4), [], []

    def contend(i: int) -> None:
        try:
            barrier.wait()
            with artifact_lock(Storage(bucket.uri, tmp_path / f"cache{i}"), "model-r", label=f"[r{i}]"):
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
    assert bucket.lock("model-r") is None


def test_release_leaves_a_lock_that_another_run_took_over_in_place(bucket, tmp_path, capsys):
    rival = {"holder": "pid 7 on elsewhere", "pid": 7, "lease_s": 120, "token": "theirs"}
    with artifact_lock(Storage(bucket.uri, tmp_path / "cache"), "model-t", label="[t]"):
        assert bucket.lock("model-t")["pid"] == os.getpid()
        bucket.put_lock("model-t", rival)
    assert bucket.lock("model-t") == rival, "release deleted a lock that was no longer ours"
    assert "was no longer ours at release; left it to its holder" in capsys.readouterr().out


def test_a_holder_whose_lock_was_taken_over_says_so_at_its_next_renewal_and_leaves_it(
        bucket, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(LEASE_ENV, "2")
    rival = {"holder": "pid 7 on elsewhere", "pid": 7, "lease_s": 2, "token": "theirs"}
    with artifact_lock(Storage(bucket.uri, tmp_path / "cache"), "model-h", label="[h]", progress=False):
        bucket.put_lock("model-h", rival)
        time.sleep(1.2)  # two heartbeats
    out = capsys.readouterr().out
    assert "warning: lost the lock" in out and "to pid 7 on elsewhere" in out, out
    assert bucket.lock("model-h") == rival


def test_the_endpoint_and_credentials_in_the_root_uri_reach_the_lock(server, tmp_path, monkeypatch):
    """As pyarrow reads them: `?endpoint_override=..&scheme=..` (and `KEY:SECRET@` for S3), with no
    environment to fall back on."""
    scheme, endpoint = server
    made = Bucket(scheme, endpoint)
    for k in (*AWS, "AWS_ENDPOINT_URL", "STORAGE_EMULATOR_HOST"):
        monkeypatch.delenv(k, raising=False)
    creds = "test:test@" if scheme == "s3" else ""
    uri = f"{scheme}://{creds}{made.name}/runs?endpoint_override={endpoint.split('://')[1]}&scheme=http"
    with artifact_lock(Storage(uri + ("&region=us-east-1" if scheme == "s3" else ""), tmp_path / "cache"), "corpus-u",
                       progress=False):
        assert made.lock("corpus-u")["pid"] == os.getpid()
    assert made.lock("corpus-u") is None


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
    for p in sorted(PLATFORM.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("build_once", "artifact_lock") \
                    and p.name != "locks.py":
                calls.append((f"{p.name}:{node.lineno}", ast.unparse(node.args[0])))
    assert len(calls) >= 4, calls  # corpus, task data, model, study
    assert not [c for c in calls if c[1].endswith(".local")], f"a lock given a local path, not the Storage: {calls}"
