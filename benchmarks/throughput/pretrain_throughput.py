"""Pretraining throughput on CPU: alignlab's step vs Hugging Face `BertForPreTraining`, and Ray's overhead.

Two measurements, both written to `benchmarks/results/pretrain_throughput.json`:

1. **Model step** (`--part models`): training tokens/s of one optimizer step (forward, backward, Adam,
   grad clipping; MLM on the masked positions + NSP) for the paper's sizes at sequence length 128,
   alignlab's real `Pretrainer.train_step` against `transformers.BertForPreTraining` at the same
   config, batch, vocabulary and thread count. The two run interleaved in rounds in this one
   process, so a change of machine load hits both. Both get the same `Collator` batches (HF's
   labels are the same masked positions spread over a [B, T] tensor, as HF expects). MFU is model
   FLOPs per step (the formula in `model_flops`, the same useful work for both) over the step time,
   as a fraction of the fp32 matmul peak measured in this run (a large `torch.mm`).
2. **Ray** (`--part ray`): the same step loop (`Pretrainer` + `train_loop`, collation included)
   fed by Ray Data under a 1-worker Ray Train `TorchTrainer` -- `pretrain.driver.pretrain` itself, on
   a synthetic parquet corpus in a temp dir -- against plain PyTorch on in-memory row batches.
   Step time is taken between the loop's first and last metric reports (TensorBoard wall times on
   the Ray side), so the fixed TorchTrainer start-up is excluded and reported separately. A third run puts
   back the engine's old `ray.train.report` at every logged step (`report_every_log`), whose wait for Train's
   2-second controller poll capped small models at `log_every` / 2 s steps per second.

The vocabulary is a real sentencepiece model (trained by `train_tokenizer` on a small synthetic
text, then padded with unused pieces to 32,000 so that the embedding, the tied MLM decoder and
Adam's state have the paper's size); the synthetic rows draw their ids uniformly from it. Every
row fills the 128 positions exactly (`[CLS] 63 [SEP] 62 [SEP]`), so no batch carries padding.

Run from the repo root (see benchmarks/README.md):
    python benchmarks/throughput/pretrain_throughput.py                 # everything (~15 min on 2 cores)
    python benchmarks/throughput/pretrain_throughput.py --part models --compile
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import gc
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from alignlab.platform.bench import bench_args, machine_info
from alignlab.objectives.masked_lm import MaskedLMConfig, decoder_flops
from alignlab.objectives.next_sentence import NextSentenceConfig
from alignlab.platform.config import MODEL_SIZES, PretrainConfig
from alignlab.platform.corpus.corpus import shard_schema
from alignlab.platform.corpus.corpus_embeddings import for_corpus
from alignlab.platform.encoder.registry import corpus_labellers
from alignlab.platform.encoder.tokenizer import Tokenizer, train_tokenizer
from alignlab.platform.presets import Preset
from alignlab.platform.pretrain.loop import train_loop
from alignlab.platform.pretrain.pretrain import Pretrainer, to_numpy_rows
from alignlab.platform.runtime.throughput import batch_flops

RESULTS = Path(__file__).resolve().parents[1] / "results" / "pretrain_throughput.json"
SIZES = ("256x1", "256x3", "512x2", "768x3")
VOCAB = 32_000
SEQ = 128
A_LEN, B_LEN = 63, 63  # [CLS] a [SEP] b [SEP], b cut to 62: every example is exactly SEQ tokens


# ---------------------------------------------------------------- inputs


def machine() -> dict:
    return {**machine_info.machine("transformers"), "torch": torch.__version__}


def heap_malloc() -> None:
    """Make glibc serve every allocation from its heap and keep freed memory there (no mmap, no trim).

    By default glibc maps each allocation above 128 KiB to fresh pages and unmaps it on free, so every
    large tensor of every step (activations, [N, V] logits and their gradients, Adam temporaries) pays
    a page fault per 4 KiB on first touch: on this VM, `torch.zeros(608, 32000)` took 56 ms fresh and
    11 ms on reused memory. Process-wide, so it helps alignlab and HF alike; it is what tcmalloc /
    jemalloc give PyTorch on CPU without a preload."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
    if not (libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)):
        raise RuntimeError("mallopt refused the heap-only settings")


