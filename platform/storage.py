"""Where things are written: one storage root, laid out so a person can find things by eye (DESIGN.md).

Every write that a crash could leave half-done goes to a temporary name and is renamed last.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

DEFAULT_ROOT = "alignlab-storage"
CACHE_ENV = "ALIGNLAB_CACHE"
"""Where a remote root's local mirror lives (default ~/.cache/alignlab/<hash of the root URI>)."""


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
        return f"Storage({self.uri!r})"

    def __str__(self) -> str:
        return self.uri if self.remote else str(self.local)

    def __getstate__(self):  # pickled into Ray tasks and actors: the filesystem handle is rebuilt there
        return {"uri": self.uri, "local": self.local}

    def __setstate__(self, d) -> None:
        self.uri, self.local, self._fs = d["uri"], d["local"], None

    def __eq__(self, other) -> bool:
        return isinstance(other, Storage) and (self.uri, self.local) == (other.uri, other.local)

    def __hash__(self) -> int:
        return hash((self.uri, self.local))

    # ------------------------------------------------------------ where things are

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
        """What Ray is given for `rel`: the local path, or the remote URI."""
        return f"{self.uri.rstrip('/')}/{rel}" if self.remote else str(self.local / rel)

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
        raise ValueError(f"storage root {root!r}: pyarrow cannot open {scheme}:// URIs here ({e})") from e
    cache = Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "alignlab")).expanduser()
    digest = hashlib.sha256(root.rstrip("/").encode()).hexdigest()[:12]
    return Storage(root.rstrip("/"), cache / f"{scheme}-{digest}")


def as_storage(root: str | os.PathLike | Storage) -> Storage:
    """A stage's `root` argument: a Storage, or a local folder given as a path."""
    return root if isinstance(root, Storage) else resolve_root(root)


def corpus_dir(root: Path, corpus_id: str) -> Path:
    return Path(root) / "corpus" / corpus_id


def model_dir(root: Path, model_id: str) -> Path:
    return Path(root) / "models" / model_id


def study_dir(root: Path, name: str) -> Path:
    return Path(root) / "studies" / name


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
    os.replace(tmp, path)


def write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    with open(path) as f:
        return json.load(f)


def publish_dir(tmp: Path, final: Path) -> None:
    """Move a fully written folder into place; an older unfinished one at `final` is replaced."""
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
