"""Where things are written: one storage root, laid out so a person can find things by eye (docs/guarantees.md).

Every write that a crash could leave half-done goes to a temporary name and is renamed last.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

DEFAULT_ROOT = "alignlab-storage"
TASKS, CORPORA, MODELS, STUDIES = "tasks", "corpus", "models", "studies"
"""The root's top-level folders, one per kind of artifact (`Storage.tasks`, `corpus`, `model`, `study`)."""
CACHE_ENV = "ALIGNLAB_CACHE"
"""Where a remote root's local mirror lives (default ~/.cache/alignlab/<hash of the root URI>)."""


_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s?#]+@")
_SECRET_PARAM = re.compile(r"(?i)(?P<key>[?&][^=&\s#]*(?:key|secret|token|passw|credential|signature|sig\b|session)"
                           r"[^=&\s#]*=)[^&\s#]+")


def redact(text: str) -> str:
    """`text` with the credentials of any URI in it replaced by ***: user:password before an @ (`s3://KEY:SECRET@bucket`)
    and query parameters that name a key, secret, token, password, credential, signature or session
    (`?access_key=...&secret_key=...`). Everything else -- scheme, bucket, path, region, endpoint -- is kept."""
    return _SECRET_PARAM.sub(r"\g<key>***", _USERINFO.sub(r"\g<scheme>***@", text))