load_average = machine_info.load_average


def make_tokenizer(folder: Path, vocab_size: int = VOCAB) -> Tokenizer:
    """A real sentencepiece model with `vocab_size` pieces: trained small, then padded with unused pieces."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, size=rng.integers(2, 9))) for _ in range(3000)]
    texts = [" ".join(rng.choice(words, size=40)) for _ in range(3000)]
    small = folder / "small.model"
    train_tokenizer(texts, small, vocab_size=1000)
    proto = pb.ModelProto()
    proto.ParseFromString(small.read_bytes())
    have = {p.piece for p in proto.pieces}
    i = 0
    while len(proto.pieces) < vocab_size:
        name = f"\u2581pad{i}"
        i += 1
        if name in have:
            continue
        p = proto.pieces.add()
        p.piece, p.score, p.type = name, -100.0, pb.ModelProto.SentencePiece.NORMAL
    path = folder / "tokenizer.model"
    path.write_bytes(proto.SerializeToString())
    tok = Tokenizer(path)
    assert tok.vocab_size == vocab_size, tok.vocab_size
    return tok


def synthetic_rows(tok: Tokenizer, n: int, seed: int = 0) -> pa.Table:
    """Shard rows with the real columns (corpus.shard_schema): 4 chunks per document, ids uniform."""
    rng = np.random.default_rng(seed)
    lo = int(tok.special_ids.max()) + 1
    a = rng.integers(lo, tok.vocab_size, size=(n, A_LEN))
    b = rng.integers(lo, tok.vocab_size, size=(n, B_LEN))
    text = "lorem ipsum dolor sit amet " * 16
    cols = {
        "doc_id": [f"doc{i // 4}" for i in range(n)], "lang": ["en"] * n, "kind": ["web"] * n,
        "chunk_index": [i % 4 for i in range(n)],
        "a_ids": [r.tolist() for r in a], "b_ids": [r.tolist() for r in b], "has_next": [True] * n,
        "a_text": [text] * n, "b_text": [text] * n,
        "whp_a": [None] * n, "whp_b": [None] * n, "pad_acronym": [None] * n, "pad_label": [None] * n,
    }
    return pa.Table.from_pydict(cols, schema=shard_schema(corpus_labellers()))


def pretrain_config(size: str, precision: str = "fp32", **kw) -> PretrainConfig:
    return PretrainConfig(model=MODEL_SIZES[size], objectives=(MaskedLMConfig(), NextSentenceConfig()),
                          batch_size=32, lr=1e-4, grad_clip=1.0, precision=precision, **kw)


# ---------------------------------------------------------------- FLOPs and peak


def model_flops(size: str, batch: int, seq: int, vocab: int, masked_tokens: float) -> float:
    """Model FLOPs of one training step of `batch` full rows of `seq` tokens with `masked_tokens` predicted positions:
    the one count of `throughput.batch_flops` (6 N + 12 L d T per token, and MLM's transform and decoder,
    6 (d^2 + d V), per predicted position); the NSP head's pooler (under 0.1%) is left out here."""
    m = MODEL_SIZES[size]
    return batch_flops(m, seq, batch * seq, decoder_flops(m.hidden, vocab, masked_tokens))


