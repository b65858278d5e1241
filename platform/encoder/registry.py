"""The objective interface, and the registry: the one place where objective names become objects.

An ablation is leaving an objective out of a tuple: the engine never asks which objective it is handling.
Each objective module defines one config dataclass, decorated with `@register`, whose `build(tokenizer)`
returns the objective, an `Objective` subclass. The modules of `alignlab.objectives` (and of `alignlab.tasks`, the
bundled finetuning tasks, which register with `platform/tasks/task.py`) are discovered by scanning those packages,
so adding an objective there touches one new module and nothing else.

The verbs an objective may implement (defaults do nothing):
- corpus time:  `corpus_labels`, a `CorpusLabels` subclass: the shard columns it adds and how they are made (per
                word of a document, or per batch of chunk rows), fitted once on the corpus's tokenizer sample, and
                the statistics it adds to stats.json. The corpus stage calls it for every registered objective.
                `corpus_columns` names the shard columns the objective reads (checked before training).
- batch time:   `example_rows(rows)` says which rows may become examples of its own `example_format`;
                `load(ex, rows)` copies its corpus columns into the example view (`rows` is a dict of columns; a
                list column is a `batching.Ragged`, whose row i is a numpy view); `corrupt(ex, rng)` edits the
                list-of-examples view before tensors are made (NSP swaps next segments; a row's token list may
                be replaced or edited in place); `add_labels(batch, ex,
                rng)` edits/extends the tensor batch (MLM masks inputs); all run in the data pipeline. Every array an
                objective adds is per row ([B] or [B, T]): length bucketing cuts a collated window into
                batches by row (`bucketing.py`). `ex.epoch` is the pass over the corpus (PAD redraws its pairs
                after the first).
- model time:   `edit_input(head, batch) -> batch`, called by the engine for every objective, in order, on the
                device batch *before the encoder runs* (inside the model's forward, so DDP sees it): an objective
                whose corruption needs a model -- RTD's generator fills masked positions with samples -- edits
                `input_ids` here and may add namespaced tensors for its own loss. The default returns the batch.
                Positions an objective corrupts and predicts at data time are marked with `lock_inputs(batch,
                mask)` (`batch["input_locked"]`, [B, T] bool), so that later edits leave them alone.
- model:        `num_classes` (how many classes its head chooses among; `loss_scaling="log_classes"` divides
                its loss by the log of it), `build_head(model_cfg, encoder)`, `loss_and_sums(head, hidden_BTH, batch)`
                returning a scalar mean loss and additive metric sums (all-reducible), `finalize(sums)` turning
                sums into accuracy and perplexity. The loss is a mean over `sums["count"]` items: under data
                parallelism the engine reweights each worker's mean by its share of the global count.
- cost:         `head_flops(model_cfg, batch, seq_len=)`: the training FLOPs of its head on one collated host batch (MLM:
                6 (d^2 + d V) per predicted position), which the engine adds to the encoder's for MFU and the run's
                record; `expected_head_flops` (a classmethod) the same before any batch exists (`alignlab plan`).
                Both default to 0: an objective that declares neither is not counted (docs/throughput.md).
- config:       `curriculum()` (optional, on the config): the config the objective collates with during the first
                `PretrainConfig.curriculum_fraction` of the steps (MLM: uniform masks before rare-weighted ones).
`example_format` says which inputs it trains on: "pair" = `[CLS] chunk [SEP] next [SEP]`, or a layout of its own,
`[CLS] lead [SEP] chunk [SEP]`, on the rows `example_rows` allows, drawn with PretrainConfig.layout_fraction; it
writes the lead tokens (`Examples.lead`; PAD's "acronym" layout: the acronym).

Objectives outside `alignlab.objectives` (a plugin): define and `@register` the config in your own module and
import that module before naming the objective; the corpus stage then labels with it too (its name becomes part
of the corpus id). The corpus labelling actors and the training workers receive the objectives by pickling, not
by name, so they need the module's code: install the module on every node, or, for a module they cannot import
(a script, a test file), call `ray.cloudpickle.register_pickle_by_value(module)` before starting the work
(tests/test_new_objective.py does).
"""
from __future__ import annotations

import importlib
import math
import pkgutil
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from alignlab.platform.encoder.batching import IGNORE

