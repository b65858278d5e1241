"""Ray edge of pretraining: a `TorchTrainer` whose workers stream their shard of the corpus, plus the
model registry (a model's id is the hash of everything that determines it).

<root>/models/<model-id>/
    config.json          what the model is (corpus id, model config, objectives, budget, seed)
    ray/                 Ray Train's run folder: checkpoints, resumed on a rerun or a worker failure
    tensorboard/         rank 0's scalars
    final/               model.pt, tokenizer.model, eval.json, model_config.json and, written last,
                         _finished.json (every file's size): present with matching sizes = finished
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch

from alignlab.platform.config import PretrainConfig, config_hash, pretrain_from_dict, to_dict
from alignlab.platform.corpus import load_manifest
from alignlab.platform.pretrain import NonFiniteLossError, resolve_precision
from alignlab.platform.registry import objective_class
from alignlab.platform.storage import (MARKER, Storage, as_storage, corpus_dir, folder_finished, model_dir, publish_dir,
                                       read_json, resolve_root, write_json, write_marker)

RUNTIME_FIELDS = ("checkpoint_every", "log_every", "eval_batches", "cpus_per_worker", "threads_per_worker", "use_gpu")
"""PretrainConfig fields that change how a run is executed, not what the model learns: checkpoint and report
frequency, how many held-out batches the final evaluation reads, the resources and threads of a worker, and
the device (what it changes, the precision, is in the id as resolved). Every other field is in the id: in
particular `num_workers`, because the global batch is batch_size x num_workers and each worker draws its
own rank-keyed randomness, and `precision`, "auto" resolved to what it picks (resolve_precision)."""


def model_id(corpus_id: str, cfg: PretrainConfig) -> str:
    d = to_dict(resolve_precision(cfg))
    for f in RUNTIME_FIELDS:
        d.pop(f)
    return f"{cfg.model.label}-{'+'.join(cfg.objective_names)}-{config_hash(corpus_id, d)}"


def worker_resources(cfg: PretrainConfig) -> dict:
    """One Train worker's Ray resources (`use_gpu` alone would reserve only {"GPU": 1}, RAY_NOTES §1)."""
    resources = {"CPU": cfg.cpus_per_worker}
    if cfg.use_gpu:
        resources["GPU"] = 1
    return resources


def check_pretrain_resources(cfg: PretrainConfig) -> None:
    """Refuse, within seconds, a pretraining run the cluster can never schedule (issue #17): its workers, plus
    one CPU left for Ray Data's reads. Ray must be initialised."""
    from alignlab.platform.resources import RAY_DATA_CPUS, check_request

    check_request(f"pretraining ({cfg.num_workers} Train worker{'s' if cfg.num_workers != 1 else ''}"
                  f"{', use_gpu' if cfg.use_gpu else ''})", worker_resources(cfg), cfg.num_workers,
                  spare_cpus=RAY_DATA_CPUS,
                  hint="use a smaller preset, fewer workers or CPUs per worker, or a cluster that has them")


DIVERGED = "diverged.json"
"""Written into the model folder (and pushed) when the training loss went non-finite: the run stops, is never
exported, a retry of the worker group fails at once, and a rerun of the same model id is refused with the reason."""


def _diverged(st: Storage, mid: str) -> str | None:
    """The recorded reason a model's pretraining diverged, or None."""
    rel = f"models/{mid}/{DIVERGED}"
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
    return st.finished(f"models/{mid}/final", legacy=LEGACY_MARKER, announce="eval.json")


def fetch_model(st: Storage, mid: str, *, weights: bool = True) -> Path:
    """The local folder of a finished model of the root, its `final/` pulled (all of it, or only the small files)."""
    mdir = model_dir(st.local, mid)
    if not st.remote:
        return mdir
    if not model_finished(st, mid):
        raise ValueError(f"{st.url('models/' + mid)}: not a finished pretrained model (final/ missing or incomplete)")
    if weights and not is_finished(mdir):  # a cached copy is whole or absent: pulls are renamed into place
        st.pull(f"models/{mid}/final")
    elif not weights:
        for f in ("eval.json", "model_config.json"):
            st.pull_file(f"models/{mid}/final/{f}")
    st.pull_file(f"models/{mid}/config.json")
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
    from alignlab.platform.errors import positive_int

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
    run = st.ray_path(f"models/{mid}/ray/{name}")
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
            from alignlab.platform.storage import write_text

            write_text(Path(snap_path), text)
    for d in doomed:
        fs.delete_dir(f"{run}/{d}")
    return doomed


