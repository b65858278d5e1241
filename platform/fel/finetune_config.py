"""FinetuneConfig: one FEL calculation's settings, its task names and options checked against the task registry
(`alignlab.platform.tasks.task`)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

HEADS = ("trained", "logistic")

from alignlab.platform.config import FEATURE_LAYERS, SCHEMES, SELECTION_MODES, WORD_POOLINGS, _choice, _positive
from alignlab.platform.tasks.task import _default_task, finetune_options, options_in_every_id, task_names

@dataclass(frozen=True, kw_only=True, slots=True)
class FinetuneConfig:
    """One FEL calculation's settings (paper §3.4 defaults)."""

    task: str = ""
    """A registered task's name; "" = the registry's default task (the one that declares `default = True`)."""
    budget: int = 200
    """Number of finetuning examples (n)."""
    scheme: str = "pred"
    keep_head: bool = True
    """Initialise CT's head from WHP's and AD's from PAD's when the model has them (the paper's non-* models)."""
    lr: float = 1e-4
    batch_size: int = 64
    dropout: float = 0.1
    max_epochs: int = 200
    patience: int = 20
    """Stop when neither the selection perplexity nor the selection accuracy has improved for this many epochs."""
    selection: str = "honest"
    """"honest": select epochs on a validation split carved from the budget, touch the test set once;
    "paper": select on the test set, as the paper did (for reproduction only)."""
    val_fraction: float = 0.2
    refit: bool = field(default=False, metadata={"omit_at_default": True})
    """Honest selection only: once the epochs are selected on the validation split, train again from the same
    initialisation on the whole budget (training + validation examples) to those epochs, and score and keep that.
    The context-free baselines are fitted on the whole budget, so with refit the model learns from as many
    labelled examples as they do (docs/fel.md). Not in a config's dict (nor its ids) when off."""
    feature_layers: str = field(default="last", metadata={"omit_at_default": True})
    """What the task heads read (`head_input`): "last", the encoder's output (the paper's); "all", the embedding
    output and every layer's side by side. Not in a config's dict (nor its ids) at "last", as word_pooling at "first"."""
    word_pooling: str = field(default="first", metadata={"omit_at_default": True})
    """A token task's (CT's) word vector: its "first" piece's (BERT's), or the "mean" of its pieces'."""
    head: str = field(default="trained", metadata={"omit_at_default": True})
    """The task head (`HEADS`): "trained", the paper's head, trained for epochs by Adam and its epochs
    selected; "logistic" (scheme `pred` only, honest selection), a linear head fitted by L2-regularised logistic
    regression on the frozen features, its penalty chosen by cross-validated log-loss inside the budget: no epochs,
    so no early perplexity minimum to stop at, and no kept pretrained head (docs/fel.md,
    benchmarks/statistics/fel_sensitivity.py). Not in a config's dict (nor its ids) at "trained"."""
    task_options: tuple[tuple[str, Any], ...] = ()
    """(name, value) of options the tasks themselves declare (`Task.finetune_options`, e.g. how a task's input is
    laid out), sorted; one at its default is dropped, so equal settings make equal configs. In the config's dict
    (and its ids) each is a key of its own (`to_dict`)."""
    fold: int = 0
    seed: int = 0

    def dict_form(self, out: dict) -> dict:
        """`to_dict`'s form: a task's options are keys of their own; those a task declares in every id (options
        that were FinetuneConfig fields before the tasks owned them) are there at their default too, so every
        id made before the move names the same calculation."""
        del out["task_options"]
        return {**out, **options_in_every_id(), **dict(self.task_options)}

    def __post_init__(self) -> None:
        if not self.task:
            object.__setattr__(self, "task", _default_task())
        _choice(self, "task", task_names())
        _choice(self, "scheme", SCHEMES)
        _choice(self, "selection", SELECTION_MODES)
        object.__setattr__(self, "task_options", _task_options(self.task_options))
        _choice(self, "feature_layers", FEATURE_LAYERS)
        _choice(self, "word_pooling", WORD_POOLINGS)
        _choice(self, "head", HEADS)
        if self.head == "logistic" and (self.scheme != "pred" or self.selection != "honest"):
            raise ValueError(f"FinetuneConfig.head='logistic' is fitted on frozen features with its penalty chosen "
                             f"inside the budget: it needs scheme 'pred' and honest selection (scheme is "
                             f"{self.scheme!r}, selection {self.selection!r})")
        if self.refit and self.selection != "honest":
            raise ValueError(f"FinetuneConfig.refit needs honest selection (its validation split); selection is "
                             f"{self.selection!r}")
        _positive(self, "budget", "lr", "batch_size", "max_epochs", "patience")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"FinetuneConfig.dropout must be in [0, 1), got {self.dropout}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"FinetuneConfig.val_fraction must be in (0, 1), got {self.val_fraction}")
        if self.fold < 0 or self.seed < 0:
            raise ValueError("FinetuneConfig.fold and seed must be >= 0")


def _task_options(given: Any) -> tuple[tuple[str, Any], ...]:
    """Validated (name, value) pairs of the tasks' declared finetuning options, sorted, defaults dropped."""
    declared = finetune_options()
    out = {}
    for name, value in dict(given).items():
        if name not in declared:
            known = ", ".join(sorted(declared)) or "none"
            raise ValueError(f"FinetuneConfig.task_options: no registered task declares the option {name!r} "
                             f"(declared: {known})")
        if value not in declared[name]:
            raise ValueError(f"FinetuneConfig.task_options: {name} must be one of {', '.join(map(repr, declared[name]))}, "
                             f"got {value!r}")
        if value != declared[name][0]:
            out[name] = value
    return tuple(sorted(out.items()))


def finetune_from_dict(d: dict) -> FinetuneConfig:
    """`to_dict`'s form back: keys that are not fields are the tasks' options."""
    fields = {f.name for f in dataclasses.fields(FinetuneConfig)}
    options = {k: v for k, v in d.items() if k not in fields}
    return FinetuneConfig(**{k: v for k, v in d.items() if k in fields and k != "task_options"},
                          task_options=(*d.get("task_options", ()), *options.items()))
