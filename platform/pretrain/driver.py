"""Ray edge of pretraining: a `TorchTrainer` whose workers stream their shard of the corpus and checkpoint, and
the export of the finished model to `final/`. Ids, markers and the model folder's layout are in `models.py`."""
from __future__ import annotations

import gc
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from alignlab.platform.config import PretrainConfig, pretrain_from_dict, to_dict
from alignlab.platform.corpus.corpus import (CORPUS_SMALL_FILES_ONLY, MANIFEST, check_corpus_fills_a_batch, shard_names,
                                           warn_if_corpus_repeats)
from alignlab.platform.corpus.corpus_embeddings import WORD_EMBEDDINGS, save, training_sequences, word_embeddings
from alignlab.platform.encoder.batching import rows_from_arrow
from alignlab.platform.encoder.tokenizer import Tokenizer
from alignlab.platform.pretrain import run_snapshot
from alignlab.platform.pretrain.domain_phase import check_domain_sources, rows_of_sources
from alignlab.platform.pretrain.loop import NonFiniteLossError, train_loop
from alignlab.platform.pretrain.models import (DIVERGED, FINAL_MARKER, check_corpus_for, diverged_reason, export_final,
                                               fetch_model, keep_checkpoints_default, model_finished, model_id,
                                               prune_checkpoints)
from alignlab.platform.pretrain.pretrain import Pretrainer, with_resolved_precision
from alignlab.platform.runtime import out_of_memory
from alignlab.platform.runtime.devices import use_device
from alignlab.platform.runtime.errors import USER_ERRORS, raised_in_worker
from alignlab.platform.runtime.progress import ProgressLine
from alignlab.platform.runtime.ray_env import own_sigint, ensure_ray, post_progress
from alignlab.platform.runtime.resources import RAY_DATA_CPUS, check_request, check_root_on_every_node
from alignlab.platform.runtime.throughput import run_throughput
from alignlab.platform.storage.disk_space import checkpoint_disk_full, no_space_left
from alignlab.platform.storage.locks import build_once
from alignlab.platform.storage.root import as_storage, resolve_root, Storage, write_json


def worker_resources(cfg: PretrainConfig) -> dict:
    """One Train worker's Ray resources (`use_gpu` alone would reserve only {"GPU": 1},
    docs/cluster.md#a-gpu-worker-needs-its-cpus-named): a whole GPU, or the fraction of one that a study packing
    small models side by side gives it (`gpus_per_worker`)."""
    resources = {"CPU": cfg.cpus_per_worker}
    if cfg.use_gpu:
        resources["GPU"] = cfg.gpus_per_worker
    return resources


def check_pretrain_resources(cfg: PretrainConfig) -> None:
    """Refuse, within seconds, a pretraining run the cluster can never schedule (issue #17): its workers, plus
    one CPU left for Ray Data's reads. Ray must be initialised."""
    check_request(f"pretraining ({cfg.num_workers} Train worker{'s' if cfg.num_workers != 1 else ''}"
                  f"{', use_gpu' if cfg.use_gpu else ''})", worker_resources(cfg), cfg.num_workers,
                  spare_cpus=RAY_DATA_CPUS,
                  hint="use a smaller preset, fewer workers or CPUs per worker, or a cluster that has them")


