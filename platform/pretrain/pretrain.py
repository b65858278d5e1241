"""Multi-objective pretraining: the plain-PyTorch step, evaluation and checkpoint state (the loop: loop.py).

No Ray here (docs/architecture.md#ray-at-the-edges): the Ray Train driver (`pretrain/driver.py`) and the tests drive it.
The total loss
is the weighted sum of the enabled objectives' losses (each optionally divided by the log of its
number of classes, `PretrainConfig.loss_scaling`); each unscaled term is logged as
`train/<objective>/loss`.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from alignlab.platform.config import PretrainConfig
from alignlab.platform.encoder import registry as _registry
from alignlab.platform.encoder.batching import Collator
from alignlab.platform.encoder.linear_cross_entropy import auto_chunk_rows
from alignlab.platform.encoder.model import AlignModel
from alignlab.platform.runtime.precision import resolve_precision
from alignlab.platform.runtime.throughput import batch_flops


EVAL_STEP_BASE = 1 << 40
"""Evaluation batches draw their on-the-fly labels from steps no training run reaches: fixed across evals."""


def build_objectives(cfg: PretrainConfig, tokenizer) -> dict:
    return {c.name: c.build(tokenizer) for c in cfg.objectives}


def loss_coefficients(cfg: PretrainConfig, objectives: dict) -> dict[str, float]:
    """Each objective's factor in the total loss: its weight, divided by log(num_classes) under
    `loss_scaling="log_classes"` (MUPPET §3.2: a uniform guess then costs 1 for every objective)."""
    coef = {}
    for name, obj in objectives.items():
        c = obj.weight
        if cfg.loss_scaling == "log_classes":
            n = int(obj.num_classes)
            if n < 2:
                raise ValueError(f"objective {name!r} declares {n} classes; log_classes scaling needs at least 2")
            c /= math.log(n)
        coef[name] = c
    return coef


def forward_objectives(model: AlignModel, objectives: dict, batch: dict[str, torch.Tensor]):
    """Every objective's model-time input edit, the encoder once, then every objective's head and loss.
    Module-level so DDP wraps one call."""
    for name, obj in objectives.items():
        batch = obj.edit_input(model.heads[name], batch)
    # A batch the host found unpadded (`Pretrainer.prepare`) attends without a mask: SDPA may then choose its
    # flash or memory-efficient kernel, and the device is never asked whether the mask is all ones.
    mask = batch["attention_mask"] if batch.get("has_padding", True) else None
    hidden = model.encoder(batch["input_ids"], batch["segment_ids"], mask)
    return {name: obj.loss_and_sums(model.heads[name], hidden, batch) for name, obj in objectives.items()}


class _Forward(torch.nn.Module):
    """Wraps AlignModel so that DDP sees the whole multi-objective forward as one module call."""

    def __init__(self, model: AlignModel, objectives: dict):
        super().__init__()
        self.model = model
        self.objectives = objectives

    def forward(self, batch):
        return forward_objectives(self.model, self.objectives, batch)


PLAIN_LOSS_BUDGET = 3 * 2**30
"""Bytes a head's plain loss (its logits and their gradient, `plain_loss_bytes`) may hold in a step before
`PretrainConfig.loss_chunk_rows` auto computes it in chunks instead (`auto_loss_chunk_rows`). 3 GiB: the 768x3 step
of 256 full rows at a 32K vocabulary stays plain eager and compiled (1.2 and 0.6 GiB); at the paper corpus's 111K
vocabulary it chunks eager (4.0 GiB) and stays plain compiled (2.0 GiB)."""


def plain_loss_bytes(rows: int, num_classes: int, *, compiled: bool, bf16: bool) -> int:
    """About what the plain loss of a head over `num_classes` outputs on `rows` rows holds at once in a training step:
    its logits kept for the backward pass, and their gradient. Eager, both are fp32 (`registry.classification_sums`
    upcasts the logits; cross-entropy keeps fp32 log-probabilities and makes an fp32 gradient; the bf16 copies beside
    them are not counted): 8 bytes a logit. Compiled, inductor fuses the upcast, the log-softmax and its gradient into
    the kernels that read the logits, which stay in the matmul's dtype: 4 bytes a logit under bf16, 8 in fp32. An
    estimate from how each mode runs, not a measurement: gpu_checks.sh's second call prints the peak memory of the
    step with and without chunks (docs/throughput.md#the-gpu-walk)."""
    return rows * num_classes * 2 * (2 if compiled and bf16 else 4)


def auto_loss_chunk_rows(rows: int, num_classes: int, *, device_type: str, compiled: bool, bf16: bool) -> int:
    """`PretrainConfig.loss_chunk_rows` auto (-1) for a head over `num_classes` outputs that scores at most `rows`
    rows a step: on a CUDA device, chunks of `linear_cross_entropy.auto_chunk_rows` where the plain loss would hold
    more than `PLAIN_LOSS_BUDGET` (`plain_loss_bytes`, which depends on eager vs compiled), else 0 (the plain loss).
    Why memory alone decides: the chunked loss runs the same three matrix products as the plain one, plus a launch
    series and an fp32 accumulation of the weight's gradient per chunk, so where the logits fit it is not expected
    to be faster; what it buys is the [rows, classes] logits never held at once. On a CPU always 0: there the logits
    are small and the plain loss is the one every CPU model (and the golden weights of tests/test_versions.py)
    trained with."""
    if device_type != "cuda" or plain_loss_bytes(rows, num_classes, compiled=compiled, bf16=bf16) <= PLAIN_LOSS_BUDGET:
        return 0
    return auto_chunk_rows(num_classes)


def use_bf16(precision: str, device: torch.device) -> bool:
    """Does a run at `precision` train in bf16 on `device` (`resolve_precision`; "auto" is fp32 on other kinds)?"""
    if precision == "auto" and device.type not in ("cpu", "cuda"):
        return False
    return resolve_precision(precision, gpu=device.type == "cuda") == "bf16"


def with_resolved_precision(cfg: PretrainConfig) -> PretrainConfig:
    """`cfg` with "auto" precision replaced by what it picks here (`resolve_precision`, on a GPU when `cfg.use_gpu`).
    A model's id and its training use the resolved value, so the same request on another kind of CPU may name (and
    train) another model."""
    if cfg.precision != "auto":
        return cfg
    return dataclasses.replace(cfg, precision=resolve_precision(cfg.precision, gpu=cfg.use_gpu))


def lr_lambda(cfg: PretrainConfig) -> Callable[[int], float]:
    def f(step: int) -> float:
        warm = min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0
        if cfg.decay == "linear":
            return warm * max(0.0, 1.0 - step / cfg.max_steps)
        if cfg.decay == "cosine":
            return warm * 0.5 * (1.0 + math.cos(math.pi * min(1.0, step / cfg.max_steps)))
        return warm

    return f


def make_optimizer(model: torch.nn.Module, cfg: PretrainConfig) -> torch.optim.Optimizer:
    """Adam with the config's betas and eps; AdamW when weight decay is on, decaying only matrices and embeddings
    (BERT's rule: biases and LayerNorm parameters are 1-d and exempt).

    Fused (one kernel over every parameter) on CPU and CUDA: on CPU PyTorch's default is a Python loop over the
    parameters, several times slower for the mini model than fused (benchmarks/throughput/adam_cpu.py; benchmarks/README.md)."""
    kw = dict(lr=cfg.lr, betas=cfg.adam_betas, eps=cfg.adam_eps)
    if {p.device.type for p in model.parameters()} <= {"cpu", "cuda"}:
        kw["fused"] = True
    if not cfg.weight_decay:
        return torch.optim.Adam(model.parameters(), **kw)
    params = list(model.parameters())
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], **kw)


