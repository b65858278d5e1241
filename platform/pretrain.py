"""Multi-objective pretraining: the plain-PyTorch step, loop, evaluation and checkpoint state.

No Ray here (STYLE.md): `train_loop` takes an iterator of row batches, a `report` callable and a
`save` callable; the Ray Train driver (`pretrain_ray.py`) and the tests supply them. The total loss
is the weighted sum of the enabled objectives' losses (each optionally divided by the log of its
number of classes, `PretrainConfig.loss_scaling`); each unscaled term is logged as
`train/<objective>/loss`.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from alignlab.platform import registry as _registry  # noqa: F401 -- objective names resolve through it
from alignlab.platform.batching import Collator
from alignlab.platform.config import PretrainConfig
from alignlab.platform.model import AlignModel
from alignlab.platform.progress import ProgressLine  # noqa: F401 -- re-exported: callers import it from here
from alignlab.platform.throughput import run_throughput


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
    hidden = model.encoder(batch["input_ids"], batch["segment_ids"], batch["attention_mask"])
    return {name: obj.loss_and_sums(model.heads[name], hidden, batch) for name, obj in objectives.items()}


class _Forward(torch.nn.Module):
    """Wraps AlignModel so that DDP sees the whole multi-objective forward as one module call."""

    def __init__(self, model: AlignModel, objectives: dict):
        super().__init__()
        self.model = model
        self.objectives = objectives

    def forward(self, batch):
        return forward_objectives(self.model, self.objectives, batch)


def cpu_has_bf16() -> bool:
    """Does this CPU multiply bf16 natively (AVX512-BF16 or AMX)? Elsewhere bf16 autocast is emulated and slower."""
    try:
        flags = next((ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def use_bf16(precision: str, device: torch.device) -> bool:
    if precision == "auto":
        return device.type == "cuda" or (device.type == "cpu" and cpu_has_bf16())
    return precision == "bf16"


def resolve_precision(cfg: PretrainConfig) -> PretrainConfig:
    """`cfg` with "auto" precision replaced by what it picks here: "bf16" for GPU workers and on a CPU with
    native bf16 matmuls, "fp32" elsewhere. A model's id and its training use the resolved value, so the
    same request on a CPU without bf16 names (and trains) another model than on one with it."""
    if cfg.precision != "auto":
        return cfg
    return dataclasses.replace(cfg, precision="bf16" if cfg.use_gpu or cpu_has_bf16() else "fp32")


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
    parameters, 4.6 ms a step for the mini model against 0.7 ms fused (benchmarks/adam_cpu.py)."""
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
    train_seconds: float = 0.0
    """Wall time inside `train_loop`, over all the run's lives up to the last checkpoint (start-up excluded)."""