def pretrain(cdir: Path, cfg: PretrainConfig, root: Path | Storage, *, max_failures: int = 2, name: str = "train",
             after_step: Callable[..., None] | None = None, keep_checkpoints: int | None = None) -> Path:
    """Pretrain (or find) the model for (corpus, cfg). Returns the model folder; `final/` exists on return.

    `keep_checkpoints`: how many Train checkpoints the finished model keeps (default: $ALIGNLAB_KEEP_CHECKPOINTS
    or 1); the others are deleted once `final/` exists (`prune_checkpoints`).

    `after_step(rank=, step=, model_dir=, flush=, trainer=)` is called on every worker after each logged step
    (every `log_every` steps), before its metrics are written or checkpointed: the resume tests inject their crash through it, and the
    data-parallel tests read each rank's weights and rows (`trainer.last_row_ids`) there (production code carries
    no fault or probe of its own).
    It travels to the workers pickled, so it must be importable there or pickled by value."""
    st = as_storage(root)
    cdir = Path(cdir).resolve()  # the Train workers start in another working directory
    manifest = check_corpus_for(cfg, cdir)
    check_domain_sources(cfg, manifest)
    if cfg.max_steps:  # a run that trains (an untrained model is written here, without Ray)
        check_corpus_fills_a_batch(manifest, cfg)
        ensure_ray()
        check_root_on_every_node(st)  # before anything is written there: a local root on a multi-node cluster
    warn_if_corpus_repeats(manifest, cfg)
    cid = manifest["corpus_id"]
    if not manifest.get("holdout"):  # a study refuses such a corpus (holdout.require_holdout); a lone run is warned
        print(f"[pretrain] warning: corpus {cid} records no content holdout (built before the rule, or with "
              "hold_out_tasks off): its models may have read task test text; rebuild it with `alignlab corpus build` "
              "(docs/holdout.md)", flush=True)
    requested = cfg.precision
    cfg = with_resolved_precision(cfg)  # the workers train at the precision the id names, wherever they run
    mid = model_id(cid, cfg)
    if cfg.max_steps == 0:  # an untrained model: its initial weights, written here without Ray Train
        build_once(st, f"model-{mid}", lambda: model_finished(st, mid),
                   lambda: _write_untrained(st, cdir, cid, cfg, requested, mid), label=f"[pretrain {mid}]",
                   leftovers=(st.model(mid, "final.*"),))
        return fetch_model(st, mid, weights=False)
    build_once(st, f"model-{mid}", lambda: model_finished(st, mid),
               lambda: _pretrain_locked(st, cdir, manifest, cfg, requested, mid, max_failures=max_failures, name=name,
                                        after_step=after_step, keep_checkpoints=keep_checkpoints),
               label=f"[pretrain {mid}]",
               leftovers=(st.model(mid, "final.*"),))
    return fetch_model(st, mid, weights=False)