@dataclass
class TrainState:
    step: int = 0
    """Optimizer steps done."""
    epoch: int = 0
    batches_in_epoch: int = 0
    """Data position: row batches consumed in the current pass over the shards."""
    phase: int = 0
    """0, or 1 in the domain phase (`PretrainConfig.domain_fraction`), whose passes are counted from epoch 0 again."""
    history: list = field(default_factory=list)
    num_tokens: int = 0
    """Real (non-padding) tokens this rank trained on, over all the run's lives (checkpointed)."""
    num_samples: int = 0
    """Rows this rank trained on, over all the run's lives."""
    num_flops: float = 0.0
    """Training FLOPs of this rank's batches (`throughput.batch_flops`, counted on the host per batch), over all the
    run's lives: what MFU and the run's record divide."""
    train_seconds: float = 0.0
    """Wall time inside `train_loop`, over all the run's lives up to the last checkpoint (start-up excluded)."""


HOST_ONLY = "host_only"
"""A prepared batch's list of the keys that stay on the host (`prepare_batch`): `Pretrainer.to_device` leaves them."""


def prepare_batch(batch: dict[str, torch.Tensor], labelled_keys: tuple[str, ...], *, pin: bool,
                  max_labelled: Callable[[str, int, int], int] | None = None) -> dict:
    """The host's part of a step, done before it:
    - whether the batch has padding (`has_padding`, a Python bool);
    - the labelled positions of the objectives' `labelled_keys` and their labels (`registry.labelled`). The device
      needs only these: the [B, T] label arrays stay on the host (`HOST_ONLY`; the FLOP count reads them there);
    - token-level integer tensors as int32 (half the bytes to copy; embeddings and gathers take int32 indices, and
      every value fits);
    - with `pin` (for a GPU), the tensors the device gets in pinned memory, so that the copy is asynchronous.
    Each answers on the host what the step would otherwise ask the device, waiting for it.
    `max_labelled(key, rows, width)` (static shapes, `PretrainConfig.compile`): pad each key's labelled positions to
    exactly that many (`Objective.max_labelled`). A batch without padding attends without a mask there too, so that
    SDPA may choose its fused kernel: a compiled step then has at most two graphs a width (padded or not; the
    recompile limit is raised to hold them, `Pretrainer._compile`)."""
    out = dict(batch)
    B, T = batch["attention_mask"].shape
    out["has_padding"] = not bool(batch["attention_mask"].all())
    host_only = []
    for key in labelled_keys:
        if key in out:
            rows = None if max_labelled is None else max_labelled(key, B, T)
            out[f"{key}.rows"], out[f"{key}.targets"] = _registry.labelled_rows(out[key].reshape(-1), rows)
            out[f"{key}.rows"] = out[f"{key}.rows"].to(torch.int32)
            host_only.append(key)
    for k, v in out.items():
        if k not in host_only and isinstance(v, torch.Tensor) and v.dtype == torch.int64 and v.dim() == 2:
            out[k] = v.to(torch.int32)
    if pin:
        out = {k: v.pin_memory() if isinstance(v, torch.Tensor) and k not in host_only else v for k, v in out.items()}
    out[HOST_ONLY] = tuple(host_only)
    return out