def pretrain(cdir: Path, cfg: PretrainConfig, root: Path, *, max_failures: int = 2, name: str = "train",
             crash_at_step: int | None = None, keep_checkpoints: int | None = None) -> Path:
    """Pretrain (or find) the model for (corpus, cfg). Returns the model folder; `final/` exists on return.

    `keep_checkpoints`: how many Train checkpoints the finished model keeps (default: $ALIGNLAB_KEEP_CHECKPOINTS
    or 1); the others are deleted once `final/` exists (`prune_checkpoints`).

    `crash_at_step` is fault injection for the resume tests: rank 0 exits hard once, when it finishes
    that step, before reporting it (a marker file in the model folder makes it happen only once)."""
    import ray.data
    import ray.train
    from ray.train import CheckpointConfig, DataConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from alignlab.platform.ray_env import ensure_ray

    st = as_storage(root)
    cdir = Path(cdir)
    manifest = check_corpus_for(cfg, cdir)
    cid = manifest["corpus_id"]
    if "heldout" not in manifest:
        print(f"[pretrain] warning: corpus {cid} records no held-out task documents (built before the corpus-holdout "
              "rule): its models may have read the AD test snippets; rebuild it with `alignlab corpus build`", flush=True)
    requested = cfg.precision
    cfg = resolve_precision(cfg)  # the workers train at the precision the id names, wherever they run
    mid = model_id(cid, cfg)
    mdir = model_dir(st.local, mid)
    if model_finished(st, mid):
        return fetch_model(st, mid, weights=False)
    # A `final/` that is there but incomplete (a truncated model.pt, an interrupted upload) is made again below:
    # the rerun resumes the Train run from its last checkpoint and exports anew.
    if (reason := _diverged(st, mid)) is not None:
        raise NonFiniteLossError(f"pretraining of {mid} diverged before: {reason} (delete "
                                 f"{st.url(f'models/{mid}/{DIVERGED}')} to try again)")
    keep = keep_checkpoints or keep_checkpoints_default()
    ensure_ray()
    check_pretrain_resources(cfg)  # before anything is written: an impossible request would wait forever
    why = ""
    if requested == "auto":
        why = " (auto: GPU workers)" if cfg.use_gpu else \
            f" (auto: this CPU {'has' if cfg.precision == 'bf16' else 'lacks'} native bf16 matmuls)"
    print(f"[pretrain {mid}] precision {cfg.precision}{why}; global batch {cfg.batch_size * cfg.num_workers} "
          f"({cfg.num_workers} x {cfg.batch_size})", flush=True)
    write_json(mdir / "config.json", {"model_id": mid, "corpus_id": cid, "corpus_dir": str(cdir),
                                      "precision": cfg.precision, "requested_precision": requested,
                                      "global_batch_size": cfg.batch_size * cfg.num_workers, "pretrain": to_dict(cfg)})
    st.push_file(f"models/{mid}/config.json")
    # Shards are read where they are -- the local corpus folder, or the remote root (never copied to a node) --
    # in the manifest's order, so the row stream is the same on every run.
    base = st.ray_path(f"corpus/{cid}/shards") if st.remote else str(cdir / "shards")

    def shard_paths(split: str) -> list[str]:
        if "shards" in manifest:
            return [f"{base}/{name}" for name in manifest["shards"][split]]
        return sorted(str(p) for p in (cdir / "shards" / split).glob("*.parquet"))  # older manifests

    fs = st.ray_filesystem()
    datasets = {"train": ray.data.read_parquet(shard_paths("train"), filesystem=fs, num_cpus=0.25)}
    if shard_paths("eval"):
        datasets["eval"] = ray.data.read_parquet(shard_paths("eval"), filesystem=fs, num_cpus=0.25)
    resources = worker_resources(cfg)
    trainer = TorchTrainer(
        _train_fn,
        # The objective configs travel as objects too: a plugin objective's class reaches the workers by pickling,
        # where its name alone would be unknown (registry docstring).
        train_loop_config={"cfg": to_dict(cfg), "objectives": cfg.objectives, "storage": st.uri, "corpus_id": cid,
                           "corpus_dir": str(cdir), "model_id": mid, "crash_at_step": crash_at_step},
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu, resources_per_worker=resources),
        run_config=RunConfig(
            # The id is content-addressed, so reusing the name on a rerun resumes the same run on purpose.
            name=name, storage_path=st.ray_path(f"models/{mid}/ray"), storage_filesystem=fs,
            failure_config=FailureConfig(max_failures=max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
        ),
        datasets=datasets,
        dataset_config=DataConfig(datasets_to_split=["train"]),
    )
    try:
        trainer.fit()
    except Exception as e:
        if (reason := _diverged(st, mid)) is not None:  # one line, not Ray's nested worker traceback
            raise NonFiniteLossError(f"pretraining of {mid} stopped: {reason}") from e
        raise
    if not model_finished(st, mid):
        raise RuntimeError(f"pretraining of {mid} ended without writing {st.url(f'models/{mid}/final')}")
    if pruned := prune_checkpoints(st, mid, name, keep):
        print(f"[pretrain {mid}] finished; deleted {len(pruned)} older checkpoint(s), kept the last {keep}", flush=True)
    return fetch_model(st, mid, weights=False)