PACKAGE = "alignlab.objectives"
"""The package whose modules are the bundled objectives (discovered by scanning it)."""
BUNDLED = (PACKAGE, "alignlab.tasks")
"""The packages scanned at discovery: the objectives, then the bundled finetuning tasks (CT, AD), a room of their own
whose modules register their tasks when imported."""

_REGISTRY: dict[str, type] = {}


PLUGIN_GROUP = "alignlab.plugins"
"""The entry-point group of installed packages that add objectives and tasks: each entry point names a module,
imported at discovery, whose `@register` / `@register_task` (or `task_kinds.declare_task`) calls add them."""


def provider(module: str) -> str:
    """The installed distribution(s) a module comes from, and the module, for a message ("mypkg (mypkg.objs)")."""
    from importlib.metadata import packages_distributions

    dists = packages_distributions().get(module.split(".")[0])
    return f"{', '.join(sorted(set(dists)))} ({module})" if dists else module


def clash(kind: str, name: str, old_module: str, new_module: str) -> ValueError:
    return ValueError(f"{kind} name {name!r} registered twice: by {provider(old_module)} and by "
                      f"{provider(new_module)}; uninstall one package or rename one {kind}")


def register(config_cls: type) -> type:
    name = getattr(config_cls, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"{config_cls.__name__} needs a class attribute `name`")
    old = _REGISTRY.get(name)
    if old is not None and old is not config_cls and not _same_class(old, config_cls):
        raise clash("objective", name, old.__module__, config_cls.__module__)
    config_cls._registered_objective = True
    _REGISTRY[name] = config_cls
    return config_cls


def _same_class(a: type, b: type) -> bool:
    return (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


def _known(cls: type) -> bool:
    """Whether `cls` is a registered objective config class. A plugin's class pickled by value arrives in a worker
    as a new class object whose module the worker may not have: it registers itself there on first use."""
    if not getattr(cls, "_registered_objective", False):
        return False
    known = registered().get(cls.name)
    if known is cls:
        return True
    if known is None or _same_class(known, cls):
        register(cls)
        return True
    return False


def is_plugin(config_cls: type) -> bool:
    """Registered from outside `alignlab.objectives`."""
    return not config_cls.__module__.startswith(PACKAGE + ".")


def _discover() -> None:
    for package in BUNDLED:
        pkg = importlib.import_module(package)
        for mod in pkgutil.iter_modules(pkg.__path__):
            importlib.import_module(f"{package}.{mod.name}")


def _load_plugins() -> None:
    """Import the module of every `alignlab.plugins` entry point of the installed packages, in name order."""
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: (e.name, e.value)):
        ep.load()


_DISCOVERED = False


def registered() -> dict[str, type]:
    """Name -> config class of every objective: the bundled ones by module name, then plugins by name (an order
    that does not depend on which module was imported first)."""
    global _DISCOVERED
    # A flag, not "is the registry empty": importing one objective module directly registers it alone.
    if not _DISCOVERED:
        _discover()
        # Set before the plugins load: a plugin module that asks the registry (declaring a task aligned with an
        # objective) sees the bundled objectives instead of starting discovery again.
        _DISCOVERED = True
        _load_plugins()
    order = sorted(_REGISTRY.items(), key=lambda kv: (is_plugin(kv[1]), kv[1].__module__, kv[0]))
    return dict(order)


def objective_names() -> set[str]:
    """The registered objectives' names (for a flag's `errors.name_list`, which asks only when the flag is read)."""
    return set(registered())


def objective_config(name: str, **overrides: Any) -> Any:
    reg = registered()
    if name not in reg:
        raise ValueError(f"unknown objective {name!r}: registered objectives are {', '.join(sorted(reg))}")
    return reg[name](**overrides)


def objective_from_dict(d: dict) -> Any:
    d = dict(d)
    return objective_config(d.pop("name"), **d)


def default_objectives() -> tuple[Any, ...]:
    """What a PretrainConfig that names no objective trains: the objectives whose config says `default_on`."""
    return tuple(cls() for cls in registered().values() if getattr(cls, "default_on", False))


def default_set() -> str:
    """The objective set the CLI and the study presets pretrain when told none ("mlm,nsp,whp,pad" with the bundled
    objectives): every objective whose config declares a `default_set_rank`, in that order."""
    ranked = sorted((cls.default_set_rank, name) for name, cls in registered().items()
                    if getattr(cls, "default_set_rank", None) is not None)
    return ",".join(name for _, name in ranked)


