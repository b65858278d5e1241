"""A lock object at a remote storage root, so that machines that share only the root (each with its own local
cache) do not build the same artifact id side by side (issue #17).

The lock is the object `<root>/.locks/<what>.lock`, made with the store's conditional create (S3's
`PutObject` with `If-None-Match: *`): of two machines creating it, exactly one succeeds. It names its holder
(pid, host, since) and its lease. While the `with` block runs, a heartbeat thread rewrites it every quarter
lease, conditional on its last version (`If-Match: <ETag>`). A waiter polls; it takes over a lock that has
not been rewritten for longer than its lease: the holder died or lost the network. Takeover is one
conditional overwrite of the stale version, so of two waiters only one gets it. Release deletes the object
only if it is still the version this holder wrote last.

Age is measured on the store's clock (the response's `Date` minus the object's `Last-Modified`), so machines
whose clocks disagree still agree on when a lease ran out. Schemes without a conditional create here
(`gs://`, `hdfs://`, `abfs://`, ...) get a one-time warning and no cross-machine lock; the local lock
(`locks.artifact_lock`) still holds. So does an S3-compatible server that ignores `If-None-Match`, found
by a second conditional create of the lock just taken, which must fail.
"""
from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager, nullcontext
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, ContextManager, Iterator
from urllib.parse import parse_qs, unquote, urlsplit

if TYPE_CHECKING:
    from alignlab.platform.storage import Storage

LEASE_ENV = "ALIGNLAB_LOCK_LEASE_S"
DEFAULT_LEASE_S = 120.0
"""A holder that has not renewed its lock for this long is taken for dead; it renews every quarter lease, so
three renewals in a row can be lost to a network hiccup before anyone takes over."""
MIN_LEASE_S = 1.0
MAX_POLL_S = 5.0
"""A waiter looks at the lock at least this often (more often for leases under 20 s)."""

LOCK_PREFIX = ".locks/"
_warned: set[str] = set()  # the schemes or S3 endpoints already warned about, once per process
_stores: dict[tuple, "S3Objects"] = {}  # one client per root, so the server's conditional writes are probed once
_CLIENT_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_DEFAULT_REGION")
"""The environment a client is made from: a root's client is made again when one of these changes."""


def lease_seconds() -> float:
    """The lease of the locks this process takes: `ALIGNLAB_LOCK_LEASE_S`, or 2 minutes."""
    text = os.environ.get(LEASE_ENV, "").strip()
    if not text:
        return DEFAULT_LEASE_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < MIN_LEASE_S:
        raise ValueError(f"{LEASE_ENV}: must be a number of seconds >= {MIN_LEASE_S:g}, got {text!r}")
    return value


def remote_lock(storage: "Storage", what: str, *, label: str = "", progress: bool = True) -> ContextManager[None]:
    """Hold the remote lock of artifact `what` at `storage`'s root for the `with` block (nothing for a local
    root; a one-time warning and nothing for a scheme without a conditional create)."""
    if not storage.remote:
        return nullcontext()
    scheme = storage.uri.split("://", 1)[0].lower()
    if scheme != "s3":
        _warn_once(scheme, f"warning: no lock across machines for {scheme}:// roots (alignlab takes one only where "
                   "the store offers a conditional create: s3://); two machines with separate caches may build the "
                   "same id side by side, and the later upload wins")
        return nullcontext()
    which = (storage.uri, *(os.environ.get(k) for k in _CLIENT_ENV))
    if which not in _stores:
        _stores[which] = S3Objects.for_root(storage.uri)
    key = f"{LOCK_PREFIX}{what}.lock"
    return _held(_stores[which], key, storage.url(key), label or f"[{what}]", progress)


def _warn_once(key: str, line: str) -> None:
    if key not in _warned:
        _warned.add(key)
        print(f"[locks] {line}", flush=True)


