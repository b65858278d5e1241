"""The model registry: a pretrained model's id (the hash of everything that determines it), its folder, when it
counts as finished, and how it is fetched from a remote root, listed and pruned. Plain Python: no Ray.

<root>/models/<model-id>/
    config.json          what the model is (corpus id, model config, objectives, budget, seed)
    ray/                 Ray Train's run folder: checkpoints, resumed on a rerun or a worker failure
    tensorboard/         rank 0's scalars
    final/               model.pt, tokenizer.model, eval.json, model_config.json and, written last,
                         _finished.json (every file's size): present with matching sizes = finished
"""
from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq

from alignlab.platform.config import PretrainConfig, config_hash, to_dict
from alignlab.platform.corpus.corpus import load_manifest
from alignlab.platform.encoder.registry import objective_class
from alignlab.platform.pretrain.pretrain import with_resolved_precision
from alignlab.platform.runtime.errors import positive_int
from alignlab.platform.runtime.throughput import run_throughput
from alignlab.platform.storage.root import (MARKER, MODELS, as_storage, folder_finished, publish_dir, read_json,
                                            Storage, write_json, write_marker, write_text)

RUNTIME_FIELDS = ("checkpoint_every", "checkpoint_every_minutes", "log_every", "eval_batches", "cpus_per_worker",
                  "gpus_per_worker", "threads_per_worker", "prefetch_batches", "collate_workers", "loss_chunk_rows",
                  "cuda_graphs")
"""PretrainConfig fields that change how a run is executed, not what the model learns: checkpoint and report
frequency, how many held-out batches the final evaluation reads, the resources and threads of a worker, how
many batches are collated ahead, and where, and how many rows of a vocabulary-sized loss are computed at once (the
same loss summed in another order, as a worker's thread count sums its matmuls in another order).
Every other field is in the id: in particular `num_workers`: `batch_size` is the global batch whatever the
workers, but each of N workers reads its own share of the rows and draws its own labels and dropout masks
(`pretrain.driver.data_config`), so N workers train another model than one; `precision`, "auto" resolved to what
it picks (runtime/precision.py); and `use_gpu`, the device kind: a GPU's kernels sum in another order (and may use TF32), so even an fp32 model trained there
has other digits than one trained on a CPU."""


ADDED_MODEL_FIELDS = {"position": "learned", "alibi": 0.0, "alibi_exempt_cls": False}
"""ModelConfig fields added after models were first registered, with their defaults: hashed only when set to
another value, so every model that existed before keeps its id."""
ADDED_PRETRAIN_FIELDS = {"curriculum_fraction": 0.0, "domain_sources": [], "domain_fraction": 0.0}
"""The same for PretrainConfig fields."""


PRETRAIN_CODE_VERSION = 2
"""The version of the code that turns a corpus and a PretrainConfig into weights (the model, the objectives'
heads and losses, collation, the data order, the optimizer and schedule). Bump it in any change that alters
trained weights for the same corpus and config: it is in every model id, so no cache serves the old weights.
tests/test_versions.py holds a golden hash of a smoke model's weights and fails when they change without a bump
(docs/ids.md says how to regenerate it)."""


def model_id(corpus_id: str, cfg: PretrainConfig) -> str:
    """Objectives ("untrained" for a model trained zero steps), then a hash of: the corpus id (which carries the corpus code version and the holdout), every
    PretrainConfig field but RUNTIME_FIELDS (precision as resolved; `use_gpu`, the device kind, included), and
    PRETRAIN_CODE_VERSION. The table is in docs/ids.md."""
    d = to_dict(with_resolved_precision(cfg))
    for f in RUNTIME_FIELDS:
        d.pop(f, None)  # fields added later with "omit_at_default" are absent at their defaults
    for fields, added in ((d["model"], ADDED_MODEL_FIELDS), (d, ADDED_PRETRAIN_FIELDS)):
        for f, default in added.items():
            if fields.get(f) == default:
                fields.pop(f)
    if not cfg.model.alibi:
        d["model"].pop("alibi_exempt_cls", None)  # no bias to exempt [CLS] from: the same model
    if cfg.num_workers > 1:
        # Each rank reads and labels its own rows (pretrain.driver.data_config) since issue #42: other weights than the
        # earlier every-rank-collates-the-global-batch scheme, and a checkpoint of that scheme must not be resumed.
        # Hashed only for several workers, so single-worker ids (every preset but paper) stay as they were.
        d["rank_split"] = 1
    if cfg.compile:
        # Since issue #56 a compiled run draws its labels at each window's own width, as an eager run does, and cuts
        # its batches to static widths (earlier: every batch padded to the full length before MLM drew its masks,
        # so other masks). Hashed only when compiled, so that no other id moves.
        d["static_shapes"] = 1
    what = "untrained" if cfg.max_steps == 0 else "+".join(cfg.objective_names)
    return f"{cfg.model.label}-{what}-{config_hash(corpus_id, d, {'code': PRETRAIN_CODE_VERSION})}"