def _train_fn(config: dict) -> None:
    """Runs on every Train worker."""
    import ray.train
    from ray.train import Checkpoint
    from ray.train.torch import prepare_model

    from alignlab.platform.pretrain import Pretrainer, ProgressLine, train_loop
    from alignlab.platform.ray_env import post_progress
    from alignlab.platform.tokenizer import Tokenizer

    from alignlab.platform.corpus import CORPUS_SMALL_FILES_ONLY, MANIFEST

    cfg = pretrain_from_dict({**config["cfg"], "objectives": config["objectives"]})
    # Re-resolved on this node: a remote root's cache folder is this node's own.
    st, mid = resolve_root(config["storage"]), config["model_id"]
    if st.remote:
        st.pull(f"corpus/{config['corpus_id']}", marker=MANIFEST, exclude=CORPUS_SMALL_FILES_ONLY)
        cdir = corpus_dir(st.local, config["corpus_id"])
    else:
        cdir = Path(config["corpus_dir"])
    mdir = model_dir(st.local, mid)
    if (reason := _diverged(st, mid)) is not None:  # a retry after divergence: the same data diverges again
        raise NonFiniteLossError(reason)
    # Ray sets OMP_NUM_THREADS from the worker's CPUs (1 for fractions); set torch's threads explicitly.
    torch.set_num_threads(cfg.threads_per_worker or max(1, int(cfg.cpus_per_worker)))
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = "cuda" if cfg.use_gpu and torch.cuda.is_available() else "cpu"
    tok = Tokenizer(cdir / "tokenizer.model")
    wrap = (lambda m: prepare_model(m, move_to_device=False)) if world > 1 else None
    trainer = Pretrainer(cfg, tok, rank=rank, device=device, wrap=wrap)
    ck = ray.train.get_checkpoint()
    if ck:
        with ck.as_directory() as d:
            # weights_only: a checkpoint in a shared bucket must not be able to run code when loaded.
            trainer.load_state_dict(torch.load(Path(d) / "state.pt", weights_only=True))
    writer = None
    if rank == 0:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(mdir / "tensorboard"))
    shard = ray.train.get_dataset_shard("train")
    crash_at = config.get("crash_at_step")

    def epoch_batches(epoch: int):
        return shard.iter_batches(batch_size=cfg.batch_size, batch_format="numpy", drop_last=True,
                                  local_shuffle_buffer_size=cfg.batch_size * 4, local_shuffle_seed=cfg.seed + epoch,
                                  prefetch_batches=2)

    progress = ProgressLine(mid, cfg.max_steps, trainer.state.step) if rank == 0 else None

    def report(metrics: dict, checkpoint_now: bool) -> None:
        if progress is not None and (line := progress.update(metrics["step"], metrics["train/loss"])):
            post_progress(line)
        marker = mdir / ".crashed-once"
        if rank == 0 and metrics["step"] == crash_at and not marker.exists():
            marker.touch()
            if writer is not None:
                writer.flush()
            time.sleep(3)  # let the controller register the previous checkpoint, as a real later failure would
            os._exit(1)
        if writer is not None:
            for k, v in metrics.items():
                if k not in ("step", "epoch"):
                    writer.add_scalar(k, v, metrics["step"])
        if not checkpoint_now:
            ray.train.report(metrics)
            return
        if writer is not None and st.remote:
            writer.flush()
            st.push(f"models/{mid}/tensorboard")
        with tempfile.TemporaryDirectory() as d:
            ckpt = None
            if rank == 0:
                torch.save(trainer.state_dict(), Path(d) / "state.pt")
                ckpt = Checkpoint.from_directory(d)
            ray.train.report(metrics, checkpoint=ckpt)

    try:
        if trainer.state.step < cfg.max_steps:
            try:
                train_loop(trainer, epoch_batches, report=report, log_every=cfg.log_every)
            except NonFiniteLossError as e:
                write_json(mdir / DIVERGED, {"error": str(e), "rank": rank, "step": trainer.state.step})
                st.push_file(f"models/{mid}/{DIVERGED}")
                raise
        if rank == 0:
            eval_metrics = {}
            try:
                eval_shard = ray.train.get_dataset_shard("eval")
            except KeyError:
                eval_shard = None
            if eval_shard is not None:
                eval_metrics = trainer.evaluate(
                    eval_shard.iter_batches(batch_size=cfg.batch_size, batch_format="numpy"),
                    max_batches=cfg.eval_batches)
            for k, v in eval_metrics.items():
                writer.add_scalar(k, v, trainer.state.step)
            writer.flush()
            st.push(f"models/{mid}/tensorboard")
            _export(trainer, tok, mdir, eval_metrics)
            st.push(f"models/{mid}/final", last=(FINAL_MARKER,))
    finally:
        if writer is not None:
            writer.close()


