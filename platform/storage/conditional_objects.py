"""The few conditional object operations a lock at a remote root needs (`remote_lock`), for the stores that
offer them: S3 (`If-None-Match: *` to create, `If-Match: <ETag>` to overwrite or delete one version) and GCS
(`ifGenerationMatch=0` to create, `ifGenerationMatch=<generation>` otherwise). pyarrow's filesystems, which
do the rest of the storage I/O, have no conditional writes, so these go through boto3 and google-auth.

A version is an S3 ETag or a GCS generation, as a string. A condition that fails answers None or False;
any other error raises OSError naming the object, without credentials.
"""
from __future__ import annotations

import json
import os
import uuid
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from urllib.parse import parse_qs, quote, unquote, urlsplit

from alignlab.platform.storage.root import redact

NOT_FOUND, CONFLICT, PRECONDITION_FAILED = 404, 409, 412
"""Answers that are not errors: a missing object; a concurrent conditional write (S3: try again); a failed
condition."""


class ConditionalObjects:
    """The objects under one bucket and key prefix; subclasses give the store's four operations."""

    never: str = ""
    """A version no object ever has, for the probe."""

    def __init__(self, client, bucket: str, prefix: str, endpoint: str, shown_root: str):
        """`client`: the store's client (a boto3 S3 client, a requests session)."""
        self.client, self.bucket, self.prefix, self.endpoint, self.shown_root = \
            client, bucket, prefix, endpoint, shown_root
        self._honoured = False

    def create(self, key: str, body: bytes) -> str | None:
        """Create `key` unless it exists; its version, or None."""
        raise NotImplementedError

    def replace(self, key: str, body: bytes, version: str) -> str | None:
        """Overwrite `key` if it is still at `version`; the new version, or None."""
        raise NotImplementedError

    def read(self, key: str) -> tuple[dict, str, float] | None:
        """(holder record, version, seconds since it was written on the store's clock), or None if absent."""
        raise NotImplementedError

    def delete(self, key: str, version: str | None) -> bool:
        """Delete `key` if it is still at `version` (any version for None); False if it is not."""
        raise NotImplementedError

    def honours_conditions(self, key: str, body: bytes) -> bool:
        """Does the server refuse a second conditional create of `key` (which exists: the caller just made it)
        and an overwrite of it conditional on a version it never had? A server that ignored the first would let
        every machine take the lock, one that ignored the second every waiter take over a stale one. Asked once
        per root and process, after the first lock taken there."""
        if not self._honoured:
            self._honoured = self.create(key, body) is None and self.replace(key, body, self.never) is None
        return self._honoured

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _failed(self, key: str, op: str, why: object) -> OSError:
        return OSError(redact(f"{self.shown_root}/{key}: {op} failed ({why})"))


def objects_for_root(uri: str) -> ConditionalObjects | None:
    """The conditional operations of the remote root `uri`, or None when its scheme has none here."""
    scheme = uri.split("://", 1)[0].lower()
    kind = {"s3": S3Objects, "gs": GcsObjects, "gcs": GcsObjects}.get(scheme)
    return kind.for_root(uri) if kind else None


def _root_parts(uri: str) -> tuple:
    """(urlsplit parts, query as a dict, endpoint URL from `?endpoint_override=..&scheme=..` or None)."""
    parts = urlsplit(uri)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    endpoint = query.get("endpoint_override")
    if endpoint and "://" not in endpoint:
        endpoint = f"{query.get('scheme', 'https')}://{endpoint}"
    return parts, query, endpoint


def _holder(raw: bytes) -> dict:
    try:
        holder = json.loads(raw)
    except ValueError:  # not ours, or cut short: its age still tells when it may be taken over
        return {}
    return holder if isinstance(holder, dict) else {}


def _age_s(date_header: str | None, written: datetime) -> float:
    now = parsedate_to_datetime(date_header) if date_header else datetime.now(timezone.utc)
    return (now - written).total_seconds()