class Storage:
    """The storage root: a local folder (a path or `file://` URI; a shared filesystem on a cluster is one) or
    a remote URI that pyarrow's filesystems understand (`s3://bucket/prefix`, `gs://…`, `hdfs://…`).

    Every stage reads and writes plain files under `local`. For a local root that *is* the root, and
    `pull`/`push` do nothing. For a remote root, `local` is a cache folder on this machine: a stage pulls
    the finished artifacts it needs into it and pushes what it finished, marker file last, so a reader on
    any node never takes a half-uploaded artifact for a finished one. Artifacts are content-addressed and
    never change once finished, so a cached copy is never stale. Ray is given the root's URI directly
    where it does its own I/O: Ray Data reads corpus shards from it and Ray Train/Tune keep checkpoints
    and experiment state under it. Credentials and endpoints come from the usual environment (for S3:
    AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION and, for S3-compatible servers,
    AWS_ENDPOINT_URL); on a cluster every node needs them (the job's runtime_env `env_vars`).
    """

    def __init__(self, uri: str, local: Path):
        self.uri, self.local = uri, Path(local)
        self._fs = None

    @property
    def remote(self) -> bool:
        return not self.uri.startswith("file://")

    def __repr__(self) -> str:
        return f"Storage({self.shown!r})"

    def __str__(self) -> str:
        return self.shown if self.remote else str(self.local)

    @property
    def shown(self) -> str:
        """The root's URI as printed, logged or put in a Tune param space: without credentials (`redact`)."""
        return redact(self.uri)

    def __getstate__(self):  # pickled into Ray tasks and actors: the filesystem handle is rebuilt there
        return {"uri": self.uri, "local": self.local}

    def __setstate__(self, d) -> None:
        self.uri, self.local, self._fs = d["uri"], d["local"], None

    def __eq__(self, other) -> bool:
        return isinstance(other, Storage) and (self.uri, self.local) == (other.uri, other.local)

    def __hash__(self) -> int:
        return hash((self.uri, self.local))

    # ------------------------------------------------------------ where things are

    # The layout (docs/guarantees.md#where-a-run-writes): each artifact's folder relative to the root, the one place
    # that spells it. A stage names an artifact by these and reads or writes it under `local` (`here`), pulls and
    # pushes it by the same relative path, and hands Ray `ray_path` of it.

    @staticmethod
    def tasks(key: str, *parts: str) -> str:
        """The task data folder `key` (`task_data.tasks_rel`), or a file in it."""
        return _join(TASKS, key, *parts)

    @staticmethod
    def corpus(cid: str, *parts: str) -> str:
        """Corpus `cid`'s folder (its manifest, tokenizer and shards), or a path in it."""
        return _join(CORPORA, cid, *parts)

    @staticmethod
    def model(mid: str, *parts: str) -> str:
        """Model `mid`'s folder (config.json, final/, ray/, tensorboard/), or a path in it."""
        return _join(MODELS, mid, *parts)

    @staticmethod
    def study(name: str, *parts: str) -> str:
        """Study `name`'s folder (trials/, results, report, searches/, tensorboard/), or a path in it."""
        return _join(STUDIES, name, *parts)

    def here(self, rel: str) -> Path:
        """Where `rel` is on this machine: under the root itself, or under a remote root's local cache."""
        return self.local / rel


    def filesystem(self):
        """(pyarrow filesystem, the root's path inside it)."""
        if self._fs is None:
            import pyarrow.fs as pafs

            if self.remote:
                self._fs = pafs.FileSystem.from_uri(self.uri)
            else:
                self._fs = (pafs.LocalFileSystem(), str(self.local))
        return self._fs

    def url(self, rel: str) -> str:
        """Where `rel` is, to show a person: the local path, or the remote URI without credentials."""
        return f"{self.shown.rstrip('/')}/{rel}" if self.remote else str(self.local / rel)

    def ray_filesystem(self):
        """The pyarrow filesystem to hand Ray next to `url()` (None for local roots: Ray's default)."""
        return self.filesystem()[0] if self.remote else None

    def ray_path(self, rel: str) -> str:
        """`rel` as a path inside `ray_filesystem()` (a plain local path for local roots)."""
        return self._remote_path(rel) if self.remote else str(self.local / rel)

    def _remote_path(self, rel: str) -> str:
        return f"{self.filesystem()[1].rstrip('/')}/{rel}".rstrip("/")

    # ------------------------------------------------------------ remote transfers

    def has(self, rel: str) -> bool:
        """Does the root hold the file `rel`?"""
        if not self.remote:
            return (self.local / rel).exists()
        import pyarrow.fs as pafs

        fs, _ = self.filesystem()
        return fs.get_file_info(self._remote_path(rel)).type == pafs.FileType.File

    def list(self, rel: str) -> list[str]:
        """Paths (relative to `rel`) of every file under the folder `rel` of the root."""
        if not self.remote:
            base = self.local / rel
            return sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file()) if base.exists() else []
        import pyarrow.fs as pafs

        fs, _ = self.filesystem()
        base = self._remote_path(rel)
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        return sorted(i.path[len(base) + 1:] for i in infos if i.type == pafs.FileType.File)

    def sizes(self, rel: str) -> dict[str, int]:
        """{path relative to `rel`: size in bytes} of every file under the folder `rel` of the root."""
        if not self.remote:
            base = self.local / rel
            return {str(p.relative_to(base)): p.stat().st_size for p in base.rglob("*") if p.is_file()} \
                if base.exists() else {}
        import pyarrow.fs as pafs

        fs, _ = self.filesystem()
        base = self._remote_path(rel)
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        return {i.path[len(base) + 1:]: i.size for i in infos if i.type == pafs.FileType.File}

    def finished(self, rel: str, *, legacy: str | None = None, announce: str | None = None) -> bool:
        """Is the artifact folder `rel` finished at the root: its `MARKER` present and every file it lists there
        with the listed size (`marker_problems`)? An artifact written before markers existed counts as finished
        when it has the file `legacy` (its old marker, written last) and its file `announce` (written before
        the marker) does not say a marker is coming (`announces_marker`): a folder still being uploaded is
        never taken for an old one."""
        if not self.remote:
            return folder_finished(self.local / rel, legacy=legacy, announce=announce)
        sizes = self.sizes(rel)
        try:
            if MARKER in sizes:
                return not marker_problems(self.read_json(f"{rel}/{MARKER}"), sizes)
            if not legacy or legacy not in sizes:
                return False
            return not (announce and announce in sizes and announces_marker(self.read_json(f"{rel}/{announce}")))
        except ValueError:  # a marker that is not (whole) JSON: not finished
            return False

    def read_json(self, rel: str) -> Any:
        if not self.remote:
            return read_json(self.local / rel)
        fs, _ = self.filesystem()
        with fs.open_input_stream(self._remote_path(rel)) as f:
            return json.loads(f.read())

    def pull(self, rel: str, *, marker: str | None = None, exclude: tuple[str, ...] = ()) -> bool:
        """Make the finished artifact `rel` present under `local`; False when the root has no finished one.

        `marker` is the file whose presence means finished (checked at the root); files under an `exclude`d
        prefix are not copied. A pulled folder is assembled under a temporary name and renamed."""
        dest = self.local / rel
        if not self.remote:
            return (dest / marker).exists() if marker else dest.exists()
        if marker and (dest / marker).exists():
            return True
        if marker and not self.has(f"{rel}/{marker}"):
            return False
        files = [f for f in self.list(rel) if not f.startswith(exclude)]  # startswith(()) is False
        if not files:
            return False
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.pull-", dir=dest.parent))
        try:
            self._download(rel, files, tmp)
            if dest.exists():  # an unfinished local copy (or a rival pull): the root's finished one wins
                shutil.rmtree(dest, ignore_errors=True)
            try:
                os.replace(tmp, dest)
            except OSError:  # a concurrent pull on this node got there first; its copy is the same artifact
                shutil.rmtree(tmp, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return True

    def pull_file(self, rel: str) -> bool:
        """Copy one file of the root into `local` (temp name, renamed); False when the root lacks it."""
        if not self.remote:
            return (self.local / rel).exists()
        if not self.has(rel):
            return False
        parent = str(Path(rel).parent)
        tmp = Path(tempfile.mkdtemp(prefix=".pull-", dir=self._mkdir(self.local / parent)))
        try:
            self._download(parent, [Path(rel).name], tmp)
            os.replace(tmp / Path(rel).name, self.local / rel)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return True

    def push(self, rel: str, *, last: tuple[str, ...] = (), exclude: tuple[str, ...] = ()) -> None:
        """Upload the local folder `rel` to the root; the files named in `last` go after all the others, so
        their presence at the root means the rest is there."""
        if not self.remote:
            return
        src = self.local / rel
        files = sorted(str(p.relative_to(src)) for p in src.rglob("*") if p.is_file())
        files = [f for f in files if not f.startswith(exclude) and not f.endswith(".tmp")]
        first = [f for f in files if f not in last]
        self._upload(rel, first)
        self._upload(rel, [f for f in last if f in files])

    def push_file(self, rel: str) -> None:
        if self.remote:
            self._upload(str(Path(rel).parent), [Path(rel).name])

    def _download(self, rel: str, files: list[str], dest: Path) -> None:
        fs, _ = self.filesystem()
        base = self._remote_path(rel)
        for f in files:
            target = dest / f
            target.parent.mkdir(parents=True, exist_ok=True)
            with fs.open_input_stream(f"{base}/{f}") as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)

    def _upload(self, rel: str, files: list[str]) -> None:
        # An object store makes a written object visible whole or not at all, so no temporary name is needed.
        fs, _ = self.filesystem()
        base = self._remote_path(rel)
        made: set[str] = set()
        for f in files:
            parent = f"{base}/{f}".rsplit("/", 1)[0]
            if parent not in made:  # filesystems with real folders (HDFS, a mounted one) need them first
                fs.create_dir(parent, recursive=True)
                made.add(parent)
            with open(self.local / rel / f, "rb") as src, fs.open_output_stream(f"{base}/{f}") as out:
                shutil.copyfileobj(src, out, 1 << 20)

    @staticmethod
    def _mkdir(p: Path) -> Path:
        p.mkdir(parents=True, exist_ok=True)
        return p