def resolve_objectives(items: Any) -> tuple[Any, ...]:
    """Names ("mlm,nsp" or ("mlm", "nsp")), dicts (`to_dict`'s form) or config objects → a tuple of configs
    with unique names; nothing → `default_objectives()`."""
    if isinstance(items, str):
        items = [s.strip() for s in items.split(",") if s.strip()]
    if not items:
        items = default_objectives()
    out = []
    for it in items:
        cfg = objective_config(it) if isinstance(it, str) else objective_from_dict(it) if isinstance(it, dict) else it
        if not _known(type(cfg)):
            raise ValueError(f"not an objective config: {cfg!r}")
        out.append(cfg)
    names = [type(c).name for c in out]
    if len(set(names)) != len(names):
        raise ValueError(f"objective listed twice in {names}")
    if not out:
        raise ValueError("at least one objective is needed")
    return tuple(out)




def objectives_like(names: Any, like: Sequence[Any] = ()) -> tuple[Any, ...]:
    """`resolve_objectives(names)`, where an objective given by name that `like` (a preset's configs) also has takes
    that one's settings: a study's objective subsets of a preset (the ablation's -WHP, -PAD) drop objectives without
    resetting the settings of the others."""
    mine = {type(c).name: c for c in like}
    if isinstance(names, str):
        names = [s.strip() for s in names.split(",") if s.strip()]
    items = list(names) or [type(c).name for c in default_objectives()]
    return resolve_objectives([mine.get(it, it) if isinstance(it, str) else it for it in items])


def layout_fraction_key() -> str:
    """The key of PretrainConfig.layout_fraction in config dicts and ids: the one the objectives with a layout of
    their own declare (`layout_fraction_key` of their config class; PAD's keeps its ids), else its field name."""
    keys = {k for cls in registered().values() if (k := getattr(cls, "layout_fraction_key", None))}
    if len(keys) > 1:
        raise ValueError(f"objectives declare different layout_fraction_key values: {', '.join(sorted(keys))}")
    return keys.pop() if keys else "layout_fraction"



def objective_class(config: Any) -> type:
    """The Objective subclass a config (or config class) builds, from its module, for checks that need no
    tokenizer."""
    cls = config if isinstance(config, type) else type(config)
    mod = sys.modules[cls.__module__]
    for v in vars(mod).values():
        if isinstance(v, type) and issubclass(v, Objective) and v is not Objective and v.name == cls.name:
            return v
    raise ValueError(f"no Objective class named {cls.name!r} in {mod.__name__}")


def corpus_labellers() -> list["CorpusLabels"]:
    """A fresh `CorpusLabels` of every registered objective that has corpus-time labels, in registry order."""
    out = []
    for name, cls in registered().items():
        labels = objective_class(cls).corpus_labels
        if labels is not None:
            lab = labels()
            lab.name, lab.plugin = name, is_plugin(cls)
            out.append(lab)
    return out


class CorpusLabels:
    """An objective's corpus-time labels: the shard columns it adds, how they are made, and their statistics.

    The corpus stage builds one per objective, calls `fit` once on the tokenizer sample (corpus-wide state),
    and pickles it to the labelling actors, which call `word_labels` per document and `label_rows` per batch
    of rows. Deterministic: all randomness comes from the generator passed in."""

    name: str = ""
    plugin: bool = False
    token_columns: ClassVar[tuple[str, str] | None] = None
    """Per-token label columns (int8 lists) for the row's chunk and its next chunk: the engine puts each word's
    label from `word_labels` on the word's first subword and IGNORE on its other subwords."""
    row_columns: ClassVar[dict[str, Any]] = {}
    """Column name -> pyarrow type of the columns `label_rows` fills in every row."""
    stats_columns: ClassVar[tuple[str, ...]] = ()
    """Shard columns `count` reads."""

    def shard_columns(self) -> dict[str, Any]:
        import pyarrow as pa

        cols = {c: pa.list_(pa.int8()) for c in self.token_columns or ()}
        return {**cols, **self.row_columns}

    def fit(self, sample: list[str]) -> None:
        """Corpus-wide state from the tokenizer's sample of document texts."""
        return None

    def word_labels(self, doc: Any, word_spans: list[tuple[int, int]]) -> np.ndarray | None:
        """One label per word of `doc` (spans from `text.split_words`), or None where the document has none."""
        return None

    def label_rows(self, rows: list[dict], rng: np.random.Generator) -> None:
        """Fill `row_columns` in every row of a batch of chunk rows (documents in order)."""
        return None

    def count(self, table: Any, acc: Counter) -> None:
        """Add a shard table's `stats_columns` to the running counts."""
        return None

    def stats(self, acc: Counter) -> dict:
        """stats.json entries from the counts over all shards."""
        return {}