class Pretrainer:
    """Model + objectives + optimizer + collator for one worker.

    Data parallelism (`world` > 1): each rank is given only its own rows of the step (`cfg.worker_batch_size` of
    them; the driver splits the stream, `pretrain_ray.data_config`) and collates them with its own key of the
    step's randomness (seed, rank, step), so no rank reads or collates another's rows. Each objective's mean loss
    is reweighted by the rank's share of the objective's global count (`reduce_counts`, an all-reduce), so that
    DDP's average of the ranks' gradients is the gradient of the mean loss over all the ranks' rows. With one
    worker, rank 0's key and the whole stream: what a single worker always trained on. With W workers the rows of
    a step and their labels depend on W (determinism is per seed, world size and precision)."""

    def __init__(self, cfg: PretrainConfig, tokenizer, *, rank: int = 0, world: int = 1, device: str = "cpu",
                 wrap: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
                 reduce_counts: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 word_embeddings: np.ndarray | None = None):
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
        # Each rank its own stream of randomness over its own rows (rank 0's alone with one worker).
        def collator(objectives) -> Collator:
            return Collator(objectives, tokenizer, max_len=cfg.seq_len or cfg.model.max_len,
                            acronym_fraction=cfg.acronym_fraction, subword_alpha=cfg.subword_regularization_alpha,
                            seed=cfg.seed, rank=rank)

        self.collate = collator(list(self.objectives.values()))
        # The curriculum's early batches: the same collator with each objective's `curriculum()` config where it has
        # one (MLM: uniform masks).
        self.curriculum_collate = None
        if cfg.curriculum_fraction:
            self.curriculum_collate = collator([o.config.curriculum().build(tokenizer)
                                                if hasattr(o.config, "curriculum") else o
                                                for o in self.objectives.values()])
        self.state = TrainState()
        self.last_row_ids: list[str] = []
        """The rows (`doc_id#chunk_index`) this rank trained on at its last step."""
        self.autocast = use_bf16(cfg.precision, self.device)
        self.precision = "bf16" if self.autocast else "fp32"
        """The matmul precision this trainer actually uses (recorded in the model's eval.json)."""
        self.coefficients = loss_coefficients(cfg, self.objectives)

    def to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def batch(self, rows: dict, *, step: int, epoch: int = 0, max_len: int | None = None) -> dict[str, torch.Tensor]:
        """This rank's training batch at `step`: its own rows (`cfg.worker_batch_size` of them), collated."""
        n = len(rows["doc_id"])
        if self.world > 1 and n != self.cfg.worker_batch_size:
            raise ValueError(f"rank {self.rank} of {self.world} needs its {self.cfg.worker_batch_size} rows of the "
                             f"step's global batch of {self.cfg.batch_size}, got {n}")
        self.last_row_ids = [f"{d}#{c}" for d, c in zip(rows["doc_id"], rows.get("chunk_index", range(n)))]
        return self.collator_at(step)(rows, step=step, max_len=max_len, epoch=epoch)

    def collator_at(self, step: int) -> Collator:
        """The collator of optimizer step `step`: the objectives' curriculum configs early
        (`PretrainConfig.curriculum_fraction`; MLM's uniform masks), their own otherwise."""
        return self.curriculum_collate if self.cfg.curriculum_at(step) else self.collate

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
        self.forward.train()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            out = self.forward(self.to_device(batch))
        share = self._global_share(out)
        total = sum(self.coefficients[n] * share[n] * loss for n, (loss, _) in out.items())
        self.optimizer.zero_grad(set_to_none=True)
        total.backward()
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.state.step += 1
        metrics = {"train/loss": float(total.detach()), "lr": self.scheduler.get_last_lr()[0]}
        for name, (loss, sums) in out.items():
            metrics[f"train/{name}/loss"] = float(loss.detach())
            n = float(sums["count"])
            if n:
                metrics[f"train/{name}/accuracy"] = float(sums["correct"]) / n
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

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.state.step, "epoch": self.state.epoch, "batches_in_epoch": self.state.batches_in_epoch,
            "phase": self.state.phase, "torch_rng": torch.get_rng_state(),
            "num_tokens": self.state.num_tokens, "num_samples": self.state.num_samples,
            "train_seconds": self.state.train_seconds,
        }

    def load_state_dict(self, sd: dict) -> None:
        self.model.load_state_dict(sd["model"])
        self.optimizer.load_state_dict(sd["optimizer"])
        self.scheduler.load_state_dict(sd["scheduler"])
        self.state.step, self.state.epoch, self.state.batches_in_epoch = sd["step"], sd["epoch"], sd["batches_in_epoch"]
        self.state.phase = sd.get("phase", 0)  # checkpoints from before the domain phase existed
        self.state.num_tokens, self.state.num_samples = sd.get("num_tokens", 0), sd.get("num_samples", 0)
        self.state.train_seconds = sd.get("train_seconds", 0.0)
        torch.set_rng_state(sd["torch_rng"])


class NonFiniteLossError(ValueError):
    """A pretraining run whose loss went NaN or infinite: it stops, and its model is never exported."""