class S3Objects(ConditionalObjects):
    """S3 through boto3, with the credentials and endpoint pyarrow would take from the same root URI
    (`s3://[KEY:SECRET@]bucket/prefix[?region=..&endpoint_override=..&scheme=..]`) or, failing that, the
    environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...)."""

    never = f'"{"0" * 32}"'

    @classmethod
    def for_root(cls, uri: str) -> "S3Objects":
        try:
            import boto3
        except ImportError:
            raise ValueError(redact(f"storage root {uri}: the lock across machines needs boto3 "
                                    "(pip install 'boto3>=1.40')")) from None
        parts, query, endpoint = _root_parts(uri)
        kwargs = {"region_name": query.get("region"), "endpoint_url": endpoint}
        if parts.username:
            kwargs.update(aws_access_key_id=unquote(parts.username),
                          aws_secret_access_key=unquote(parts.password or ""))
        client = boto3.session.Session().client("s3", **{k: v for k, v in kwargs.items() if v is not None})
        return cls(client, parts.hostname or "", parts.path.strip("/"), client.meta.endpoint_url, redact(uri))

    def _call(self, op: str, key: str, **kw):
        """`op` on `key`: the response, or the HTTP status of an answer that is not an error."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client, op)(Bucket=self.bucket, Key=self._key(key), **kw)
        except ClientError as e:
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status in (NOT_FOUND, CONFLICT, PRECONDITION_FAILED):
                return status
            error = e.response.get("Error", {})
            raise self._failed(key, op, f"{error.get('Code')}: {error.get('Message')}") from None
        except BotoCoreError as e:
            raise self._failed(key, op, e) from None

    def create(self, key: str, body: bytes) -> str | None:
        r = self._call("put_object", key, Body=body, IfNoneMatch="*")
        return None if isinstance(r, int) else r["ETag"]

    def replace(self, key: str, body: bytes, version: str) -> str | None:
        r = self._call("put_object", key, Body=body, IfMatch=version)
        return None if isinstance(r, int) else r["ETag"]

    def read(self, key: str) -> tuple[dict, str, float] | None:
        r = self._call("get_object", key)
        if isinstance(r, int):
            return None
        date = r.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        return _holder(r["Body"].read()), r["ETag"], _age_s(date, r["LastModified"])

    def delete(self, key: str, version: str | None) -> bool:
        r = self._call("delete_object", key, **({"IfMatch": version} if version else {}))
        return r not in (CONFLICT, PRECONDITION_FAILED)


class GcsObjects(ConditionalObjects):
    """GCS through its JSON API and google-auth's default credentials, or anonymously against an emulator
    (`?endpoint_override=..&scheme=..` in the root URI, or STORAGE_EMULATOR_HOST, as Google's clients read
    it)."""

    never = "1"

    @classmethod
    def for_root(cls, uri: str) -> "GcsObjects":
        import requests

        parts, _, endpoint = _root_parts(uri)
        endpoint = endpoint or os.environ.get("STORAGE_EMULATOR_HOST")
        if endpoint:
            session = requests.Session()
        else:
            import google.auth
            from google.auth.exceptions import DefaultCredentialsError
            from google.auth.transport.requests import AuthorizedSession

            try:
                credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/devstorage.read_write"])
            except DefaultCredentialsError as e:
                raise ValueError(redact(f"storage root {uri}: no Google credentials for the lock across machines "
                                        f"({e})")) from None
            session = AuthorizedSession(credentials)
        return cls(session, parts.hostname or "", parts.path.strip("/"),
                   (endpoint or "https://storage.googleapis.com").rstrip("/"), redact(uri))

    def _request(self, key: str, method: str, url: str, **kw):
        """The response, or the HTTP status of an answer that is not an error."""
        import requests

        try:
            r = self.client.request(method, url, timeout=60, **kw)
        except requests.RequestException as e:
            raise self._failed(key, method, e) from None
        if r.status_code in (NOT_FOUND, CONFLICT, PRECONDITION_FAILED):
            return r.status_code
        if r.status_code >= 300:
            raise self._failed(key, method, f"HTTP {r.status_code}: {r.text[:200]}")
        return r

    def _object_url(self, key: str) -> str:
        return f"{self.endpoint}/storage/v1/b/{self.bucket}/o/{quote(self._key(key), safe='')}"

    def _upload(self, key: str, body: bytes, generation: str) -> str | None:
        """A multipart upload conditional on `generation` (0: the object does not exist)."""
        boundary = uuid.uuid4().hex
        data = (f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n"
                f"{json.dumps({'name': self._key(key), 'contentType': 'application/json'})}\r\n"
                f"--{boundary}\r\nContent-Type: application/json\r\n\r\n").encode() + body + \
            f"\r\n--{boundary}--\r\n".encode()
        r = self._request(key, "POST", f"{self.endpoint}/upload/storage/v1/b/{self.bucket}/o",
                          params={"uploadType": "multipart", "ifGenerationMatch": generation}, data=data,
                          headers={"Content-Type": f"multipart/related; boundary={boundary}"})
        return None if isinstance(r, int) else str(r.json()["generation"])

    def create(self, key: str, body: bytes) -> str | None:
        return self._upload(key, body, "0")

    def replace(self, key: str, body: bytes, version: str) -> str | None:
        return self._upload(key, body, version)

    def read(self, key: str) -> tuple[dict, str, float] | None:
        meta = self._request(key, "GET", self._object_url(key))
        if isinstance(meta, int):
            return None
        generation = str(meta.json()["generation"])
        body = self._request(key, "GET", self._object_url(key), params={"alt": "media", "generation": generation})
        if isinstance(body, int):  # replaced or deleted between the two reads
            return None
        updated = datetime.fromisoformat(meta.json()["updated"].replace("Z", "+00:00"))
        return _holder(body.content), generation, _age_s(meta.headers.get("Date"), updated)

    def delete(self, key: str, version: str | None) -> bool:
        r = self._request(key, "DELETE", self._object_url(key),
                          params={"ifGenerationMatch": version} if version else {})
        return r not in (CONFLICT, PRECONDITION_FAILED)