def _pretrain_locked(st: Storage, cdir: Path, manifest: dict, cfg: PretrainConfig, requested: str, mid: str, *,
                     max_failures: int, name: str, after_step, keep_checkpoints: int | None) -> None:
    """Train model `mid` (or resume its Train run) and export it; its lock is held."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    cid = manifest["corpus_id"]
    mdir = st.here(st.model(mid))
    # A `final/` that is there but incomplete (a truncated model.pt, an interrupted upload) is made again below:
    # the rerun resumes the Train run from its last checkpoint and exports anew.
    if (reason := diverged_reason(st, mid)) is not None:
        raise NonFiniteLossError(f"pretraining of {mid} diverged before: {reason} (delete "
                                 f"{st.url(st.model(mid, DIVERGED))} to try again)")
    keep = keep_checkpoints or keep_checkpoints_default()
    ensure_ray()
    check_pretrain_resources(cfg)  # before anything is written: an impossible request would wait forever
    why = ""
    if requested == "auto":
        why = " (auto: GPU workers)" if cfg.use_gpu else \
            f" (auto: bf16 {'trains faster' if cfg.precision == 'bf16' else 'is no faster'} on this CPU)"
    print(f"[pretrain {mid}] precision {cfg.precision}{why}; global batch {cfg.batch_size} "
          f"({cfg.num_workers} x {cfg.worker_batch_size})", flush=True)
    write_json(mdir / "config.json", {"model_id": mid, "corpus_id": cid, "corpus_dir": str(cdir),
                                      "precision": cfg.precision, "requested_precision": requested,
                                      "global_batch_size": cfg.batch_size, "pretrain": to_dict(cfg)})
    st.push_file(st.model(mid, "config.json"))

    def shard_paths(split: str) -> list[str]:
        return split_paths(st, cdir, cid, shard_names(cdir, manifest, split))

    fs = st.ray_filesystem()
    if cfg.corpus_embeddings and not (mdir / WORD_EMBEDDINGS).is_file():  # made once: a resumed run reuses it

        t0 = time.perf_counter()
        tok_size = Tokenizer(cdir / "tokenizer.model").vocab_size
        table = word_embeddings(training_sequences(shard_paths("train"), fs, tok_size), tok_size, cfg.model.hidden,
                                cfg.corpus_embeddings, seed=cfg.seed)
        save(mdir / WORD_EMBEDDINGS, table)
        st.push_file(st.model(mid, WORD_EMBEDDINGS))
        print(f"[pretrain {mid}] word embeddings from the corpus's co-occurrences in {time.perf_counter() - t0:.1f}s",
              flush=True)
    datasets = {"train": read_shards(shard_paths("train"), fs)}
    if cfg.domain_sources:  # the domain phase's rows, and the other rows for the steps before it
        datasets["domain"] = datasets["train"].map_batches(
            rows_of_sources, fn_args=(cfg.domain_sources, True), batch_format="pyarrow", num_cpus=0.25)
        datasets["train"] = datasets["train"].map_batches(
            rows_of_sources, fn_args=(cfg.domain_sources, False), batch_format="pyarrow", num_cpus=0.25)
    resources = worker_resources(cfg)
    trainer = TorchTrainer(
        worker_fn(st.uri),
        # The objective configs travel as objects too: a plugin objective's class reaches the workers by pickling,
        # where its name alone would be unknown (registry docstring).
        train_loop_config={"cfg": to_dict(cfg), "objectives": cfg.objectives, "storage": st.shown, "corpus_id": cid,
                           "corpus_dir": str(cdir), "model_id": mid, "after_step": after_step,
                           "eval_shards": shard_names(cdir, manifest, "eval")},
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu, resources_per_worker=resources),
        run_config=RunConfig(
            # The id is content-addressed, so reusing the name on a rerun resumes the same run on purpose.
            name=name, storage_path=st.ray_path(st.model(mid, "ray")), storage_filesystem=fs,
            failure_config=FailureConfig(max_failures=max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
        ),
        datasets=datasets,
        dataset_config=data_config(cfg, datasets),
    )
    out_of_memory.clear(st, mid)  # this attempt's own: an earlier one may have had a smaller device or more workers
    if note := run_snapshot.repair(st, mid, name):  # a disk that filled during the last attempt
        print(f"[pretrain {mid}] {note}", flush=True)
    try:
        with own_sigint():
            trainer.fit()
    except Exception as e:
        if (reason := diverged_reason(st, mid)) is not None:  # one line, not Ray's nested worker traceback
            raise NonFiniteLossError(f"pretraining of {mid} stopped: {reason}") from e
        _raise_if_out_of_memory(st, mid)
        if no_space_left(e):  # one line naming the folder, not the worker group's nested traceback
            raise checkpoint_disk_full(st.url(st.model(mid, f"ray/{name}")),
                                       None if st.remote else mdir / "ray" / name) from e
        if isinstance(inner := raised_in_worker(e), USER_ERRORS):  # the worker's own ValueError, not Ray's wrapping
            raise inner from e
        raise
    _raise_if_out_of_memory(st, mid)
    if (reason := diverged_reason(st, mid)) is not None:  # the workers stopped at a non-finite loss
        raise NonFiniteLossError(f"pretraining of {mid} stopped: {reason}")
    if not model_finished(st, mid):
        raise RuntimeError(f"pretraining of {mid} ended without writing {st.url(st.model(mid, 'final'))}")
    if pruned := prune_checkpoints(st, mid, name, keep):
        print(f"[pretrain {mid}] finished; deleted {len(pruned)} older checkpoint(s), kept the last {keep}", flush=True)


def _write_untrained(st: Storage, cdir: Path, cid: str, cfg: PretrainConfig, requested: str, mid: str) -> None:
    """Publish model `mid`, trained for zero steps: the weights its seed initialises (the Pretrainer every Train
    worker builds first), the corpus's tokenizer, no held-out metrics and a throughput record of no training. It
    costs seconds and no device time: the positive control of a study (`config.untrained`)."""
    mdir = st.here(st.model(mid))
    print(f"[pretrain {mid}] untrained: the model as initialised (seed {cfg.seed}), no pretraining", flush=True)
    write_json(mdir / "config.json", {"model_id": mid, "corpus_id": cid, "corpus_dir": str(cdir), "untrained": True,
                                      "precision": cfg.precision, "requested_precision": requested,
                                      "global_batch_size": cfg.batch_size, "pretrain": to_dict(cfg)})
    st.push_file(st.model(mid, "config.json"))
    tok = Tokenizer(cdir / "tokenizer.model")
    trainer = Pretrainer(cfg, tok)
    record = {"tokens_per_s": None, "samples_per_s": None, "mfu": None, "train_seconds": 0.0, "device_hours": 0.0,
              "num_devices": 0, "device": "none (untrained)", "precision": "none", "num_tokens": 0, "num_samples": 0}
    export_final(trainer, tok, mdir, {}, record)
    st.push(st.model(mid, "final"), last=(FINAL_MARKER,))


def _raise_if_out_of_memory(st: Storage, mid: str) -> None:
    if (line := out_of_memory.recorded(st, mid)) is not None:
        out_of_memory.clear(st, mid)
        raise out_of_memory.OutOfMemory(f"pretraining of {mid} stopped: {line}")


def split_paths(st: Storage, cdir: Path, cid: str, names: list[str]) -> list[str]:
    """The shard files `names` (relative to the corpus's `shards/`) where they are read: the local corpus folder, or
    the remote root (never copied to a node), as paths inside `st.ray_filesystem()`."""
    base = st.ray_path(st.corpus(cid, "shards")) if st.remote else str(Path(cdir) / "shards")
    return [f"{base}/{name}" for name in names]


def eval_batches(paths: list[str], filesystem, batch_size: int):
    """The held-out rows of the shard files `paths`, in their order, as pyarrow tables of `batch_size` rows (the last
    one shorter): the batches Ray Data's `iter_batches` gives over `read_shards(paths)`, read by rank 0 alone and
    lazily, since it scores only the first `eval_batches` of them. Not a Ray Data pipeline: for a few batches read
    once, its start (seconds on a small machine) cost more than the read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pending, held = [], 0
    for path in paths:
        source = filesystem.open_input_file(path) if filesystem is not None else path
        for chunk in pq.ParquetFile(source).iter_batches(batch_size=batch_size):
            pending.append(chunk)
            held += chunk.num_rows
            while held >= batch_size:
                table = pa.Table.from_batches(pending)
                yield table.slice(0, batch_size)
                rest = table.slice(batch_size)
                pending, held = rest.to_batches(), rest.num_rows
    if held:
        yield pa.Table.from_batches(pending)


def read_shards(paths: list[str], filesystem):
    """The rows of the shard files `paths`, in their order, in blocks fixed by the files alone (one read task per
    shard: `override_num_blocks`), never by the cluster. Why: the blocks decide which rows reach which rank
    (`streaming_split`) and what each rank's local shuffle buffer holds, so they must depend on the corpus only.
    Left to Ray, a read sizes its parallelism from the cluster: Ray 2.60's first-generation reader
    (`RAY_DATA_USE_DATASOURCE_V2=0`) asks for twice the cluster's CPUs and splits blocks to match, and a run under 4
    CPUs then trained on other batches than under 2 (tests/test_exact_at_any_shape.py). Its default reader lists
    each named file in a task of its own and reads the same blocks either way."""
    import ray.data

    return ray.data.read_parquet(paths, filesystem=filesystem, num_cpus=0.25, override_num_blocks=len(paths))


def data_config(cfg: PretrainConfig, datasets: dict):
    """How the row streams reach the workers. One worker: the whole stream, unsplit (the rows and order every
    single-worker model was trained on). Several: the training streams ("train", and "domain" when there is one)
    are split by Ray Data's `streaming_split(world, equal=True)`, so each rank reads and collates only its own
    rows (input bandwidth grows with the workers) and every rank gets the same number of rows, hence of steps.
    `preserve_order` makes which rows reach which rank, and in what order, the same on every run of the same
    world size (docs/cluster.md#streaming-split-gives-every-rank-the-same-number-of-rows), so a resumed rank skips
    exactly the batches its checkpoint consumed. The held-out rows are no Ray dataset: rank 0 reads and scores them
    alone (`eval_batches`)."""
    from ray.train import DataConfig

    if cfg.num_workers == 1:
        return DataConfig(datasets_to_split=[])
    split = [name for name in ("train", "domain") if name in datasets]
    options = DataConfig.default_ingest_options()
    options.preserve_order = True
    return DataConfig(datasets_to_split=split, execution_options={name: options for name in split})


def rank_batches(shard, cfg: PretrainConfig, epoch: int):
    """One epoch of a rank's rows (its `DataIterator` from `data_config`) in the batches of its share of a step.
    Arrow tables: the collation turns them into rows with each list column kept as one flat array
    (`batching.rows_from_arrow`; Ray Data's numpy format would make an array per row of every list column, on the
    worker's own cores), and they travel to collating processes without a Python object per row."""
    return shard.iter_batches(batch_size=cfg.worker_batch_size, batch_format="pyarrow", drop_last=True,
                              local_shuffle_buffer_size=cfg.worker_batch_size * 4, local_shuffle_seed=cfg.seed + epoch,
                              prefetch_batches=cfg.prefetch_batches)


def worker_fn(storage_uri: str) -> Callable[[dict], None]:
    """The Train workers' function, carrying the real storage root. Train V2 records `train_loop_config` in its
    run state (the dashboard, export events), so that config holds the root without credentials
    (`Storage.shown`) and the real one rides inside this function, pickled into the object store."""
    def train_fn(config: dict) -> None:
        _train_fn(config, storage_uri)

    return train_fn


def _train_fn(config: dict, storage_uri: str) -> None:
    """Runs on every Train worker."""
    import ray.train
    from ray.train import Checkpoint, CheckpointUploadMode
    from ray.train.torch import prepare_model

    cfg = pretrain_from_dict({**config["cfg"], "objectives": config["objectives"]})
    # Re-resolved on this node: a remote root's cache folder is this node's own.
    st, mid = resolve_root(storage_uri), config["model_id"]
    if st.remote:
        st.pull(st.corpus(config['corpus_id']), marker=MANIFEST, exclude=CORPUS_SMALL_FILES_ONLY)
        cdir = st.here(st.corpus(config["corpus_id"]))
    else:
        cdir = Path(config["corpus_dir"])
    mdir = st.here(st.model(mid))
    if (reason := diverged_reason(st, mid)) is not None:  # a retry after divergence: the same data diverges again
        raise NonFiniteLossError(reason)
    if out_of_memory.recorded(st, mid) is not None:  # the restart after a rank ran out of memory: stop at once
        return
    # Ray sets OMP_NUM_THREADS from the worker's CPUs (1 for fractions); set torch's threads explicitly.
    torch.set_num_threads(cfg.threads_per_worker or max(1, int(cfg.cpus_per_worker)))
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = rank_device()
    tok = Tokenizer(cdir / "tokenizer.model")
    wrap = (lambda m: prepare_model(m, move_to_device=False)) if world > 1 else None
    table = None
    if cfg.corpus_embeddings:  # written by the driver before the workers started
        if st.remote:
            st.pull_file(st.model(mid, WORD_EMBEDDINGS))
        table = np.load(mdir / WORD_EMBEDDINGS)
    trainer = Pretrainer(cfg, tok, rank=rank, world=world, device=str(device), wrap=wrap,
                         reduce_counts=_all_reduce_sum if world > 1 else None, word_embeddings=table)
    ck = ray.train.get_checkpoint()
    if ck:
        with ck.as_directory() as d:
            # weights_only: a checkpoint in a shared bucket must not be able to run code when loaded. map_location:
            # onto this rank's own device, not the device it was saved from (rank 0's GPU 0 for every rank).
            trainer.load_state_dict(torch.load(Path(d) / "state.pt", map_location=device, weights_only=True))
    writer = None
    if rank == 0:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(mdir / "tensorboard"))
    shard = ray.train.get_dataset_shard("train")
    after_step = config.get("after_step")

    domain = ray.train.get_dataset_shard("domain") if cfg.domain_sources else None

    def epoch_batches(epoch: int, of=shard):  # this rank's rows (data_config): batches of its share of the step
        return rank_batches(of, cfg, epoch)

    progress = ProgressLine(mid, cfg.max_steps, trainer.state.step) if rank == 0 else None

    def report(metrics: dict, checkpoint_now: bool) -> None:
        if progress is not None and (line := progress.update(metrics["step"], metrics["train/loss"])):
            post_progress(line)
        if after_step is not None:
            after_step(rank=rank, step=metrics["step"], model_dir=mdir, flush=writer.flush if writer else lambda: None,
                       trainer=trainer)
        if writer is not None:
            for k, v in metrics.items():
                if k not in ("step", "epoch", "phase"):
                    writer.add_scalar(k, v, metrics["step"])
        if not checkpoint_now:
            # Not reported to Ray Train: its report queue holds one result and the controller takes it at its health
            # check, every 2 s (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S), so `ray.train.report` every `log_every` steps
            # capped a small model at log_every / 2 s steps per second (the mini preset's 5 steps/s, ~4x slower than
            # its steps take). The metrics reach TensorBoard and the progress line above; checkpoints are reported.
            return
        if writer is not None and st.remote:
            writer.flush()
            st.push(st.model(mid, "tensorboard"))
        # Every rank's own random state (its dropout masks), gathered to rank 0, which writes the checkpoint.
        rng = [trainer.rng_state()] if world == 1 else _all_gather(trainer.rng_state())
        ckpt = None
        if rank == 0:
            # Written to this node's disk here; copied to the storage root by Ray Train's upload thread while the
            # ranks train on (ASYNC), so no rank waits for 0.6-1.3 GB to reach a bucket. Ray Train deletes the folder
            # once it is uploaded; an upload that fails fails the worker group like any error (and a full disk is
            # named by the driver, `checkpoint_disk_full`). The checkpoint counts once it is uploaded whole.
            d = tempfile.mkdtemp(prefix="alignlab-checkpoint-")
            torch.save(trainer.state_dict(rng_by_rank=rng), Path(d) / "state.pt")
            ckpt = Checkpoint.from_directory(d)
        ray.train.report(metrics, checkpoint=ckpt, checkpoint_upload_mode=CheckpointUploadMode.ASYNC)

    all_finite = (lambda ok: ok) if world == 1 else _agree(str(device), every=True)
    any_rank = (lambda flag: flag) if world == 1 else _agree(str(device), every=False)
    # What is alive now (Ray, torch, the model) lives as long as the worker: kept out of the garbage collector's
    # full passes, which the collation's many short-lived lists set off, so that each pass scans only new objects.
    gc.freeze()
    try:
        if trainer.state.step < cfg.max_steps:
            try:
                train_loop(trainer, epoch_batches, report=report, log_every=cfg.log_every, all_finite=all_finite,
                           any_rank=any_rank,
                           domain_batches=(lambda epoch: epoch_batches(epoch, domain)) if domain is not None else None)
            except NonFiniteLossError as e:
                if rank == 0:
                    write_json(mdir / DIVERGED, {"error": str(e), "step": trainer.state.step})
                    st.push_file(st.model(mid, DIVERGED))
                # Return, not raise: Train V2 retries a worker group after any error (FailureConfig), and the
                # same data diverges again. Every rank stopped at this step (all_finite); the driver reads
                # diverged.json and raises the one-line error.
                return
            except out_of_memory.ERRORS:
                # The same batch runs out of memory again: record the line and stop, not retry. A lone worker
                # returns; among several the others wait in a collective, so this one raises, and the restarted
                # group stops at once on the record (above).
                out_of_memory.record(st, mid, mdir, out_of_memory.pretrain_message(cfg, device, trainer.state.step))
                if world == 1:
                    return
                raise
        # Every rank's counts (all ranks reach this point, or none: they stop at the same step).
        # float64: exact for the token and row counts (below 2^53), and FLOPs pass 2^63 in a paper-scale run.
        counts = torch.tensor([trainer.state.num_tokens, trainer.state.num_samples, trainer.state.num_flops],
                              dtype=torch.float64, device=device)
        if world > 1:
            _all_reduce_sum(counts)
        throughput = run_throughput(trainer, int(counts[0]), int(counts[1]), float(counts[2]))
        if rank == 0:
            eval_metrics = {}
            if config["eval_shards"]:
                paths = split_paths(st, cdir, config["corpus_id"], config["eval_shards"])
                held_out = eval_batches(paths, st.ray_filesystem(), cfg.batch_size)
                eval_metrics = trainer.evaluate(map(rows_from_arrow, held_out), max_batches=cfg.eval_batches)
            for k, v in eval_metrics.items():
                writer.add_scalar(k, v, trainer.state.step)
            for k in ("tokens_per_s", "samples_per_s", "mfu", "device_hours"):
                if throughput[k] is not None:
                    writer.add_scalar(f"throughput/{k}", throughput[k], trainer.state.step)
            writer.flush()
            st.push(st.model(mid, "tensorboard"))
            export_final(trainer, tok, mdir, eval_metrics, throughput)
            print(f"[pretrain {mid}] {throughput['tokens_per_s']:,.0f} tokens/s, {throughput['samples_per_s']:,.1f} "
                  f"samples/s on {world} x {throughput['device']} ({throughput['precision']}), MFU "
                  f"{'unknown' if throughput['mfu'] is None else format(throughput['mfu'], '.1%')}, "
                  f"{throughput['device_hours']:.4f} device-hours", flush=True)
            st.push(st.model(mid, "final"), last=(FINAL_MARKER,))
    finally:
        if writer is not None:
            writer.close()


def rank_device() -> torch.device:
    """The device Ray Train assigned this rank, made current before the model is built. On a multi-GPU node every
    rank sees all the node's GPUs and a bare "cuda" is GPU 0 for all of them; `get_device` picks the rank's own
    (the CPU for CPU workers). prepare_model's DDP asks get_device too, so the model and DDP agree."""
    from ray.train.torch import get_device

    return use_device(get_device())


def _all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """The ranks' sum of `t` (Pretrainer's `reduce_counts`: each objective's count of scored items)."""
    import torch.distributed as dist

    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def _all_gather(obj) -> list:
    """Every rank's `obj`, in rank order (a checkpoint's per-rank random states: a few KB each)."""
    import torch.distributed as dist

    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _agree(device: str, *, every: bool) -> Callable[[bool], bool]:
    """`train_loop`'s `all_finite` (`every`: a MIN all-reduce of each rank's flag) or `any_rank` (a MAX) for
    data-parallel workers."""
    import torch.distributed as dist

    op = dist.ReduceOp.MIN if every else dist.ReduceOp.MAX

    def agree(ok: bool) -> bool:
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=op)
        return bool(flag.item())

    return agree
