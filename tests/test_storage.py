"""The storage root: local paths and URIs, and the remote protocol (pull finished artifacts into a local
cache, push with the marker last). Remote roots are exercised on pyarrow's in-memory `mock://` filesystem
here, and against a real S3 server (moto) in tests/test_cluster.py."""
from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from alignlab.platform.storage.root import Storage, resolve_root


def test_a_relative_path_and_a_file_uri_are_the_same_local_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a, b = resolve_root("store"), resolve_root(f"file://{tmp_path / 'store'}")
    assert not a.remote and a.local == b.local == tmp_path / "store"
    assert a.url("corpus/x") == str(tmp_path / "store" / "corpus" / "x")


def test_a_remote_uri_gets_a_cache_folder_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("ALIGNLAB_CACHE", str(tmp_path / "cache"))
    st = resolve_root("mock:///bucket/prefix/")
    assert st.remote and st.uri == "mock:///bucket/prefix"
    assert st.local.parent == tmp_path / "cache" and st.local.name.startswith("mock-")
    assert st.url("models/m1") == "mock:///bucket/prefix/models/m1"
    assert resolve_root("mock:///other").local != st.local


def test_an_unknown_uri_scheme_is_refused_with_its_name():
    with pytest.raises(ValueError, match="nosuchfs://"):
        resolve_root("nosuchfs://bucket/x")


def _remote_pair(tmp_path) -> tuple[Storage, Storage]:
    """Two machines (two caches) sharing one in-memory remote root."""
    one = Storage("mock:///root", tmp_path / "cache-1")
    two = Storage("mock:///root", tmp_path / "cache-2")
    two._fs = one.filesystem()
    return one, two


def _artifact(st: Storage, rel: str) -> None:
    d = st.local / rel
    (d / "shards").mkdir(parents=True)
    (d / "a.txt").write_text("a")
    (d / "shards" / "s.parquet").write_bytes(b"\0" * 10)
    (d / "manifest.json").write_text("{}")


def test_push_uploads_the_marker_after_everything_else(tmp_path, monkeypatch):
    one, _ = _remote_pair(tmp_path)
    _artifact(one, "corpus/c1")
    order = []
    real = Storage._upload

    def spy(self, rel, files):
        order.extend(files)
        real(self, rel, files)

    monkeypatch.setattr(Storage, "_upload", spy)
    one.push("corpus/c1", last=("manifest.json",))
    assert order[-1] == "manifest.json" and set(order) == {"a.txt", "shards/s.parquet", "manifest.json"}
    assert one.has("corpus/c1/manifest.json") and one.list("corpus/c1") == sorted(order)


def test_an_upload_cut_short_leaves_an_artifact_no_reader_takes_for_finished(tmp_path, monkeypatch):
    one, two = _remote_pair(tmp_path)
    _artifact(one, "corpus/c1")

    def dies_after_the_first_batch(self, rel, files):
        if "manifest.json" in files:
            raise ConnectionError("network gone")
        Storage._upload.__wrapped__(self, rel, files)

    dies_after_the_first_batch.__wrapped__ = Storage._upload
    monkeypatch.setattr(Storage, "_upload", dies_after_the_first_batch)
    with pytest.raises(ConnectionError):
        one.push("corpus/c1", last=("manifest.json",))
    assert one.has("corpus/c1/a.txt") and not one.has("corpus/c1/manifest.json")
    assert two.pull("corpus/c1", marker="manifest.json") is False
    assert not (two.local / "corpus" / "c1").exists()


def test_a_finished_artifact_is_pulled_into_another_cache_without_the_excluded_files(tmp_path):
    one, two = _remote_pair(tmp_path)
    _artifact(one, "corpus/c1")
    one.push("corpus/c1", last=("manifest.json",))
    assert two.pull("corpus/c1", marker="manifest.json", exclude=("shards/",))
    got = two.local / "corpus" / "c1"
    assert (got / "a.txt").read_text() == "a" and (got / "manifest.json").exists()
    assert not (got / "shards").exists()
    assert not [p for p in got.parent.iterdir() if p.name.startswith(".")], "no temporary folder left behind"
    # A second pull is a cache hit: the local copy is complete (content-addressed artifacts never change).
    (got / "a.txt").write_text("cached")
    assert two.pull("corpus/c1", marker="manifest.json") and (got / "a.txt").read_text() == "cached"


def test_single_files_round_trip_and_a_missing_one_is_reported(tmp_path):
    one, two = _remote_pair(tmp_path)
    (one.local / "studies" / "s" / "trials").mkdir(parents=True)
    (one.local / "studies" / "s" / "trials" / "t1.json").write_text('{"ok": 1}')
    one.push_file("studies/s/trials/t1.json")
    assert two.pull_file("studies/s/trials/t1.json")
    assert (two.local / "studies" / "s" / "trials" / "t1.json").read_text() == '{"ok": 1}'
    assert two.pull_file("studies/s/trials/missing.json") is False
    assert two.list("studies/s/trials") == ["t1.json"]


def test_a_local_root_is_used_in_place(tmp_path):
    st = resolve_root(tmp_path / "root")
    _artifact(st, "corpus/c1")
    st.push("corpus/c1", last=("manifest.json",))  # nothing to do
    assert st.pull("corpus/c1", marker="manifest.json") and st.has("corpus/c1/a.txt")
    assert not st.pull("corpus/none", marker="manifest.json")
    assert st.list("corpus/c1") == ["a.txt", "manifest.json", "shards/s.parquet"]


def test_a_storage_travels_to_ray_workers_without_its_filesystem_handle(tmp_path):
    one, _ = _remote_pair(tmp_path)
    one.filesystem()
    back = pickle.loads(pickle.dumps(one))
    assert back == one and back._fs is None and Path(back.local) == one.local