class Lease:
    """One holder's lock object: taken by `acquire`, renewed by a heartbeat thread, deleted by `release`."""

    def __init__(self, store: "S3Objects", key: str, shown: str, label: str, progress: bool):
        self.store, self.key, self.shown, self.label, self.progress = store, key, shown, label, progress
        self.lease_s = lease_seconds()
        self.since = time.strftime("%Y-%m-%d %H:%M:%S")
        self.token = uuid.uuid4().hex  # tells our versions from a rival's that happens to share pid and host
        self.etag: str | None = None
        self.lost: str | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def body(self) -> bytes:
        now = time.time()
        return json.dumps({"holder": f"pid {os.getpid()} on {socket.gethostname()} since {self.since}",
                           "pid": os.getpid(), "host": socket.gethostname(), "since": self.since,
                           "renewed": now, "lease_s": self.lease_s, "expires": now + self.lease_s,
                           "token": self.token}).encode()

    def acquire(self) -> bool:
        """Take the lock, waiting while a live holder has it; False when the store ignores conditional creates."""
        waited_since = None
        poll = min(MAX_POLL_S, self.lease_s / 4)
        while True:
            self.etag = self.store.create(self.key, self.body())
            if self.etag is not None:
                break
            seen = self.store.read(self.key)
            if seen is None:  # released between our create and our read: try again at once
                continue
            holder, etag, age_s = seen
            lease_s = _number(holder.get("lease_s"), self.lease_s)
            if age_s > lease_s:
                self.etag = self.store.replace(self.key, self.body(), etag)
                if self.etag is not None:
                    self._say(f"the lock of {holder.get('holder', 'another run')} was not renewed for {age_s:.0f}s "
                              f"(lease {lease_s:g}s): its holder died or lost the network; taking it over")
                    waited_since = None
                    break
                continue  # another waiter took it over first, or its holder renewed it just now
            if waited_since is None:
                waited_since = time.monotonic()
                self._say(f"another run is building it ({holder.get('holder', 'another process')}, lock "
                          f"{self.shown}); waiting for it to finish")
            time.sleep(poll)
        if not self.store.honours_conditions(self.key, self.body()):
            self.store.delete(self.key, None)
            return False
        if waited_since is not None:
            self._say(f"the other run let go after {time.monotonic() - waited_since:.0f}s")
        self._beat = threading.Thread(target=self._heartbeat, name=f"lock-heartbeat {self.key}", daemon=True)
        self._beat.start()
        return True

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.lease_s / 4):
            try:
                etag = self.store.replace(self.key, self.body(), self.etag)
                if etag is None:
                    seen = self.store.read(self.key)
                    self.lost = seen[0].get("holder", "another run") if seen else "nobody (it was deleted)"
            except OSError as e:  # the store is out of reach: the next beat tries again, within the lease
                self._say(f"warning: could not renew the lock {self.shown} ({e}); retrying", always=True)
                continue
            if self.lost is not None:
                self._say(f"warning: lost the lock {self.shown} to {self.lost} (its lease lapsed between two "
                          "renewals); this run goes on, and the same artifact may be built twice (the later "
                          "upload wins)", always=True)
                return
            self.etag = etag

    def release(self) -> None:
        """Stop renewing and delete the lock, if it is still the version we wrote last."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join()  # a renewal in flight finishes first, so self.etag is the last version we wrote
        if self.lost is not None:
            return
        try:
            # The token check first: an S3-compatible server may take If-Match on a delete and not honour it.
            seen = self.store.read(self.key)
            if seen is None or seen[0].get("token") != self.token or not self.store.delete(self.key, self.etag):
                self._say(f"the lock {self.shown} was no longer ours at release; left it to its holder")
        except OSError as e:  # never hide the block's own outcome: the lock lapses after its lease
            self._say(f"warning: could not delete the lock {self.shown} ({e}); it lapses after {self.lease_s:g}s",
                      always=True)

    def _say(self, text: str, *, always: bool = False) -> None:
        if self.progress or always:
            print(f"{self.label} {text}", flush=True)


def _number(value, default: float) -> float:
    """A holder record's lease, or `default` for a record that is not ours or not whole."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


@contextmanager
def _held(store: "S3Objects", key: str, shown: str, label: str, progress: bool) -> Iterator[None]:
    lease = Lease(store, key, shown, label, progress)
    if not lease.acquire():
        _warn_once(f"s3 {store.endpoint}", f"warning: the S3 server at {store.endpoint} ignores conditional "
                   "writes (If-None-Match, If-Match): no lock across machines there; two machines with separate caches "
                   "may build the same id side by side, and the later upload wins")
        yield
        return
    try:
        yield
    finally:
        lease.release()