@dataclass(frozen=True)
class RankCollate:
    """How one rank turns its rows into batches, and nothing else of the trainer: picklable, so that collating
    processes (`PretrainConfig.collate_workers`) make exactly the batches the trainer's own thread would."""

    cfg: PretrainConfig
    main: Collator
    curriculum: Collator | None
    """The objectives' curriculum configs, for the first `PretrainConfig.curriculum_fraction` of the steps."""
    rank: int
    world: int
    labelled_keys: tuple[str, ...]

    def collator_at(self, step: int) -> Collator:
        return self.curriculum if self.cfg.curriculum_at(step) else self.main

    def prepare(self, batch: dict[str, torch.Tensor], *, pin: bool) -> dict:
        """`prepare_batch` for these objectives, with static shapes under `PretrainConfig.compile`."""
        return prepare_batch(batch, self.labelled_keys, pin=pin,
                             max_labelled=self.max_labelled if self.cfg.compile else None)

    def max_labelled(self, key: str, rows: int, width: int) -> int:
        """`Objective.max_labelled` of the objective whose label array `key` is: the larger of its main and its
        curriculum config's (a curriculum may mask more), so that a compiled run keeps one shape per width."""
        collators = [c for c in (self.main, self.curriculum) if c is not None]
        return max(o.max_labelled(key, rows, width) for c in collators for o in c.objectives if key in o.labelled_keys)

    def __call__(self, rows: dict, *, step: int, epoch: int = 0, max_len: int | None = None,
                 batches: int = 1) -> tuple[dict[str, torch.Tensor], list[str]]:
        """The batch of `rows` at `step` and the ids of its rows; `batches` > 1: the rows of that many steps,
        collated together (a length-bucketing window, bucketing.py)."""
        n = len(rows["doc_id"])
        if self.world > 1 and n != batches * self.cfg.worker_batch_size:
            raise ValueError(f"rank {self.rank} of {self.world} needs its {self.cfg.worker_batch_size} rows of the "
                             f"step's global batch of {self.cfg.batch_size}"
                             f"{f' for each of {batches} steps' if batches > 1 else ''}, got {n}")
        ids = [f"{d}#{c}" for d, c in zip(rows["doc_id"], rows.get("chunk_index", range(n)))]
        return self.collator_at(step)(rows, step=step, max_len=max_len, epoch=epoch), ids