DIVERGED = "diverged.json"
"""Written into the model folder (and pushed) when the training loss went non-finite: the run stops, is never
exported, a retry of the worker group fails at once, and a rerun of the same model id is refused with the reason."""


def diverged_reason(st: Storage, mid: str) -> str | None:
    """The recorded reason a model's pretraining diverged, or None."""
    rel = st.model(mid, DIVERGED)
    if not st.pull_file(rel):
        return None
    return read_json(st.local / rel).get("error", "the training loss became non-finite")


FINAL_MARKER = MARKER
"""Written last into `final/` (locally the folder is renamed in whole; at a remote root uploaded after the rest):
the size of every file of `final/`, checked whenever a model is looked up (storage.MARKER)."""
LEGACY_MARKER = "model.pt"
"""The marker of models written before `final/` had one: a `final/model.pt` whose eval.json announces no marker."""


def final_finished(final: Path) -> bool:
    """Is the local folder `final` a whole model: its marker's sizes all match (or a model from before markers)?"""
    return folder_finished(final, legacy=LEGACY_MARKER, announce="eval.json")


def is_finished(mdir: Path) -> bool:
    return final_finished(Path(mdir) / "final")


def model_finished(st: Storage, mid: str) -> bool:
    """Does the root hold the finished model `mid` (marker present, every file whole)?"""
    return st.finished(st.model(mid, "final"), legacy=LEGACY_MARKER, announce="eval.json")


def fetch_model(st: Storage, mid: str, *, weights: bool = True) -> Path:
    """The local folder of a finished model of the root, its `final/` pulled (all of it, or only the small files)."""
    mdir = st.here(st.model(mid))
    if not st.remote:
        return mdir
    if not model_finished(st, mid):
        raise ValueError(f"{st.url(st.model(mid))}: not a finished pretrained model (final/ missing or incomplete)")
    if weights and not is_finished(mdir):  # a cached copy is whole or absent: pulls are renamed into place
        st.pull(st.model(mid, "final"))
    elif not weights:
        for f in ("eval.json", "model_config.json"):
            st.pull_file(st.model(mid, f"final/{f}"))
    st.pull_file(st.model(mid, "config.json"))
    return mdir


def check_corpus_for(cfg: PretrainConfig, cdir: Path, st: Storage | None = None) -> dict:
    """The corpus must be finished and carry the labels every objective needs."""
    manifest = load_manifest(cdir)
    if "columns" in manifest:
        columns = set(manifest["columns"])
        has_train = manifest["stats"]["chunks"].get("train", 0) > 0
    else:  # corpora written before the manifest listed its columns
        files = sorted((cdir / "shards" / "train").glob("*.parquet"))
        has_train = bool(files)
        columns = set(pq.read_schema(files[0]).names) if files else set()
    if not has_train:
        raise ValueError(f"{cdir}: the corpus has no training shards")
    stats = manifest["stats"]
    for c in cfg.objectives:
        cls = objective_class(c)
        missing = [col for col in cls.corpus_columns if col not in columns]
        if missing:
            raise ValueError(f"objective {c.name!r} needs corpus columns {missing} that {cdir} lacks")
        if cls.linked_only and not stats.get("linked_documents"):
            raise ValueError(f"objective {c.name!r} needs linked (Wikipedia) documents, but corpus {cdir.name} "
                             "has none (a web-only corpus); drop it from --objectives")
    return manifest


KEEP_CHECKPOINTS_ENV = "ALIGNLAB_KEEP_CHECKPOINTS"
"""How many Ray Train checkpoints a finished model keeps (default 1, the last: what a re-export needs)."""


def keep_checkpoints_default() -> int:
    text = os.environ.get(KEEP_CHECKPOINTS_ENV, "1")
    try:
        return positive_int(text)
    except Exception as e:  # noqa: BLE001 -- argparse's error type: say which variable
        raise ValueError(f"{KEEP_CHECKPOINTS_ENV}: {e}") from None