def resolve_root(root: str | os.PathLike | Storage | None) -> Storage:
    """The storage root from a path, a `file://` URI, or any remote URI pyarrow understands."""
    if isinstance(root, Storage):
        return root
    root = str(root or os.environ.get("ALIGNLAB_STORAGE", DEFAULT_ROOT))
    if root.startswith("file://"):
        root = root[len("file://"):]
    if "://" not in root:
        local = Path(root).expanduser().resolve()
        return Storage(local.as_uri(), local)
    scheme = root.split("://", 1)[0]
    try:
        import pyarrow.fs as pafs

        pafs.FileSystem.from_uri(root)
    except Exception as e:  # noqa: BLE001 -- pyarrow raises several kinds; all mean "not a usable URI here"
        raise ValueError(redact(f"storage root {root!r}: pyarrow cannot open {scheme}:// URIs here ({e})")) from e
    cache = Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "alignlab")).expanduser()
    digest = hashlib.sha256(root.rstrip("/").encode()).hexdigest()[:12]
    return Storage(root.rstrip("/"), cache / f"{scheme}-{digest}")


def as_storage(root: str | os.PathLike | Storage) -> Storage:
    """A stage's `root` argument: a Storage, or a local folder given as a path."""
    return root if isinstance(root, Storage) else resolve_root(root)