def _int64(t: torch.Tensor) -> torch.Tensor:
    return t.long() if t.dtype == torch.int32 else t


class Pretrainer:
    """Model + objectives + optimizer + collator for one worker.

    Data parallelism (`world` > 1): each rank is given only its own rows of the step (`cfg.worker_batch_size` of
    them; the driver splits the stream, `pretrain.driver.data_config`) and collates them with its own key of the
    step's randomness (seed, rank, step), so no rank reads or collates another's rows. Each objective's mean loss
    is reweighted by the rank's share of the objective's global count (`reduce_counts`, an all-reduce), so that
    DDP's average of the ranks' gradients is the gradient of the mean loss over all the ranks' rows. With one
    worker, rank 0's key and the whole stream: what a single worker always trained on. With W workers the rows of
    a step and their labels depend on W (determinism is per seed, world size and precision)."""

    def __init__(self, cfg: PretrainConfig, tokenizer, *, rank: int = 0, world: int = 1, device: str = "cpu",
                 wrap: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
                 reduce_counts: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 word_embeddings: np.ndarray | None = None, compile_backend: str = "inductor"):
        if world != cfg.num_workers:
            raise ValueError(f"this run has {world} Train workers but its config says num_workers={cfg.num_workers}")
        self.cfg, self.tok, self.device = cfg, tokenizer, torch.device(device)
        self.rank, self.world, self.reduce_counts = rank, world, reduce_counts
        torch.manual_seed(cfg.seed)
        self.objectives = build_objectives(cfg, tokenizer)
        self.model = AlignModel(cfg.model, tokenizer.vocab_size, self.objectives).to(self.device)
        if (word_embeddings is not None) != bool(cfg.corpus_embeddings):
            raise ValueError(f"PretrainConfig.corpus_embeddings={cfg.corpus_embeddings} "
                             + ("needs the corpus's word_embeddings table (corpus_embeddings.word_embeddings)"
                                if cfg.corpus_embeddings else "is off, but a word_embeddings table was given"))
        if word_embeddings is not None:
            emb = self.model.encoder.tok.weight
            if tuple(word_embeddings.shape) != tuple(emb.shape):
                raise ValueError(f"word_embeddings table is {tuple(word_embeddings.shape)}; this model's embeddings "
                                 f"are {tuple(emb.shape)} (vocabulary x hidden)")
            with torch.no_grad():
                emb.copy_(torch.as_tensor(word_embeddings, dtype=emb.dtype))
        if world > 1:  # the same initial weights on every rank, then each rank's own dropout masks
            torch.manual_seed(cfg.seed * 1_000_003 + rank + 1)
        fwd = _Forward(self.model, self.objectives)
        self.forward = wrap(fwd) if wrap else fwd
        self.optimizer = make_optimizer(self.model, cfg)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        self._loss, self._clip = self._forward_loss, self._clip_gradients
        self._graphs = cfg.cuda_graphs and self.device.type == "cuda" and compile_backend == "inductor"
        if cfg.compile:
            self._compile(compile_backend)
        # Each rank its own stream of randomness over its own rows (rank 0's alone with one worker).
        def collator(objectives) -> Collator:
            # Under compile every batch is widened to the full length, to be cut to a static width (bucketing.py).
            return Collator(objectives, tokenizer, max_len=cfg.seq_len or cfg.model.max_len,
                            layout_fraction=cfg.layout_fraction, subword_alpha=cfg.subword_regularization_alpha,
                            seed=cfg.seed, rank=rank, pad_to_max_len=cfg.compile)

        self.collate = collator(list(self.objectives.values()))
        # The curriculum's early batches: the same collator with each objective's `curriculum()` config where it has
        # one (MLM: uniform masks).
        self.curriculum_collate = None
        if cfg.curriculum_fraction:
            self.curriculum_collate = collator([o.config.curriculum().build(tokenizer)
                                                if hasattr(o.config, "curriculum") else o
                                                for o in self.objectives.values()])
        self.labelled_keys = tuple(k for o in self.objectives.values() for k in o.labelled_keys)
        self.rank_collate = RankCollate(cfg, self.collate, self.curriculum_collate, rank, world, self.labelled_keys)
        self.state = TrainState()
        self.last_row_ids: list[str] = []
        """The rows (`doc_id#chunk_index`) this rank trained on at its last step."""
        self.autocast = use_bf16(cfg.precision, self.device)
        self.precision = "bf16" if self.autocast else "fp32"
        """The matmul precision this trainer actually uses (recorded in the model's eval.json)."""
        # Each head over a large output (MLM's decoder over the vocabulary) in chunks of rows or whole: as configured,
        # or by auto's rule (`auto_loss_chunk_rows`: on a GPU, only where the plain loss would not fit a budget).
        auto = self.auto_output_chunk_rows()
        for name, obj in self.objectives.items():
            obj.output_chunk_rows = auto[name] if cfg.loss_chunk_rows < 0 else cfg.loss_chunk_rows
        self.coefficients = loss_coefficients(cfg, self.objectives)
        self._sums: torch.Tensor | None = None
        """Per step since the last `read_metrics`, summed on the device: total loss, then each objective's loss,
        count and correct."""
        self._summed_steps = 0
        self._copy_stream = None
        """The CUDA stream batches are copied on (`to_device`), made at the first copy."""

    def auto_output_chunk_rows(self) -> dict[str, int]:
        """What `loss_chunk_rows` auto (-1) picks for each objective's head on this trainer: `auto_loss_chunk_rows` at
        the most rows the head scores in one of this worker's batches at full length (`Objective.max_labelled`; a head
        without labelled positions scores one row an example) and its number of classes."""
        rows, width = self.cfg.worker_batch_size, self.cfg.seq_len or self.cfg.model.max_len
        out = {}
        for name, obj in self.objectives.items():
            try:
                classes = obj.num_classes
            except NotImplementedError:  # a head that does not declare its classes is not a vocabulary-sized one
                classes = 0
            scored = max((obj.max_labelled(k, rows, width) for k in obj.labelled_keys), default=rows)
            out[name] = auto_loss_chunk_rows(scored, classes, device_type=self.device.type, compiled=self.cfg.compile,
                                             bf16=self.autocast)
        return out

    def batch_flops(self, batch: dict, seq_len: int) -> float:
        """The training FLOPs of a collated host batch at sequence length `seq_len` (`throughput.batch_flops`): the
        encoder's per real token, plus each objective's head on what it scores in this batch."""
        heads = sum(obj.head_flops(self.cfg.model, batch, seq_len=seq_len) for obj in self.objectives.values())
        return batch_flops(self.cfg.model, seq_len, int(batch["attention_mask"].sum()), heads)

    def to_device(self, batch: dict) -> dict:
        """The batch's tensors on this trainer's device, but those a prepared batch keeps on the host (`HOST_ONLY`).
        int32 tensors (`prepare_batch` halves what is copied) become int64 again on the device, so that the model and
        every objective see the dtypes collation made. On a GPU the copy runs on a stream of its own: on the compute
        stream it would wait behind the previous step's kernels, still queued there (the host runs ahead of the
        device), and the step's first kernels behind it; the compute stream waits only for the copy to finish."""
        keep = batch.get(HOST_ONLY, ())
        items = {k: v for k, v in batch.items() if k != HOST_ONLY and k not in keep}
        if self.device.type != "cuda":
            return {k: _int64(v.to(self.device)) if isinstance(v, torch.Tensor) else v for k, v in items.items()}
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(self.device)
        with torch.cuda.stream(self._copy_stream):
            copied = {k: v.to(self.device, non_blocking=True) for k, v in items.items() if isinstance(v, torch.Tensor)}
        compute = torch.cuda.current_stream(self.device)
        compute.wait_stream(self._copy_stream)
        for v in copied.values():
            v.record_stream(compute)  # made on the copy stream, used and freed on the compute stream
        return {k: _int64(copied[k]) if k in copied else v for k, v in items.items()}

    def batch(self, rows: dict, *, step: int, epoch: int = 0, max_len: int | None = None) -> dict[str, torch.Tensor]:
        """This rank's training batch at `step`: its own rows (`cfg.worker_batch_size` of them), collated."""
        batch, self.last_row_ids = self.rank_batch(rows, step=step, epoch=epoch, max_len=max_len)
        return batch

    def rank_batch(self, rows: dict, *, step: int, epoch: int = 0, max_len: int | None = None,
                   batches: int = 1) -> tuple[dict[str, torch.Tensor], list[str]]:
        """`batch` and the ids of its rows, changing no state of the trainer (the prefetch thread calls it).
        `batches` > 1: the rows of that many steps, collated together (a length-bucketing window, bucketing.py)."""
        return self.rank_collate(rows, step=step, epoch=epoch, max_len=max_len, batches=batches)

    def prepare(self, batch: dict[str, torch.Tensor]) -> dict:
        """`prepare_batch` for this trainer's objectives and device (off the training thread when prefetching)."""
        return self.rank_collate.prepare(batch, pin=self.device.type == "cuda")

    def collator_at(self, step: int) -> Collator:
        """The collator of optimizer step `step`: the objectives' curriculum configs early
        (`PretrainConfig.curriculum_fraction`; MLM's uniform masks), their own otherwise."""
        return self.rank_collate.collator_at(step)

    def _global_share(self, out: dict) -> dict[str, torch.Tensor | float]:
        """Each objective's factor that turns this rank's mean loss into its share of the global batch's mean
        (world x local count / global count; DDP then averages over the world). 1 on a single worker."""
        if self.world == 1 or self.reduce_counts is None:
            return {n: 1.0 for n in out}
        local = torch.stack([sums["count"].detach().float().reshape(()) for _, sums in out.values()])
        total = self.reduce_counts(local.clone())
        share = torch.where(total > 0, self.world * local / total.clamp_min(1.0), torch.ones_like(local))
        return dict(zip(out, share))

    def train_step(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """One step and its metrics (a host sync: the loop calls `step`, and `read_metrics` every log_every)."""
        self.step(batch)
        return self.read_metrics()

    def step(self, batch: dict) -> None:
        """One optimizer step on a collated (or `prepare`d) batch, without waiting for the device: its loss and
        counts are added to sums kept on the device, read by `read_metrics`."""
        if "has_padding" not in batch:
            batch = self.prepare(batch)
        self.forward.train()
        if self._graphs:  # a new step: the graphs' outputs of the last one may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        total, v = self._loss(self.to_device(batch))
        if self._graphs:  # kept past the next replay, which writes into the same memory
            v = v.clone()
        self.optimizer.zero_grad(set_to_none=True)
        total.backward()
        self._clip()
        self.optimizer.step()
        self.scheduler.step()
        self.state.step += 1
        self._sums = v if self._sums is None else self._sums + v
        self._summed_steps += 1

    def _forward_loss(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's forward pass on a device batch: (the weighted total loss, [total, then each objective's loss,
        count and correct] detached, for `read_metrics`)."""
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            out = self.forward(batch)
        share = self._global_share(out)
        total = sum(self.coefficients[n] * share[n] * loss for n, (loss, _) in out.items())
        parts = [total] + [x for loss, sums in out.values() for x in (loss, sums["count"], sums["correct"])]
        return total, torch.stack([x.detach().float().reshape(()) for x in parts])

    def _clip_gradients(self) -> None:
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)

    def _compile(self, backend: str) -> None:
        """`PretrainConfig.compile`: the step compiled whole. One worker: the forward pass with its losses and their
        weighted sum as one graph, whose backward pass AOTAutograd compiles with it, and the gradient clipping as a
        second. Several workers: DDP's forward is compiled (its gradient all-reduce runs in the backward pass; the
        counts' all-reduce that weights each rank's loss stays outside) and the clipping. Adam is torch's fused
        kernel over every parameter at once, which torch.compile deliberately does not trace (it stays one kernel
        either way). `dynamic=False`: one static graph per shape (the static widths and labelled rows keep them
        few, bucketing.py), not a symbolic one after the first new shape."""
        # One graph per (sequence length of the curriculum, static width, padded or not): 4 widths a length, two
        # lengths, both kinds of batch, with room; torch's default of 8 would fall back to eager mid-run.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 32)
        if self.world == 1:
            # `cuda_graphs`: the forward graph and its AOT backward replayed as CUDA graphs. Not the clipping: it
            # scales its inputs (the gradients) in place, which a CUDA graph would have to copy in and out.
            mode = "reduce-overhead" if self._graphs else None
            self._loss = torch.compile(self._forward_loss, backend=backend, dynamic=False, mode=mode)
        else:
            self.forward = torch.compile(self.forward, backend=backend, dynamic=False)
        self._clip = torch.compile(self._clip_gradients, backend=backend, dynamic=False)

    def read_metrics(self) -> dict[str, float]:
        """The steps since the last read: mean total and per-objective loss, accuracy over their counts, and the
        learning rate now. One host sync."""
        if self._sums is None:
            raise ValueError("read_metrics before any step since the last read")
        v, k = self._sums.tolist(), self._summed_steps
        self._sums, self._summed_steps = None, 0
        metrics = {"train/loss": v[0] / k, "lr": self.scheduler.get_last_lr()[0]}
        for i, name in enumerate(self.objectives):
            loss, n, correct = v[1 + 3 * i: 4 + 3 * i]
            metrics[f"train/{name}/loss"] = loss / k
            if n:
                metrics[f"train/{name}/accuracy"] = correct / n
        return metrics

    @torch.no_grad()
    def evaluate(self, row_batches: Iterable[dict], *, max_batches: int,
                 collate: Callable[..., dict] | None = None) -> dict[str, float]:
        """Accuracy and perplexity per objective on held-out chunks (dropout off, fixed randomness). `collate`:
        another collator than the training one (benchmarks score every recipe on the same examples and masks)."""
        self.model.eval()
        collate = collate or self.collate
        totals: dict[str, dict[str, float]] = {n: {} for n in self.objectives}
        for i, rows in enumerate(row_batches):
            if i >= max_batches:
                break
            batch = self.to_device(collate(rows, step=EVAL_STEP_BASE + i))
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
                out = forward_objectives(self.model, self.objectives, batch)
            for name, (_, sums) in out.items():
                for k, v in sums.items():
                    totals[name][k] = totals[name].get(k, 0.0) + float(v)
        result = {}
        for name, sums in totals.items():
            for k, v in self.objectives[name].finalize(sums).items():
                result[f"eval/{name}/{k}"] = v
        return result

    def rng_state(self) -> dict[str, torch.Tensor]:
        """This rank's random state: torch's CPU generator (dropout on a CPU) and, on a GPU, the device's generator
        (dropout and attention dropout there). The batches' own randomness is keyed by step and needs no state."""
        state = {"cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def state_dict(self, rng_by_rank: list[dict] | None = None) -> dict:
        """The checkpoint state. `rng_by_rank`: every rank's `rng_state`, in rank order (the driver gathers them);
        a single worker's own by default. Each rank draws its own dropout masks, so each must resume with its own."""
        if rng_by_rank is None:
            assert self.world == 1, "a data-parallel checkpoint needs every rank's random state"
            rng_by_rank = [self.rng_state()]
        assert len(rng_by_rank) == self.world
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.state.step, "epoch": self.state.epoch, "batches_in_epoch": self.state.batches_in_epoch,
            "phase": self.state.phase, "rng_by_rank": rng_by_rank,
            "num_tokens": self.state.num_tokens, "num_samples": self.state.num_samples,
            "num_flops": self.state.num_flops, "train_seconds": self.state.train_seconds,
        }

    def load_state_dict(self, sd: dict) -> None:
        self.model.load_state_dict(sd["model"])
        self.optimizer.load_state_dict(sd["optimizer"])
        self.scheduler.load_state_dict(sd["scheduler"])
        self.state.step, self.state.epoch, self.state.batches_in_epoch = sd["step"], sd["epoch"], sd["batches_in_epoch"]
        self.state.phase = sd.get("phase", 0)  # checkpoints from before the domain phase existed
        self.state.num_tokens, self.state.num_samples = sd.get("num_tokens", 0), sd.get("num_samples", 0)
        # A checkpoint from before FLOPs were counted per batch: its steps at the encoder's count alone.
        self.state.num_flops = sd.get("num_flops", batch_flops(self.cfg.model, self.cfg.seq_len or self.cfg.model.max_len,
                                                               self.state.num_tokens, 0.0))
        self.state.train_seconds = sd.get("train_seconds", 0.0)
        states = sd.get("rng_by_rank")
        if states is None:  # a checkpoint from before issue #56: rank 0's CPU state, restored on every rank
            mine = {"cpu": sd["torch_rng"]}
        elif len(states) != self.world:
            raise ValueError(f"this checkpoint holds the random state of {len(states)} ranks; this run has {self.world}")
        else:
            mine = states[self.rank]
        # .cpu(): the state may have been loaded onto the rank's device (map_location); generators take CPU bytes.
        torch.set_rng_state(mine["cpu"].cpu())
        if self.device.type == "cuda" and "cuda" in mine:
            torch.cuda.set_rng_state(mine["cuda"].cpu(), self.device)


def to_numpy_rows(table) -> dict:
    """A pyarrow table / pandas frame → the dict-of-columns rows `Collator` takes (tests, benchmarks)."""
    if hasattr(table, "to_pydict"):
        return {k: np.asarray(v, dtype=object) for k, v in table.to_pydict().items()}
    return {k: table[k].to_numpy() for k in table.columns}