def matmul_peak(n: int = 4096, reps: int = 5, dtype: torch.dtype = torch.float32) -> float:
    """Best GFLOP/s of a large square torch.mm in `dtype` over `reps` timed calls."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    out = torch.empty(n, n, dtype=dtype)
    torch.mm(a, b, out=out)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        torch.mm(a, b, out=out)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


# ---------------------------------------------------------------- model step


class HFStep:
    """`BertForPreTraining` at alignlab's config, trained like `Pretrainer`: the same optimizer class and
    settings as the alignlab trainer it is compared with (`optimizer_like`), grad clipping at 1.0."""

    def __init__(self, size: str, vocab: int, optimizer_like: torch.optim.Optimizer, *, seed: int = 0,
                 bf16: bool = False, device: str = "cpu"):
        self.bf16, self.device = bf16, device
        from transformers import BertConfig, BertForPreTraining

        m = MODEL_SIZES[size]
        torch.manual_seed(seed)
        cfg = BertConfig(vocab_size=vocab, hidden_size=m.hidden, num_hidden_layers=m.num_layers,
                         num_attention_heads=m.num_heads, intermediate_size=m.ffn, hidden_act="gelu",
                         hidden_dropout_prob=m.dropout, attention_probs_dropout_prob=m.dropout,
                         max_position_embeddings=m.max_len, type_vocab_size=2, layer_norm_eps=1e-12)
        self.model = BertForPreTraining(cfg).to(device)
        self.attn = getattr(self.model.config, "_attn_implementation", "?")
        self.optimizer = type(optimizer_like)(self.model.parameters(), **optimizer_like.defaults)

    @staticmethod
    def inputs(batch: dict) -> dict:
        return {"input_ids": batch["input_ids"], "token_type_ids": batch["segment_ids"],
                "attention_mask": batch["attention_mask"].long(), "labels": batch["mlm"],
                "next_sentence_label": batch["nsp"]}

    def step(self, inputs: dict) -> torch.Tensor:
        """One step; its loss stays on the device (reading it would make every GPU step wait for the host)."""
        self.model.train()
        with torch.autocast(torch.device(self.device).type, dtype=torch.bfloat16, enabled=self.bf16):
            loss = self.model(**inputs).loss  # as Pretrainer's precision="bf16"
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        return loss.detach()


def _opt_flags(opt: torch.optim.Optimizer) -> str:
    d = opt.defaults
    return ", ".join(f"{k}={d[k]}" for k in ("lr", "foreach", "fused") if k in d)


def bench_models(sizes, tok, rows: dict, *, steps: int, rounds: int, warmup: int, peak: float,
                 compile_model: bool, with_hf: bool, precision: str = "fp32") -> dict:
    out = {}
    for size in sizes:
        cfg = pretrain_config(size, precision)
        al = Pretrainer(cfg, tok)
        if compile_model:
            al.forward = torch.compile(al.forward)
        batches = [al.collate({k: v[i * 32:(i + 1) * 32] for k, v in rows.items()}, step=i) for i in range(4)]
        masked = statistics.mean(int((b["mlm"] != -100).sum()) for b in batches)
        tokens = batches[0]["input_ids"].numel()
        assert bool(batches[0]["attention_mask"].all()), "benchmark batches must carry no padding"
        flops = model_flops(size, 32, SEQ, tok.vocab_size, masked)
        hf = HFStep(size, tok.vocab_size, al.optimizer, bf16=precision == "bf16") if with_hf else None
        hf_inputs = [HFStep.inputs(b) for b in batches] if with_hf else None
        t_warm = time.perf_counter()
        for i in range(warmup):
            al.train_step(batches[i % 4])
        warm_al = time.perf_counter() - t_warm
        for i in range(warmup if with_hf else 0):
            hf.step(hf_inputs[i % 4])
        times = {"alignlab": [], "hf": []}
        for r in range(rounds):
            order = ("alignlab", "hf") if r % 2 == 0 else ("hf", "alignlab")
            for who in order:
                if who == "hf" and not with_hf:
                    continue
                for i in range(steps):
                    t = time.perf_counter()
                    if who == "alignlab":
                        al.train_step(batches[i % 4])
                    else:
                        hf.step(hf_inputs[i % 4])
                    times[who].append(time.perf_counter() - t)
        row = {"tokens_per_step": tokens, "masked_tokens_per_step": masked,
               "model_gflop_per_step": round(flops / 1e9, 2), "warmup_s_alignlab": round(warm_al, 2)}
        for who, ts in times.items():
            if not ts:
                continue
            med = statistics.median(ts)
            row[f"{who}_step_s"] = round(med, 4)
            row[f"{who}_step_s_min"] = round(min(ts), 4)
            row[f"{who}_tokens_per_s"] = round(tokens / med, 1)
            row[f"{who}_mfu"] = round(flops / med / 1e9 / peak, 4)
        if with_hf:
            row["ratio"] = round(row["alignlab_tokens_per_s"] / row["hf_tokens_per_s"], 3)
            row["hf_attn_implementation"] = hf.attn
        row["optimizer"] = f"{type(al.optimizer).__name__}({_opt_flags(al.optimizer)})"
        out[size] = row
        print(f"{size:>6}  alignlab {row['alignlab_tokens_per_s']:8.0f} tok/s (MFU {row['alignlab_mfu']:.0%})"
              + (f"   HF {row['hf_tokens_per_s']:8.0f} tok/s (MFU {row['hf_mfu']:.0%})   ratio {row['ratio']:.2f}x"
                 if with_hf else "")
              + f"   [{row['model_gflop_per_step']} GFLOP/step, load {load_average()}]", flush=True)
        del al, hf, batches, hf_inputs
        gc.collect()
    return out


# ---------------------------------------------------------------- Ray vs plain


def write_corpus(folder: Path, tok_src: Path, table: pa.Table, num_files: int) -> Path:
    """A finished corpus folder as `pretrain.driver.pretrain` expects: manifest, tokenizer, train shards."""
    import shutil

    cdir = folder / "corpus"
    (cdir / "shards" / "train").mkdir(parents=True)
    shutil.copy(tok_src, cdir / "tokenizer.model")
    per = -(-table.num_rows // num_files)
    for i in range(num_files):
        pq.write_table(table.slice(i * per, per), cdir / "shards" / "train" / f"part-{i:05d}.parquet")
    (cdir / "manifest.json").write_text(json.dumps({"corpus_id": "bench-synthetic", "config": {}, "fingerprint": {},
                                                    "stats": {"rows": table.num_rows, "linked_documents": 0,
                                                              "chunks": {"train": table.num_rows}}}))
    return cdir


def _steady(points: list[tuple[int, float]]) -> tuple[float, int]:
    """Seconds per step between the first and the last (step, wall time) report."""
    (s0, t0), (s1, t1) = points[0], points[-1]
    return (t1 - t0) / (s1 - s0), s1 - s0


def plain_run(cfg: PretrainConfig, tok: Tokenizer, cdir: Path) -> dict:
    """The real loop on in-memory row batches, no Ray: what the Ray run is compared against."""
    table = pq.read_table(cdir / "shards" / "train")
    batches = [to_numpy_rows(table.slice(i, cfg.batch_size))
               for i in range(0, table.num_rows - cfg.batch_size + 1, cfg.batch_size)]
    torch.set_num_threads(cfg.threads_per_worker)
    trainer = Pretrainer(cfg, tok, word_embeddings=for_corpus(cdir, cfg, tok.vocab_size))
    points, last = [], {}

    def report(metrics: dict, checkpoint_now: bool) -> None:
        points.append((metrics["step"], time.perf_counter()))
        last.update(metrics)

    t = time.perf_counter()
    train_loop(trainer, lambda epoch: iter(batches), report=report)
    wall = time.perf_counter() - t
    step_s, n = _steady(points)
    return {"step_s": round(step_s, 4), "steps_timed": n, "wall_s": round(wall, 1),
            "data_wait_fraction": round(last["data_wait_fraction"], 4)}


def report_every_log(*, rank: int, step: int, **_) -> None:
    """The engine before the fix of 2026-11-24, put back for comparison: a `ray.train.report` at every logged step.
    Train V2's report queue holds one result, taken at the controller's 2-second health check, so each call waits
    for the next check."""
    import ray.train

    ray.train.report({"step": step})


def ray_run(cfg: PretrainConfig, cdir: Path, root: Path, *, env_vars: dict[str, str], after_step=None) -> dict:
    """`pretrain.driver.pretrain` on a fresh local Ray, timed from the loop's own reports (TensorBoard).

    The loop reports every `log_every` steps, each time with `data_wait_fraction` = waited / loop wall
    so far. From the first report (after step a) and the last (step b), with s the steady seconds per
    step: loop wall at a is L_a = a * s / (1 - f_a) (its steps plus its waits), the loop started
    L_a before report a (what precedes is start-up: Ray Train, Pretrainer, checkpoint lookup), the
    waiting up to a (mostly the first batch, i.e. the Ray Data pipeline starting) is f_a * L_a, and
    the steady waiting share is (f_b * L_b - f_a * L_a) / (t_b - t_a)."""
    import ray
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from alignlab.platform.pretrain.driver import pretrain
    from alignlab.platform.runtime.ray_env import quiet_ray_data

    t_init = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=1024**3,
             runtime_env={"env_vars": env_vars} if env_vars else None)
    quiet_ray_data()
    init_s = time.perf_counter() - t_init
    t_wall0, t = time.time(), time.perf_counter()
    mdir = pretrain(cdir, cfg, root, max_failures=0, after_step=after_step)
    fit_s = time.perf_counter() - t
    ray.shutdown()
    acc = EventAccumulator(str(mdir / "tensorboard"))
    acc.Reload()
    points = [(e.step, e.wall_time - t_wall0) for e in acc.Scalars("train/loss")]
    waits = [e.value for e in acc.Scalars("data_wait_fraction")]
    step_s, n = _steady(points)
    (a, t_a), (_, t_b), f_a, f_b = points[0], points[-1], waits[0], waits[-1]
    loop_a = a * step_s / (1 - f_a)
    steady_wait = (f_b * (loop_a + t_b - t_a) - f_a * loop_a) / (t_b - t_a)
    return {"step_s": round(step_s, 4), "steps_timed": n, "fit_wall_s": round(fit_s, 1),
            "ray_init_s": round(init_s, 1), "startup_s": round(t_a - loop_a, 1),
            "first_batches_wait_s": round(f_a * loop_a, 1), "after_last_step_s": round(fit_s - t_b, 1),
            "data_wait_fraction": round(f_b, 4), "data_wait_fraction_steady": round(max(steady_wait, 0.0), 4),
            "reports": [{"step": s, "since_fit_s": round(t, 2), "data_wait_fraction": round(w, 4)}
                        for (s, t), w in zip(points, waits)]}


def keep_at_idle_priority(stop) -> None:
    """Until `stop` is set, put every thread of every process descended from this one under SCHED_IDLE: the
    kernel then never lets them preempt a normal thread on waking, and runs them only on a core nothing else
    wants. A diagnostic: with Ray's processes so, what is left of their cost to the step is their CPU time, not
    the preemption of torch's threads. Each thread's policy is its own, hence the walk over /proc/PID/task."""
    idle = os.sched_param(0)
    while not stop.is_set():
        for pid in descendants(os.getpid()):
            try:
                for tid in os.listdir(f"/proc/{pid}/task"):
                    if os.sched_getscheduler(int(tid)) != os.SCHED_IDLE:
                        os.sched_setscheduler(int(tid), os.SCHED_IDLE, idle)
            except (FileNotFoundError, ProcessLookupError):
                pass  # it ended meanwhile
        stop.wait(0.5)


def descendants(root: int) -> list[int]:
    """The ids of the processes descended from `root`, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(entry))
    out, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def plain_beside_idle_ray(cfg: PretrainConfig, tok: Tokenizer, cdir: Path, folder: Path, *,
                          ray_at_idle_priority: bool = False) -> dict:
    """The plain loop in this process while an idle Ray Train run lives beside it on a fresh local Ray: its
    controller, a worker that has read one batch of the corpus and waits, the helper actors, Ray Data's and Ray's
    own processes. What Ray's processes cost the step when none of Ray's work is in the loop.
    `ray_at_idle_priority`: those processes run under SCHED_IDLE while the loop is timed (`keep_at_idle_priority`)."""
    import threading

    import ray
    import ray.data
    from ray.train import DataConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ready, done, stop = folder / "idle-ready", folder / "idle-done", threading.Event()

    def idle(config: dict) -> None:
        import ray.train

        next(iter(ray.train.get_dataset_shard("train").iter_batches(batch_size=cfg.batch_size)))
        Path(config["ready"]).touch()
        while not Path(config["done"]).exists():
            time.sleep(0.5)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=1024**3)
    fit = None
    try:
        trainer = TorchTrainer(
            idle, train_loop_config={"ready": str(ready), "done": str(done)},
            scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": cfg.cpus_per_worker}),
            run_config=RunConfig(name="idle", storage_path=str(folder / "idle-ray")),
            datasets={"train": ray.data.read_parquet(str(cdir / "shards" / "train"), num_cpus=0.25)},
            dataset_config=DataConfig(datasets_to_split=[]))
        fit = threading.Thread(target=trainer.fit, daemon=True)
        fit.start()
        deadline = time.monotonic() + 300
        while not ready.exists():
            if not fit.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the idle Ray Train run did not start")
            time.sleep(0.2)
        time.sleep(5)  # Ray Data's read and the start-up settle
        if ray_at_idle_priority:
            threading.Thread(target=keep_at_idle_priority, args=(stop,), daemon=True).start()
            time.sleep(2)
        return plain_run(cfg, tok, cdir)
    finally:
        stop.set()
        done.touch()
        if fit is not None:
            fit.join(timeout=120)  # the run ends on its own before Ray shuts down
        ray.shutdown()