class S3Objects:
    """The few conditional object operations the lock needs, on one bucket and key prefix (boto3: pyarrow's
    S3FileSystem has no conditional writes). Conditions that fail answer None/False; other errors raise
    OSError naming the object."""

    def __init__(self, client, bucket: str, prefix: str, endpoint: str, shown_root: str):
        self.client, self.bucket, self.prefix, self.endpoint, self.shown_root = \
            client, bucket, prefix, endpoint, shown_root
        self._honoured = False

    @classmethod
    def for_root(cls, uri: str) -> "S3Objects":
        """The bucket and prefix of the root `s3://[KEY:SECRET@]bucket/prefix[?region=..&endpoint_override=..
        &scheme=..]`, with the credentials and endpoint pyarrow would take from the same URI or, failing
        that, the environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...)."""
        from alignlab.platform.storage import redact

        try:
            import boto3
        except ImportError:
            raise ValueError(redact(f"storage root {uri}: the lock across machines needs boto3 "
                                    "(pip install 'boto3>=1.40')")) from None
        parts = urlsplit(uri)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        endpoint = query.get("endpoint_override")
        if endpoint and "://" not in endpoint:
            endpoint = f"{query.get('scheme', 'https')}://{endpoint}"
        kwargs = {"region_name": query.get("region"), "endpoint_url": endpoint}
        if parts.username:
            kwargs.update(aws_access_key_id=unquote(parts.username),
                          aws_secret_access_key=unquote(parts.password or ""))
        client = boto3.session.Session().client("s3", **{k: v for k, v in kwargs.items() if v is not None})
        return cls(client, parts.hostname or "", parts.path.strip("/"), client.meta.endpoint_url, redact(uri))

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, op: str, key: str, **kw):
        """`op` on `key`; the HTTP status of a failed condition or a missing object, else the response."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client, op)(Bucket=self.bucket, Key=self._key(key), **kw)
        except ClientError as e:
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status in (404, 409, 412):  # missing; a concurrent conditional write (retry); a failed condition
                return status
            raise OSError(f"{self.shown_root}/{key}: {op} failed ({e.response.get('Error', {}).get('Code')}: "
                          f"{e.response.get('Error', {}).get('Message')})") from None
        except BotoCoreError as e:
            raise OSError(f"{self.shown_root}/{key}: {op} failed ({e})") from None

    def create(self, key: str, body: bytes) -> str | None:
        """Create `key` unless it exists; its ETag, or None."""
        r = self._call("put_object", key, Body=body, IfNoneMatch="*")
        return None if isinstance(r, int) else r["ETag"]

    def replace(self, key: str, body: bytes, etag: str) -> str | None:
        """Overwrite `key` if it is still the version `etag`; the new ETag, or None."""
        r = self._call("put_object", key, Body=body, IfMatch=etag)
        return None if isinstance(r, int) else r["ETag"]

    def read(self, key: str) -> tuple[dict, str, float] | None:
        """(holder record, ETag, seconds since it was written, on the store's clock), or None if absent."""
        r = self._call("get_object", key)
        if isinstance(r, int):
            return None
        try:
            holder = json.loads(r["Body"].read())
        except ValueError:  # not ours, or cut short: its age still tells when it may be taken over
            holder = {}
        date = r.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        now = parsedate_to_datetime(date) if date else datetime.now(timezone.utc)
        return (holder if isinstance(holder, dict) else {}), r["ETag"], (now - r["LastModified"]).total_seconds()

    def delete(self, key: str, etag: str | None) -> bool:
        """Delete `key` if it is still the version `etag` (any version for None); False if it is not."""
        return self._call("delete_object", key, **({"IfMatch": etag} if etag else {})) not in (409, 412)

    def honours_conditions(self, key: str, body: bytes) -> bool:
        """Does the server refuse a second conditional create of `key` (which exists: we just made it) and an
        overwrite of it conditional on a version it never had? A server that ignores If-None-Match would let
        every machine take the lock, one that ignores If-Match every waiter take over a stale one. Asked once
        per root and process, after the first lock taken there."""
        if not self._honoured:
            self._honoured = self.create(key, body) is None and self.replace(key, body, f'"{"0" * 32}"') is None
        return self._honoured
