"""Finished markers (issue #17): every artifact folder's last file lists the size of every other file, and an
artifact counts as finished only when all of them are there with those sizes -- a truncated model.pt or an
upload cut short is unfinished and made again. Models written before markers existed are still read."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from alignlab.platform.storage.root import MARKER, Storage, folder_finished, write_json, write_marker  # noqa: E402


def _folder(d: Path, announce: bool = True) -> Path:
    d.mkdir(parents=True)
    (d / "model.pt").write_bytes(b"\1" * 1000)
    (d / "tokenizer.model").write_bytes(b"\2" * 10)
    write_json(d / "eval.json", {"step": 3, **({"marker": MARKER} if announce else {})})
    return d


def test_a_folder_is_finished_only_when_its_marker_lists_every_file_at_its_size(tmp_path):
    d = _folder(tmp_path / "final")
    assert not folder_finished(d, legacy="model.pt", announce="eval.json"), "no marker yet, and one is announced"
    write_marker(d)
    manifest = json.loads((d / MARKER).read_text())
    assert manifest["files"] == {"eval.json": (d / "eval.json").stat().st_size, "model.pt": 1000, "tokenizer.model": 10}
    assert folder_finished(d, legacy="model.pt", announce="eval.json")
    with open(d / "model.pt", "r+b") as f:
        f.truncate(999)
    assert not folder_finished(d, legacy="model.pt", announce="eval.json"), "a truncated model.pt is unfinished"
    (d / "model.pt").unlink()
    assert not folder_finished(d, legacy="model.pt", announce="eval.json"), "a missing file is unfinished"


def test_a_marker_that_is_not_whole_json_means_unfinished(tmp_path):
    d = _folder(tmp_path / "final")
    (d / MARKER).write_text('{"files": {"model.pt": 10')
    assert not folder_finished(d, legacy="model.pt", announce="eval.json")


def test_a_model_written_before_markers_existed_is_still_finished(tmp_path):
    d = _folder(tmp_path / "final", announce=False)
    assert folder_finished(d, legacy="model.pt", announce="eval.json")
    assert not folder_finished(tmp_path / "nothing", legacy="model.pt")


def _remote_pair(tmp_path) -> tuple[Storage, Storage]:
    one = Storage("mock:///root", tmp_path / "cache-1")
    two = Storage("mock:///root", tmp_path / "cache-2")
    two._fs = one.filesystem()
    return one, two


def test_at_a_remote_root_an_upload_cut_short_or_a_short_file_is_not_finished(tmp_path):
    one, two = _remote_pair(tmp_path)
    d = _folder(one.local / "models" / "m" / "final")
    write_marker(d)
    files = sorted(p.name for p in d.iterdir() if p.name != MARKER)
    one._upload("models/m/final", files)  # everything but the marker: an upload cut short
    assert not two.finished("models/m/final", legacy="model.pt", announce="eval.json")
    one._upload("models/m/final", [MARKER])
    assert two.finished("models/m/final", legacy="model.pt", announce="eval.json")
    fs, _ = one.filesystem()
    with fs.open_output_stream(one._remote_path("models/m/final/model.pt")) as out:
        out.write(b"\1" * 10)  # a short object under the right name
    assert not two.finished("models/m/final", legacy="model.pt", announce="eval.json")


def test_a_remote_model_from_before_markers_is_finished_but_one_mid_upload_is_not(tmp_path):
    one, two = _remote_pair(tmp_path)
    old = _folder(one.local / "models" / "old" / "final", announce=False)
    one.push("models/old/final", last=("model.pt",))
    assert two.finished("models/old/final", legacy="model.pt", announce="eval.json")
    new = _folder(one.local / "models" / "new" / "final")
    write_marker(new)
    one._upload("models/new/final", ["eval.json", "model.pt"])  # announced, marker not there yet
    assert not two.finished("models/new/final", legacy="model.pt", announce="eval.json")
    assert old.exists()


def test_an_exported_models_marker_lists_every_file_of_its_final_folder_at_its_size(tmp_path):
    """`models.export_final` (what the Train driver writes), without Ray: a marker written before any other file
    would list none of them, and a model cut short would still count as finished."""
    from tiny_model import tiny_pretrained

    from alignlab.platform.pretrain.models import is_finished

    mdir = tiny_pretrained(tmp_path, steps=1)
    final = mdir / "final"
    listed = json.loads((final / MARKER).read_text())["files"]
    assert listed == {p.name: p.stat().st_size for p in final.iterdir() if p.name != MARKER}
    assert {"model.pt", "eval.json", "tokenizer.model"} <= set(listed) and is_finished(mdir)
    with open(final / "model.pt", "r+b") as f:
        f.truncate(10)
    assert not is_finished(mdir)


def test_a_saved_finetuned_model_with_a_truncated_weights_file_is_refused_on_load(tmp_path):
    from tiny_model import tiny_pretrained

    from alignlab.tasks.ct_data import CTExample
    from alignlab.platform.fel.finetune import finetune_calculation, load_finetuned, load_pretrained, save_finetuned
    from alignlab.platform.fel.finetune_config import FinetuneConfig

    pre = load_pretrained(tiny_pretrained(tmp_path, "mlm", steps=1))
    ex = [CTExample(("a", f"w{i}", "b"), ("N", "SE", "N")) for i in range(12)]
    cfg = FinetuneConfig(task="ct", budget=8, max_epochs=1, patience=1, batch_size=4, selection="honest")
    fdir = save_finetuned(tmp_path, pre, cfg, finetune_calculation(pre, cfg, ex[:6], ex[8:], val=ex[6:8]))
    assert (fdir / MARKER).exists()
    load_finetuned(fdir)
    with open(fdir / "model.pt", "r+b") as f:
        f.truncate(100)
    with pytest.raises(ValueError, match="not a saved finetuned model"):
        load_finetuned(fdir)


@pytest.mark.ray
def test_a_finished_model_keeps_its_last_checkpoint_and_a_truncated_weights_file_makes_it_unfinished_and_re_exported(
        ray_session, smoke_corpus, smoke_model, smoke_model_cfg, tmp_path):
    """The session's smoke model (conftest.py), copied whole to a root of this test's own with its Train run folder:
    Ray Train's snapshot names its checkpoints relative to that folder, so the copy resumes like the original."""
    import shutil

    import torch
    from fault_hooks import Probe, probed_steps, registered

    from alignlab.platform.fel.finetune import load_pretrained
    from alignlab.platform.pretrain.driver import pretrain
    from alignlab.platform.pretrain.models import is_finished, list_models

    cfg = smoke_model_cfg
    root = tmp_path / "root"
    mdir = root / "models" / smoke_model.name
    shutil.copytree(smoke_model, mdir)
    # Checkpoints at steps 5, 10 and 12 (Ray keeps two while training); the finished model keeps only the last.
    assert cfg.max_steps == 12 and cfg.checkpoint_every == 5
    (ckpt,) = [p for p in (mdir / "ray" / "train").glob("checkpoint_*") if p.is_dir()]
    snapshot = json.loads((mdir / "ray" / "train" / "checkpoint_manager_snapshot.json").read_text())
    assert [r["checkpoint_dir_name"] for r in snapshot["checkpoint_results"]] == [ckpt.name]
    weights = mdir / "final" / "model.pt"
    size = weights.stat().st_size
    assert is_finished(mdir)
    with open(weights, "r+b") as f:
        f.truncate(size // 2)
    assert not is_finished(mdir)
    assert list_models(root)[0]["finished"] is False
    with pytest.raises(ValueError, match="not a finished pretrained model"):
        load_pretrained(mdir)
    probe = tmp_path / "probe"
    probe.mkdir()
    # Redone: the Train run resumes from its (pruned) snapshot at the last step and trains no step again.
    again = pretrain(smoke_corpus, cfg, root, after_step=registered(Probe(str(probe))))
    assert again == mdir and is_finished(mdir) and weights.stat().st_size == size
    assert probed_steps(probe, 0) == [], "re-exported from the last checkpoint, not retrained"
    assert json.loads((mdir / "final" / "eval.json").read_text())["step"] == 12
    original = torch.load(smoke_model / "final" / "model.pt", weights_only=True)
    for k, v in torch.load(weights, weights_only=True).items():
        assert torch.equal(v, original[k]), f"{k} differs from the model before its weights file was cut short"
    load_pretrained(mdir)


@pytest.mark.ray
def test_a_corpus_with_a_shard_cut_short_is_unfinished_and_built_again(smoke_corpus, storage_root, tmp_path):
    """The session's smoke corpus (conftest.py) and its task data, copied to a root of this test's own."""
    import shutil

    from alignlab.platform.corpus.corpus import MANIFEST, build_corpus, corpus_finished
    from alignlab.platform.presets import Preset
    from alignlab.platform.storage.root import as_storage

    st = as_storage(tmp_path / "st")
    cdir = st.local / "corpus" / smoke_corpus.name
    shutil.copytree(smoke_corpus, cdir)
    tasks = json.loads((cdir / MANIFEST).read_text())["heldout"]["task_dir"]
    shutil.copytree(storage_root / "tasks" / tasks, st.local / "tasks" / tasks)
    assert json.loads((cdir / MANIFEST).read_text())["marker"] == MARKER
    listed = json.loads((cdir / MARKER).read_text())["files"]
    shard = sorted(cdir.glob("shards/train/*.parquet"))[0]
    assert listed[str(shard.relative_to(cdir))] == shard.stat().st_size and MANIFEST in listed
    assert corpus_finished(st, cdir.name)
    whole = shard.read_bytes()
    shard.write_bytes(whole[: len(whole) // 2])  # a full disk, a copy cut short
    assert not corpus_finished(st, cdir.name)
    assert build_corpus(Preset.named("smoke").corpus, st, progress=False) == cdir
    assert shard.read_bytes() == whole and corpus_finished(st, cdir.name)


def test_task_data_with_a_file_cut_short_is_unfinished_and_built_again(tmp_path):
    from alignlab.platform.storage.root import as_storage
    from alignlab.platform.tasks.task_data import build_tasks, tasks_finished

    st = as_storage(tmp_path / "st")
    tdir = build_tasks(st, max_docs_per_lang=30)
    rel = str(tdir.relative_to(st.local))
    assert tasks_finished(st, rel) and (tdir / MARKER).exists()
    victim = max((p for p in tdir.iterdir() if p.suffix == ".jsonl"), key=lambda p: p.stat().st_size)
    whole = victim.read_bytes()
    victim.write_bytes(whole[:10])
    assert not tasks_finished(st, rel)
    assert build_tasks(st, max_docs_per_lang=30) == tdir
    assert victim.read_bytes() == whole and tasks_finished(st, rel)