def bench_ray(size: str, tok: Tokenizer, table: pa.Table, *, steps: int, num_files: int, malloc: str,
              corpus: Path | None = None, old_report: bool = True, prefetch_batches: int | None = None,
              beside_idle_ray: bool = False, ray_at_idle_priority: bool = False,
              threads: int | None = None) -> dict:
    """`corpus`: a finished corpus folder; the run is then the `mini` preset itself (its precision, sequence-length
    schedule, objectives and batch) on that corpus, the size and synthetic rows unused. `prefetch_batches`: instead
    of the config's. `beside_idle_ray`: also the plain loop beside an idle Ray Train run (`plain_beside_idle_ray`),
    with Ray's processes under SCHED_IDLE if `ray_at_idle_priority`. `threads`: torch threads of the training loop,
    in every arm, instead of the config's."""
    if corpus is None:
        cfg = pretrain_config(size, "fp32", max_steps=steps, checkpoint_every=steps, num_workers=1, cpus_per_worker=0.5,
                              threads_per_worker=2)
    else:
        cfg = dataclasses.replace(Preset.named("mini").pretrain, max_steps=steps, checkpoint_every=steps)
        tok = Tokenizer(corpus / "tokenizer.model")
    if prefetch_batches is not None:
        cfg = dataclasses.replace(cfg, prefetch_batches=prefetch_batches)
    if threads is not None:
        cfg = dataclasses.replace(cfg, threads_per_worker=threads)
    # The plain runs happen in this process (heap_malloc() already applied by main in "heap" mode);
    # Ray's workers get the same glibc settings through their environment.
    env_vars = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 30)} if malloc == "heap" else {}
    with tempfile.TemporaryDirectory(prefix="alignlab-bench-") as d:
        d = Path(d)
        cdir = corpus or write_corpus(d, Path(tok.model_path), table, num_files)
        before = plain_run(cfg, tok, cdir)
        print(f"ray    plain (before): {before}  load {load_average()}", flush=True)
        ray_res = ray_run(cfg, cdir, d / "storage", env_vars=env_vars)
        short = {k: v for k, v in ray_res.items() if k != "reports"}
        print(f"ray    TorchTrainer:   {short}  load {load_average()}", flush=True)
        old = None
        if old_report:
            old = ray_run(cfg, cdir, d / "storage-old", env_vars=env_vars, after_step=report_every_log)
            print(f"ray    TorchTrainer reporting every log step (before the fix): "
                  f"{ {k: v for k, v in old.items() if k != 'reports'} }  load {load_average()}", flush=True)
        beside = None
        if beside_idle_ray:
            beside = plain_beside_idle_ray(cfg, tok, cdir, d, ray_at_idle_priority=ray_at_idle_priority)
            print(f"ray    plain beside an idle Ray Train run{' (Ray at SCHED_IDLE)' if ray_at_idle_priority else ''}: "
                  f"{beside}  load {load_average()}", flush=True)
        after = plain_run(cfg, tok, cdir)
        print(f"ray    plain (after):  {after}  load {load_average()}", flush=True)
    plain_step = (before["step_s"] + after["step_s"]) / 2
    tokens = cfg.batch_size * SEQ
    return {"size": size if corpus is None else "mini", "precision": cfg.precision, "steps": steps,
            "batch": cfg.batch_size, "cpus_per_worker": cfg.cpus_per_worker, "prefetch_batches": cfg.prefetch_batches,
            "threads_per_worker": cfg.threads_per_worker, "rows": table.num_rows, "parquet_files": num_files,
            "plain_before": before, "plain_after": after, "ray": ray_res,
            "plain_tokens_per_s": round(tokens / plain_step, 1),
            "ray_tokens_per_s": round(tokens / ray_res["step_s"], 1),
            "ray_overhead": round(ray_res["step_s"] / plain_step - 1, 4),
            "plain_beside_idle_ray": beside, "ray_at_idle_priority": ray_at_idle_priority,
            "plain_beside_idle_ray_overhead": beside and round(beside["step_s"] / plain_step - 1, 4),
            "ray_reporting_every_log": old and {k: v for k, v in old.items() if k != "reports"},
            "ray_overhead_reporting_every_log": old and round(old["step_s"] / plain_step - 1, 4),
            "ray_data_wait_fraction_steady": ray_res["data_wait_fraction_steady"],
            "ray_data_wait_fraction_whole_run": ray_res["data_wait_fraction"],
            "ray_first_batches_wait_s": ray_res["first_batches_wait_s"],
            "ray_startup_s": ray_res["startup_s"]}


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=("all", "models", "ray"), default="all")
    p.add_argument("--sizes", default=",".join(SIZES), help="comma-separated hidden x layers labels")
    p.add_argument("--steps", type=int, default=4, help="timed steps per model per round")
    bench_args.add_flags(p, rounds=3, help={"rounds": "interleaved rounds (alignlab, HF, HF, alignlab, ...)"})
    p.add_argument("--warmup", type=int, default=2)
    bench_args.add_flags(p, threads=2)
    p.add_argument("--compile", action="store_true", help="also time alignlab under torch.compile (opt-in)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="both models' matmul precision: bf16 runs alignlab with precision='bf16' and HF under "
                        "the same CPU autocast; MFU is then against the bf16 matmul peak (section 'models_bf16')")
    p.add_argument("--no-hf", action="store_true", help="alignlab only (for profiling runs)")
    p.add_argument("--ray-size", default="256x1", help="model size of the Ray-vs-plain run")
    p.add_argument("--ray-steps", type=int, default=60)
    p.add_argument("--ray-corpus", type=Path, help="a finished corpus folder: the Ray part runs the mini preset on it")
    p.add_argument("--prefetch-batches", type=int,
                   help="the Ray part's PretrainConfig.prefetch_batches (default: the config's own)")
    p.add_argument("--beside-idle-ray", action="store_true",
                   help="also time the plain loop beside an idle Ray Train run: what Ray's own processes cost")
    p.add_argument("--ray-at-idle-priority", action="store_true",
                   help="with --beside-idle-ray: Ray's processes run under SCHED_IDLE (Linux) while that loop is timed")
    p.add_argument("--ray-threads", type=int,
                   help="torch threads of the Ray-vs-plain loops (all arms) instead of the preset's threads_per_worker")
    p.add_argument("--no-old-report", action="store_true",
                   help="skip the third Ray run (reporting every log step, as before that fix): a shorter run")
    p.add_argument("--malloc", choices=("default", "heap"), default="default",
                   help="heap: glibc never returns large tensors' pages to the OS (see heap_malloc), in this "
                        "process and in Ray's workers; figures go to the '*_heap_malloc' sections")
    bench_args.add_flags(p, out=RESULTS)
    args = p.parse_args(argv)
    if args.malloc == "heap":
        heap_malloc()
    torch.set_num_threads(args.threads)
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__)] + sys.argv[1:])
    sizes = [s for s in args.sizes.split(",") if s]
    for s in sizes + [args.ray_size]:
        if s not in MODEL_SIZES:
            raise SystemExit(f"unknown size {s!r}: choose from {', '.join(MODEL_SIZES)}")

    header = {"command": command, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(), "threads": args.threads, "malloc": args.malloc, "batch": 32, "seq_len": SEQ, "vocab": VOCAB,
              "load_average_start": load_average()}
    print(f"# {command}\n# {header['date']}  {header['machine']}\n# load average (1, 5, 15 min) at start: "
          f"{header['load_average_start']}", flush=True)
    result = json.loads(args.out.read_text()) if args.out.exists() else {}
    with tempfile.TemporaryDirectory(prefix="alignlab-tok-") as d:
        tok = make_tokenizer(Path(d))
        table = synthetic_rows(tok, 4096)
        dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
        if args.part in ("all", "models"):
            peak = matmul_peak(dtype=dtype)
            print(f"# {args.precision} matmul peak (4096^3 torch.mm, {args.threads} threads): {peak:.1f} GFLOP/s",
                  flush=True)
            rows = to_numpy_rows(table.slice(0, 128))
            models = bench_models(sizes, tok, rows, steps=args.steps, rounds=args.rounds, warmup=args.warmup,
                                  peak=peak, compile_model=False, with_hf=not args.no_hf, precision=args.precision)
            section = {**header, "precision": args.precision, "matmul_peak_gflops": round(peak, 1), "configs": models}
            if args.compile:
                t = time.perf_counter()
                section["compiled"] = bench_models(sizes, tok, rows, steps=args.steps, rounds=args.rounds,
                                                   warmup=args.warmup, peak=peak, compile_model=True, with_hf=False,
                                                   precision=args.precision)
                section["compiled_total_s"] = round(time.perf_counter() - t, 1)
            peak_end = matmul_peak(dtype=dtype)
            section["matmul_peak_gflops_end"] = round(peak_end, 1)
            # MFU against the higher of the two peaks (the conservative figure), recomputed if the end one won.
            best = max(peak, peak_end)
            section["mfu_peak_gflops"] = round(best, 1)
            for rows_ in (section["configs"], section.get("compiled", {})):
                for row in rows_.values():
                    for who in ("alignlab", "hf"):
                        if f"{who}_step_s" in row:
                            row[f"{who}_mfu"] = round(row["model_gflop_per_step"] / row[f"{who}_step_s"] / best, 4)
            section["load_average_end"] = load_average()
            print(f"# {args.precision} matmul peak at end: {peak_end:.1f} GFLOP/s; load {section['load_average_end']}",
                  flush=True)
            key = "models" if args.malloc == "default" else "models_heap_malloc"
            result[key + ("_bf16" if args.precision == "bf16" else "")] = section
        if args.part in ("all", "ray"):
            r = bench_ray(args.ray_size, tok, table, steps=args.ray_steps, num_files=4, malloc=args.malloc,
                          corpus=args.ray_corpus, old_report=not args.no_old_report,
                          prefetch_batches=args.prefetch_batches, beside_idle_ray=args.beside_idle_ray,
                          ray_at_idle_priority=args.ray_at_idle_priority, threads=args.ray_threads)
            key = "ray" if args.malloc == "default" else "ray_heap_malloc"
            label = args.ray_size if args.ray_corpus is None else "mini preset, real corpus"
            result.setdefault(key, {})[label] = {**header, **r, "load_average_end": load_average()}
            print(f"# Ray overhead {r['ray_overhead']:+.1%} per step ({r['ray_tokens_per_s']:.0f} vs "
                  f"{r['plain_tokens_per_s']:.0f} tok/s); data wait {r['ray_data_wait_fraction_steady']:.1%} "
                  f"steady, {r['ray_data_wait_fraction_whole_run']:.1%} over the whole run (first batch "
                  f"{r['ray_first_batches_wait_s']:.0f} s); start-up before the loop {r['ray_startup_s']:.0f} s"
                  + ("" if r["plain_beside_idle_ray_overhead"] is None else
                     f"; the plain loop beside an idle Ray Train run: {r['plain_beside_idle_ray_overhead']:+.1%}")
                  + ("" if r["ray_overhead_reporting_every_log"] is None else
                     f"; reporting every log step as before the fix: {r['ray_overhead_reporting_every_log']:+.1%}"),
                  flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(args.out)
    print(f"# wrote {os.path.relpath(args.out)}\n# command: {command}")


if __name__ == "__main__":
    main()
