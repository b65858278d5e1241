"""A lock object at a remote storage root, so that machines that share only the root (each with its own local
cache) do not build the same artifact id side by side (issue #17).

The lock is the object `<root>/.locks/<what>.lock`, made with the store's conditional create (S3's
`If-None-Match: *`, GCS's `ifGenerationMatch=0`: `conditional_objects`): of two machines creating it,
exactly one succeeds. It names its holder (pid, host, since) and its lease. While the `with` block runs, a
heartbeat thread rewrites it every quarter lease, conditional on its last version. A waiter polls; it takes
over a lock that has not been rewritten for longer than its lease: the holder died or lost the network.
Takeover is one conditional overwrite of the stale version, so of two waiters only one gets it. Release
deletes the object only if it is still the version this holder wrote last.

Age is measured on the store's clock (the response's `Date` minus the object's last write), so machines
whose clocks disagree still agree on when a lease ran out. Schemes without a conditional create here
(`hdfs://`, `abfs://`, ...) get a one-time warning and no lock across machines; the local lock
(`locks.artifact_lock`) still holds. So does a server that ignores the conditions, found by a probe after
the first lock taken at a root.
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
from typing import TYPE_CHECKING, ContextManager, Iterator

from alignlab.platform.storage.conditional_objects import ConditionalObjects, objects_for_root

if TYPE_CHECKING:
    from alignlab.platform.storage.root import Storage

LEASE_ENV = "ALIGNLAB_LOCK_LEASE_S"
DEFAULT_LEASE_S = 120.0
"""A holder that has not renewed its lock for this long is taken for dead; it renews every quarter lease, so
three renewals in a row can be lost to a network hiccup before anyone takes over."""
MIN_LEASE_S = 1.0
MAX_POLL_S = 5.0
"""A waiter looks at the lock at least this often (more often for leases under 20 s)."""

LOCK_PREFIX = ".locks/"
_warned: set[str] = set()  # the schemes or endpoints already warned about, once per process
_stores: dict[tuple, ConditionalObjects | None] = {}
"""One client per root (and client environment), so a server's conditional writes are probed once."""
_CLIENT_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_DEFAULT_REGION",
               "STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS")
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
    which = (storage.uri, *(os.environ.get(k) for k in _CLIENT_ENV))
    if which not in _stores:
        _stores[which] = objects_for_root(storage.uri)
    if _stores[which] is None:
        scheme = storage.uri.split("://", 1)[0].lower()
        _warn_once(scheme, f"warning: no lock across machines for {scheme}:// roots (alignlab takes one only where "
                   "the store offers a conditional create: s3://, gs://); two machines with separate caches may "
                   "build the same id side by side, and the later upload wins")
        return nullcontext()
    key = f"{LOCK_PREFIX}{what}.lock"
    return _held(_stores[which], key, storage.url(key), label or f"[{what}]", progress)


def _warn_once(key: str, line: str) -> None:
    if key not in _warned:
        _warned.add(key)
        print(f"[locks] {line}", flush=True)


class Lease:
    """One holder's lock object: taken by `acquire`, renewed by a heartbeat thread, deleted by `release`."""

    def __init__(self, store: ConditionalObjects, key: str, shown: str, label: str, progress: bool):
        self.store, self.key, self.shown, self.label, self.progress = store, key, shown, label, progress
        self.lease_s = lease_seconds()
        self.since = time.strftime("%Y-%m-%d %H:%M:%S")
        self.token = uuid.uuid4().hex  # tells our versions from a rival's that happens to share pid and host
        self.version: str | None = None
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
        """Take the lock, waiting while a live holder has it; False when the store ignores conditional writes."""
        waited_since = None
        poll = min(MAX_POLL_S, self.lease_s / 4)
        while True:
            self.version = self.store.create(self.key, self.body())
            if self.version is not None:
                break
            seen = self.store.read(self.key)
            if seen is None:  # released between our create and our read: try again
                time.sleep(0.1)
                continue
            holder, version, age_s = seen
            lease_s = _number(holder.get("lease_s"), self.lease_s)
            if age_s > lease_s:
                self.version = self.store.replace(self.key, self.body(), version)
                if self.version is not None:
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
                version = self.store.replace(self.key, self.body(), self.version)
                if version is None:
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
            self.version = version

    def release(self) -> None:
        """Stop renewing and delete the lock, if it is still the version we wrote last."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join()  # a renewal in flight finishes first, so self.version is the last version we wrote
        if self.lost is not None:
            return
        try:
            # The token check first: a server may take a delete's condition and not honour it (fake-gcs-server
            # does so; so do some S3-compatible ones).
            seen = self.store.read(self.key)
            if seen is None or seen[0].get("token") != self.token or not self.store.delete(self.key, self.version):
                self._say(f"the lock {self.shown} was no longer ours at release; left it to its holder")
        except OSError as e:  # never hide the block's own outcome: the lock lapses after its lease
            self._say(f"warning: could not delete the lock {self.shown} ({e}); it lapses after {self.lease_s:g}s",
                      always=True)

    def _say(self, text: str, *, always: bool = False) -> None:
        if self.progress or always:
            print(f"{self.label} {text}", flush=True)


def _number(value, default: float) -> float:
    """A holder record's lease, or `default` for a record that is not ours or not whole (a lease that is not a
    finite positive number would never lapse)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return default
    return value if math.isfinite(value) and value > 0 else default


@contextmanager
def _held(store: ConditionalObjects, key: str, shown: str, label: str, progress: bool) -> Iterator[None]:
    lease = Lease(store, key, shown, label, progress)
    if not lease.acquire():
        _warn_once(store.endpoint, f"warning: the server at {store.endpoint} ignores conditional writes: no lock "
                   "across machines there; two machines with separate caches may build the same id side by side, "
                   "and the later upload wins")
        yield
        return
    try:
        yield
    finally:
        lease.release()