def train_loop(trainer: Pretrainer, epoch_batches: Callable[[int], Iterator[dict]], *,
               report: Callable[[dict, bool], None], log_every: int = 10,
               all_finite: Callable[[bool], bool] = lambda ok: ok,
               domain_batches: Callable[[int], Iterator[dict]] | None = None) -> TrainState:
    """Run until `max_steps`. `epoch_batches(epoch)` yields row batches of one pass over the data;
    `report(metrics, checkpoint_now)` is called every `log_every` steps and at every checkpoint step.
    A resumed trainer skips the batches its last checkpoint had consumed (exact data position).
    With a domain phase (`PretrainConfig.domain_fraction`), the steps from `cfg.domain_start_step` on take their
    rows from `domain_batches(epoch)` instead, its passes counted from 0 (`TrainState.phase`).

    `all_finite(ok)`: whether every rank's loss of this step is finite, given this rank's (data-parallel
    workers pass an all-reduce), so that all ranks stop at the same step and none waits in a collective."""
    cfg, st = trainer.cfg, trainer.state
    if cfg.domain_fraction and domain_batches is None:
        raise ValueError(f"PretrainConfig.domain_sources {'+'.join(cfg.domain_sources)}: train_loop needs "
                         "domain_batches for the domain phase")
    waited = 0.0
    t_start = time.perf_counter()
    seconds_before = st.train_seconds  # earlier lives' training time (a resumed run)
    while st.step < cfg.max_steps:
        if st.phase == 0 and st.step >= cfg.domain_start_step:
            st.phase, st.epoch, st.batches_in_epoch = 1, 0, 0
        stop_at, batches = (cfg.domain_start_step, epoch_batches) if st.phase == 0 else (cfg.max_steps, domain_batches)
        skip = st.batches_in_epoch
        it = iter(batches(st.epoch))
        consumed = 0
        while st.step < stop_at:
            t0 = time.perf_counter()
            try:
                rows = next(it)
            except StopIteration:
                break
            waited += time.perf_counter() - t0
            consumed += 1
            if consumed <= skip:
                continue
            st.batches_in_epoch = consumed
            batch = trainer.batch(rows, step=st.step, epoch=st.epoch, max_len=cfg.seq_len_at(st.step))
            # Counted on the host copy of the batch: no device sync.
            st.num_tokens += int(batch["attention_mask"].sum())
            st.num_samples += len(batch["attention_mask"])
            metrics = trainer.train_step(batch)
            st.train_seconds = seconds_before + time.perf_counter() - t_start
            if not all_finite(math.isfinite(metrics["train/loss"])):
                # Stop before reporting or checkpointing it: a diverged model must never be exported as finished.
                bad = {k: v for k, v in metrics.items() if k.endswith("/loss") and not math.isfinite(v)}
                raise NonFiniteLossError(
                    f"the training loss became non-finite at step {st.step} ({', '.join(f'{k} = {v}' for k, v in bad.items())},"
                    f" lr {metrics.get('lr', float('nan')):.3g}); lower the learning rate")
            ckpt = st.step % cfg.checkpoint_every == 0 or st.step == cfg.max_steps
            if ckpt or st.step % log_every == 0:
                wall = time.perf_counter() - t_start
                tp = run_throughput(trainer)
                metrics.update({"step": st.step, "epoch": st.epoch, "phase": st.phase,
                                "data_wait_fraction": waited / max(wall, 1e-9),
                                "throughput/tokens_per_s": tp["tokens_per_s"],
                                "throughput/samples_per_s": tp["samples_per_s"]})
                if tp["mfu"] is not None:
                    metrics["throughput/mfu"] = tp["mfu"]
                report(metrics, ckpt)
        else:
            continue  # this phase's last step is done: the next pass starts the domain phase, or the loop ends
        if consumed == 0:
            what = "the domain phase's rows" if st.phase else "the training shard"
            raise ValueError(f"{what} yielded no batches: the corpus is empty or smaller than one batch")
        st.epoch += 1
        st.batches_in_epoch = 0
    return st


def to_numpy_rows(table) -> dict:
    """A pyarrow table / pandas frame → the dict-of-columns rows `Collator` takes (tests, benchmarks)."""
    if hasattr(table, "to_pydict"):
        return {k: np.asarray(v, dtype=object) for k, v in table.to_pydict().items()}
    return {k: table[k].to_numpy() for k in table.columns}
