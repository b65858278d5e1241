"""The objective interface and the registry of objectives by name.

An ablation is leaving an objective out of a tuple: core code never asks which objective it is
handling. Each module in this folder defines one config dataclass, decorated with `@register`,
whose `build(tokenizer)` returns the objective. Modules are discovered by scanning this folder, so
adding an objective touches one new module and nothing else.

The verbs an objective may implement (defaults do nothing):
- corpus time:  `corpus_columns` names the shard columns it needs (checked before training).
- batch time:   `load(ex, rows)` copies its corpus columns into the example view; `corrupt(ex, rng)` edits the list-of-examples view before tensors are made
                (NSP swaps next segments); `add_labels(batch, ex, rng)` edits/extends the tensor
                batch (MLM masks inputs); both run in the data pipeline, not on the model.
- model time:   `edit_input(head, batch) -> batch`, called by the engine for every objective, in order, on the
                device batch *before the encoder runs* (inside the model's forward, so DDP sees it): an objective
                whose corruption needs a model -- RTD's generator fills masked positions with samples -- edits
                `input_ids` here and may add namespaced tensors for its own loss. The default returns the batch.
                Positions an objective corrupts and predicts at data time are marked with `lock_inputs(batch,
                mask)` (`batch["input_locked"]`, [B, T] bool), so that later edits leave them alone.
- model:        `num_classes` (how many classes its head chooses among; `loss_scaling="log_classes"` divides
                its loss by the log of it), `build_head(model_cfg, encoder)`, `loss_and_sums(head, hidden_BTH, batch)` returning
                a scalar mean loss and additive metric sums (all-reducible), `finalize(sums)` turning
                sums into accuracy and perplexity.
`example_format` says which inputs it trains on: "pair" = `[CLS] chunk [SEP] next [SEP]`,
"acronym" = `[CLS] acronym [SEP] chunk [SEP]`.
"""
from __future__ import annotations

import importlib
import math
import pkgutil
from typing import Any, ClassVar

import torch

_REGISTRY: dict[str, type] = {}


def register(config_cls: type) -> type:
    name = getattr(config_cls, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"{config_cls.__name__} needs a class attribute `name`")
    if name in _REGISTRY and _REGISTRY[name] is not config_cls:
        raise ValueError(f"objective name {name!r} registered twice")
    _REGISTRY[name] = config_cls
    return config_cls


def _discover() -> None:
    import alignlab.objectives as pkg

    for mod in pkgutil.iter_modules(pkg.__path__):
        if mod.name != "registry":
            importlib.import_module(f"alignlab.objectives.{mod.name}")


_DISCOVERED = False


def registered() -> dict[str, type]:
    global _DISCOVERED
    # A flag, not "is the registry empty": importing one objective module directly registers it alone.
    if not _DISCOVERED:
        _discover()
        _DISCOVERED = True
    return dict(_REGISTRY)


def objective_config(name: str, **overrides: Any) -> Any:
    reg = registered()
    if name not in reg:
        raise ValueError(f"unknown objective {name!r}: registered objectives are {', '.join(sorted(reg))}")
    return reg[name](**overrides)


def resolve_objectives(items: Any) -> tuple[Any, ...]:
    """Names ("mlm,nsp" or ("mlm", "nsp")) or config objects → a tuple of configs, unique names."""
    if isinstance(items, str):
        items = [s.strip() for s in items.split(",") if s.strip()]
    out = []
    for it in items:
        cfg = objective_config(it) if isinstance(it, str) else it
        if not hasattr(type(cfg), "name") or type(cfg) not in registered().values():
            raise ValueError(f"not an objective config: {cfg!r}")
        out.append(cfg)
    names = [type(c).name for c in out]
    if len(set(names)) != len(names):
        raise ValueError(f"objective listed twice in {names}")
    if not out:
        raise ValueError("at least one objective is needed")
    return tuple(out)


def objective_class(config: Any) -> type:
    """The Objective subclass a config builds (from its module), for checks that need no tokenizer."""
    import sys

    mod = sys.modules[type(config).__module__]
    for v in vars(mod).values():
        if isinstance(v, type) and issubclass(v, Objective) and v is not Objective and v.name == type(config).name:
            return v
    raise ValueError(f"no Objective class named {type(config).name!r} in {mod.__name__}")


def objective_from_dict(d: dict) -> Any:
    d = dict(d)
    return objective_config(d.pop("name"), **d)


class Objective:
    """Base class: defaults for the optional verbs."""

    name: ClassVar[str]
    example_format: ClassVar[str] = "pair"
    corpus_columns: ClassVar[tuple[str, ...]] = ()
    linked_only: ClassVar[bool] = False
    """True for objectives whose labels exist only for linked (Wikipedia) chunks."""
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


def lock_inputs(batch: dict, mask: Any) -> None:
    """Mark [B, T] positions (numpy bool) whose input token this objective corrupted and predicts: other
    objectives' input edits must leave them alone (`batch["input_locked"]`)."""
    locked = batch.get("input_locked")
    batch["input_locked"] = mask.copy() if locked is None else (locked | mask)


def classification_sums(logits_NC: torch.Tensor, labels_N: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Mean cross-entropy over rows whose label is not -100, and additive sums for metrics."""
    valid = labels_N != -100
    n = valid.sum()
    if n == 0:
        zero = logits_NC.sum() * 0.0
        return zero, {"count": zero.detach(), "correct": zero.detach(), "nll": zero.detach()}
    # ignore_index rather than selecting the valid rows: a boolean index copies the logits (for MLM a
    # [masked, vocab] matrix) and its backward scatters them back, ~40% of the loss's cost.
    lg = logits_NC.float()
    nll = torch.nn.functional.cross_entropy(lg, labels_N, reduction="sum", ignore_index=-100)
    with torch.no_grad():
        correct = ((lg.argmax(-1) == labels_N) & valid).sum()
    return nll / n, {"count": n.detach().float(), "correct": correct.float(), "nll": nll.detach()}


def classification_metrics(sums: dict[str, float]) -> dict[str, float]:
    n = float(sums.get("count", 0.0))
    if n == 0:
        return {"accuracy": float("nan"), "perplexity": float("nan"), "count": 0.0}
    return {"accuracy": float(sums["correct"]) / n, "perplexity": math.exp(float(sums["nll"]) / n), "count": n}