def prune_checkpoints(st: Storage, mid: str, name: str = "train", keep: int = 1) -> list[str]:
    """Once a model's `final/` exists, keep only the newest `keep` checkpoints of its Train run; returns the
    deleted checkpoint folders. Ray's run snapshot is rewritten first to list only the kept ones (Ray refuses
    to resume a run whose snapshot names a deleted checkpoint), then the others are deleted; a crash in
    between leaves only unlisted folders, which Ray ignores. The last checkpoint stays, so a `final/` found
    incomplete later is re-exported from it without training again."""
    import json

    import pyarrow.fs as pafs

    fs, _ = st.filesystem()
    run = st.ray_path(st.model(mid, f"ray/{name}"))
    snap_path = f"{run}/checkpoint_manager_snapshot.json"
    if fs.get_file_info(snap_path).type != pafs.FileType.File:
        return []
    with fs.open_input_stream(snap_path) as f:
        snap = json.loads(f.read())
    listed = [r["checkpoint_dir_name"] for r in snap.get("checkpoint_results", [])]
    indices = snap.get("checkpoint_report_indices", list(range(len(listed))))
    by_age = [d for _, d in sorted(zip(indices, listed))]
    latest = (snap.get("latest_checkpoint_result") or {}).get("checkpoint_dir_name")
    kept = set(by_age[-keep:]) | ({latest} if latest else set())
    on_disk = [i.base_name for i in fs.get_file_info(pafs.FileSelector(run, allow_not_found=True))
               if i.type == pafs.FileType.Directory and i.base_name.startswith("checkpoint_")]
    doomed = sorted(d for d in on_disk if d not in kept)
    if not doomed:
        return []
    if set(listed) - kept:
        pairs = [(r, i) for r, i in zip(snap["checkpoint_results"], indices) if r["checkpoint_dir_name"] in kept]
        snap["checkpoint_results"] = [r for r, _ in pairs]
        snap["checkpoint_report_indices"] = [i for _, i in pairs]
        for k in ("validated_checkpoint_dir_names", "timed_out_validation_checkpoint_dir_names",
                  "failed_validation_checkpoint_dir_names"):
            if k in snap:
                snap[k] = [d for d in snap[k] if d in kept]
        text = json.dumps(snap)
        if st.remote:
            with fs.open_output_stream(snap_path) as out:
                out.write(text.encode())
        else:
            write_text(Path(snap_path), text)
    for d in doomed:
        fs.delete_dir(f"{run}/{d}")
    return doomed


def list_models(root: Path | Storage) -> list[dict]:
    st = as_storage(root)
    out = []
    finished_at_root: set[str] = set()
    if st.remote:  # the registry is the root's: bring each model's small files over
        for f in st.list("models"):
            if f.count("/") == 1 and f.endswith("/config.json"):
                mid = f.split("/")[0]
                if model_finished(st, mid):
                    fetch_model(st, mid, weights=False)
                    finished_at_root.add(mid)
                else:
                    st.pull_file(st.model(f))
    for cfg_file in sorted(st.here(MODELS).glob("*/config.json")):
        mdir = cfg_file.parent
        try:
            info = read_json(cfg_file)
            pre = info["pretrain"]
            row = {"model_id": info["model_id"], "size": f"{pre['model']['hidden']}x{pre['model']['num_layers']}",
                   "objectives": "+".join(o["name"] for o in pre["objectives"]), "max_steps": pre["max_steps"],
                   "precision": info.get("precision", pre.get("precision")),
                   "finished": mdir.name in finished_at_root if st.remote else is_finished(mdir)}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            # One damaged entry (a hand edit, a copy cut short) must not hide the others: listed as broken.
            out.append({"model_id": mdir.name, "broken": f"{cfg_file}: {_config_problem(e)}"})
            continue
        if (mdir / DIVERGED).exists():
            row["diverged"] = read_json(mdir / DIVERGED).get("error")
        if row["finished"]:
            ev = read_json(mdir / "final" / "eval.json")
            row.update({k: v for k, v in ev.items() if k.endswith(("accuracy", "perplexity"))})
            tp = ev.get("throughput") or {}  # what it cost (docs/throughput.md); absent for older models
            row.update({k: tp[k] for k in ("device", "num_devices", "tokens_per_s", "mfu", "device_hours") if k in tp})
        out.append(row)
    return out


def _config_problem(e: Exception) -> str:
    if isinstance(e, KeyError):
        return f"no {e.args[0]!r} field (not a model's config.json, or cut short)"
    if isinstance(e, ValueError):
        return f"not JSON ({e})"
    return f"not a model's config.json ({type(e).__name__}: {e})"


def export_final(trainer, tok, mdir: Path, eval_metrics: dict, throughput: dict | None = None) -> None:
    """Write a trained `Pretrainer`'s `final/` (weights, tokenizer, eval.json with the held-out metrics and the run's
    throughput record -- this rank's, scaled by the world size, when none is given -- model_config.json), marker
    last, and publish it in one rename."""
    import dataclasses
    import shutil
    import tempfile

    import torch

    if throughput is None:
        throughput = run_throughput(trainer)

    tmp = Path(tempfile.mkdtemp(prefix="final.", dir=mdir))
    torch.save(trainer.model.state_dict(), tmp / "model.pt")
    shutil.copy(tok.model_path, tmp / "tokenizer.model")
    counts = Path(tok.model_path).with_name("token_counts.npy")
    if counts.exists():
        shutil.copy(counts, tmp / "token_counts.npy")
    write_json(tmp / "eval.json", {"step": trainer.state.step, "precision": trainer.precision, **eval_metrics,
                                   "throughput": throughput, "marker": MARKER})
    write_json(tmp / "model_config.json", {"model": dataclasses.asdict(trainer.cfg.model),
                                           "vocab_size": tok.vocab_size,
                                           "heads": list(trainer.model.heads.keys()),
                                           "pretrain": to_dict(trainer.cfg)})
    write_marker(tmp)  # last: the size of every file above
    publish_dir(tmp, mdir / "final")