class Objective:
    """Base class: defaults for the optional verbs."""

    name: ClassVar[str]
    example_format: ClassVar[str] = "pair"
    corpus_labels: ClassVar[type[CorpusLabels] | None] = None
    corpus_columns: ClassVar[tuple[str, ...]] = ()
    linked_only: ClassVar[bool] = False
    """True for objectives whose labels exist only for linked (Wikipedia) chunks."""
    labelled_keys: ClassVar[tuple[str, ...]] = ()
    """Its [B, T] label arrays whose labelled positions its loss gathers with `labelled(batch, key)`: the engine finds
    them on the host before the step, where `nonzero` costs no wait for the device, and sends the device only those
    positions and their labels (`key.rows`, `key.targets`), not the [B, T] array."""
    output_chunk_rows: int = 0
    """Rows per chunk for a head over a large output (a vocabulary): > 0 asks its training loss to be computed a chunk
    of rows at a time (`linear_cross_entropy.linear_cross_entropy_sums`: no [N, C] logits at once); 0 the whole
    logits. Set on each objective by the engine from `PretrainConfig.loss_chunk_rows` (a runtime setting: the same
    loss within float tolerance); an objective without such a head ignores it."""
    bert_pooler: ClassVar[bool] = False
    """True when this objective's head starts with BERT's pooler (a `pool` layer: dense + tanh on [CLS], as
    BERT's NSP head): `alignlab export` writes that layer as BertModel's pooler."""

    def __init__(self, config: Any, tokenizer: Any):
        self.config, self.tokenizer = config, tokenizer
        self.weight = float(getattr(config, "weight", 1.0))

    @property
    def num_classes(self) -> int:
        """How many output classes its head chooses among (MLM: the vocabulary; NSP, PAD: 2; WHP: 4). The engine's
        `loss_scaling="log_classes"` divides this objective's loss by log(num_classes) (MUPPET §3.2)."""
        raise NotImplementedError(f"objective {self.name!r} does not declare num_classes, which "
                                  "loss_scaling='log_classes' needs")

    def example_rows(self, rows: dict) -> list[bool]:
        """Which rows of a batch may become examples of this objective's `example_format` (asked only of
        objectives whose format is not "pair")."""
        return [False] * len(rows["doc_id"])

    def load(self, ex: Any, rows: dict) -> None:
        """Copy this objective's corpus columns into the example view."""
        return None

    def corrupt(self, ex: Any, rng: Any) -> None:
        return None

    def add_labels(self, batch: dict, ex: Any, rng: Any) -> None:
        return None

    def edit_input(self, head: torch.nn.Module, batch: dict) -> dict:
        """Model-time corruption of the encoder's input (see the module docstring); the default changes nothing."""
        return batch

    def build_head(self, model_cfg: Any, encoder: Any) -> torch.nn.Module:
        raise NotImplementedError  # every objective has a head; subclasses must define it

    def loss_and_sums(self, head: torch.nn.Module, hidden_BTH: torch.Tensor, batch: dict) -> tuple[torch.Tensor, dict]:
        raise NotImplementedError  # every objective has a loss; subclasses must define it

    def finalize(self, sums: dict[str, float]) -> dict[str, float]:
        return classification_metrics(sums)

    def max_labelled(self, key: str, rows: int, width: int) -> int:
        """The most positions of `batch[key]` (one of its `labelled_keys`) that a batch of `rows` rows `width` tokens
        wide can label. Under static shapes (`PretrainConfig.compile`) the engine pads the labelled positions to
        exactly this many, so that every batch of one width has one shape. Default: every position."""
        return rows * width

    def head_flops(self, model_cfg: Any, batch: dict, *, seq_len: int) -> float:
        """Training FLOPs of this objective's head (and any model of its own, RTD's generator) on one collated batch,
        counted on the host before the step (`throughput.matmul_flops`: 6 per matrix weight and scored item). The
        engine adds them to the encoder's `throughput.batch_flops`; 0 leaves the head uncounted."""
        return 0.0

    @classmethod
    def expected_head_flops(cls, config: Any, model_cfg: Any, vocab_size: int, *, seq_len: int, rows: float,
                            tokens: float) -> float:
        """`head_flops` of `rows` rows holding `tokens` real tokens in all, expected before any batch exists
        (`alignlab plan`; `config` is this objective's config, `vocab_size` the corpus's)."""
        return 0.0