def _join(*parts: str) -> str:
    return "/".join(parts)


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def write_text(path: Path, text: str) -> None:
    """Write `text` to a temporary name, flush it to disk (fsync), and rename it: after a crash or power loss the
    file is the old one or the whole new one, never a renamed but empty or partial one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:  # a full disk says "No space left on device" without the file: name it
        Path(tmp).unlink(missing_ok=True)
        if e.filename is None:
            raise OSError(e.errno, e.strerror or str(e), str(path)) from e
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(d: Path) -> None:
    """Make a rename in `d` durable (best effort: some filesystems refuse to open a folder)."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(d: Path) -> None:
    for p in Path(d).rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


# ------------------------------------------------------------ finished markers

MARKER = "_finished.json"
"""The last file written into a finished artifact folder: the size of every other file in it. Its presence with
every size matching means finished; a missing or short file (an interrupted upload or copy, a truncated
model.pt) means unfinished, and the artifact is made again."""

def write_marker(folder: Path, extra: dict[str, int] | None = None) -> None:
    """Write `MARKER` into `folder` (after everything else in it is written and flushed). `extra` lists files
    of the artifact that live at the root only (a remote corpus's shards), with their sizes."""
    folder = Path(folder)
    files = {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*"))
             if p.is_file() and p.name != MARKER and not p.name.endswith(".tmp")}
    write_json(folder / MARKER, {"files": {**files, **(extra or {})}})


def marker_problems(manifest: dict, sizes: dict[str, int]) -> list[str]:
    """What is wrong with an artifact whose marker lists `manifest["files"]`, given the files' actual `sizes`."""
    out = []
    for f, n in manifest.get("files", {}).items():
        have = sizes.get(f)
        if have is None:
            out.append(f"{f} is missing")
        elif have != n:
            out.append(f"{f} has {have} bytes, not {n}")
    return out


def folder_finished(folder: Path, *, legacy: str | None = None, announce: str | None = None) -> bool:
    """`Storage.finished` for a local folder."""
    folder = Path(folder)
    if (folder / MARKER).exists():
        try:
            manifest = read_json(folder / MARKER)
        except ValueError:  # a marker that is not JSON: not finished
            return False
        sizes = {f: (folder / f).stat().st_size for f in manifest.get("files", {}) if (folder / f).is_file()}
        return not marker_problems(manifest, sizes)
    if not legacy or not (folder / legacy).is_file():
        return False
    return not (announce and (folder / announce).is_file() and announces_marker(read_json(folder / announce)))


def announces_marker(data: dict) -> bool:
    return isinstance(data, dict) and data.get("marker") == MARKER


def read_json(path: Path) -> Any:
    with open(path) as f:
        return json.load(f)


def publish_dir(tmp: Path, final: Path) -> None:
    """Move a fully written folder into place (its files flushed to disk first); an older unfinished one at
    `final` is replaced."""
    _fsync_tree(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