def _export(trainer, tok, mdir: Path, eval_metrics: dict) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="final.", dir=mdir))
    torch.save(trainer.model.state_dict(), tmp / "model.pt")
    shutil.copy(tok.model_path, tmp / "tokenizer.model")
    counts = Path(tok.model_path).with_name("token_counts.npy")
    if counts.exists():
        shutil.copy(counts, tmp / "token_counts.npy")
    write_json(tmp / "eval.json", {"step": trainer.state.step, "precision": trainer.precision, **eval_metrics,
                                   "marker": MARKER})
    write_json(tmp / "model_config.json", {"model": dataclasses.asdict(trainer.cfg.model),
                                           "vocab_size": tok.vocab_size,
                                           "heads": list(trainer.model.heads.keys()),
                                           "pretrain": to_dict(trainer.cfg)})
    write_marker(tmp)  # last: the size of every file above
    publish_dir(tmp, mdir / "final")


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
                    st.pull_file(f"models/{f}")
    for cfg_file in sorted((st.local / "models").glob("*/config.json")):
        mdir = cfg_file.parent
        info = read_json(cfg_file)
        pre = info["pretrain"]
        row = {"model_id": info["model_id"], "size": f"{pre['model']['hidden']}x{pre['model']['num_layers']}",
               "objectives": "+".join(o["name"] for o in pre["objectives"]), "max_steps": pre["max_steps"],
               "precision": info.get("precision", pre.get("precision")), "finished": mdir.name in finished_at_root if st.remote else is_finished(mdir)}
        if (mdir / DIVERGED).exists():
            row["diverged"] = read_json(mdir / DIVERGED).get("error")
        if row["finished"]:
            ev = read_json(mdir / "final" / "eval.json")
            row.update({k: v for k, v in ev.items() if k.endswith(("accuracy", "perplexity"))})
        out.append(row)
    return out