def labelled_count(batch: dict, key: str) -> int:
    """How many positions of `batch[key]` (a [B, T] label array) are labelled (not IGNORE): the items a
    labelled-rows head scores (`head_flops`)."""
    labels = batch.get(key)
    return 0 if labels is None else int((labels != IGNORE).sum())


def lock_inputs(batch: dict, mask: Any) -> None:
    """Mark [B, T] positions (numpy bool) whose input token this objective corrupted and predicts: other
    objectives' input edits must leave them alone (`batch["input_locked"]`)."""
    locked = batch.get("input_locked")
    batch["input_locked"] = mask.copy() if locked is None else (locked | mask)


def classification_sums(logits_NC: torch.Tensor, labels_N: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Mean cross-entropy over rows whose label is not IGNORE, and additive sums for metrics."""
    valid = labels_N != IGNORE
    n = valid.sum()
    # No branch on n: a batch without labels sums no terms, and 0 / max(n, 1) is a zero loss with zero gradients
    # (asking the device whether n == 0 would make the host wait for it every step).
    # ignore_index rather than selecting the valid rows: a boolean index copies the logits (for MLM a
    # [masked, vocab] matrix) and its backward scatters them back, ~40% of the loss's cost.
    lg = logits_NC.float()
    nll = torch.nn.functional.cross_entropy(lg, labels_N, reduction="sum", ignore_index=IGNORE)
    with torch.no_grad():
        correct = ((lg.argmax(-1) == labels_N) & valid).sum()
    return nll / n.clamp_min(1), {"count": n.detach().float(), "correct": correct.float(), "nll": nll.detach()}


LABELLED_ROW_MULTIPLE = 32
"""`labelled_rows` pads the rows a head predicts to a multiple of this."""


def labelled_rows(labels_N: torch.Tensor, rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The flat positions whose label is not IGNORE and their labels, padded with position 0 and label IGNORE to a
    multiple of `LABELLED_ROW_MULTIPLE` rows, or to exactly `rows` (static shapes: `Objective.max_labelled`). Why: how many positions a batch labels (MLM's masks, WHP's linked
    tokens) changes every step, and on CPU oneDNN builds a kernel per matmul shape and keeps 1,024 of them; a mini
    pretraining run meets more shapes than that, keeps rebuilding kernels and grows its memory
    (figures: benchmarks/README.md, "Labelled rows on CPU").
    Padded to a multiple of 32, MLM's ~300-600 rows take a handful of shapes. The padded rows cost a few percent of
    a head's matmul and count nowhere: `classification_sums` skips IGNORE labels."""
    pos = torch.nonzero(labels_N != IGNORE).squeeze(1)
    if rows is not None and pos.numel() > rows:
        raise ValueError(f"a batch labels {pos.numel()} positions, more than the {rows} its objective's max_labelled "
                         "declares: the static shape would drop labels")
    # LABELLED_ROW_MULTIPLE is read at call time: the benchmark and a test set it.
    pad = (-pos.numel()) % LABELLED_ROW_MULTIPLE if rows is None else rows - pos.numel()
    if pad:
        pos = torch.cat([pos, pos.new_zeros(pad)])
    target = labels_N.index_select(0, pos)
    if pad:
        target[-pad:] = IGNORE
    return pos, target


def labelled(batch: dict, key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """`labelled_rows` of `batch[key]`, as the engine made them on the host (`Objective.labelled_keys`;
    `batch[key + ".rows"]`, `batch[key + ".targets"]`) or, for a batch made elsewhere, here."""
    rows = batch.get(f"{key}.rows")
    if rows is not None:
        return rows, batch[f"{key}.targets"]
    return labelled_rows(batch[key].reshape(-1))


def classification_metrics(sums: dict[str, float]) -> dict[str, float]:
    n = float(sums.get("count", 0.0))
    if n == 0:
        return {"accuracy": float("nan"), "perplexity": float("nan"), "count": 0.0}
    return {"accuracy": float(sums["correct"]) / n, "perplexity": math.exp(float(sums["nll"]) / n), "count": n}
