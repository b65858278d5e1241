"""The finetuning task interface and the registry of tasks by name.

A task (CT, AD, later more) is one object in a module of `tasks/`, registered with `@register_task`.
The engine (finetune, protocol, inference, CLI) looks tasks up by the name a config carries and asks them:
- model:     `make_head(hidden, dropout)`; `aligned_objective` names the pretraining objective whose head
             has the same shape (kept as the task head's initialisation; the study's "without it" row);
             `head_rank` orders the heads a task model creates (creation order draws the random init).
- encoding:  `encode(examples, tok, max_len, options) -> Encoded` (`options`: its `finetune_options` as set); `units(hidden, enc, pooling)` the hidden
             vectors and labels of the scored units (`unit` names them: "words", "pairs"; `pooling`: a word's
             first piece or the mean of its pieces, `head_input.HeadInput`).
- data:      `build_options`, `build_key(options)`, `folder_tag(options)` and `build_data(docs, seed=, options=)` make its
             files of the task folder; `data_files` (TaskData field -> file), `pool_and_test(data, fold)`,
             `search_groups(points)`, `search_pool_key(fold)`, `extra_tests(data)`; `multitask_partner` is
             the task whose data the multitask scheme trains on alongside.
- holdout:   `heldout_text(data)`: the texts and acronym definitions no corpus may hold (`holdout`).
- baselines: `baselines`, `baseline_context(data)` (what else they read) and `baseline_hits(train, test, **context)`
             (per test example, each scored unit right or not; `baseline_scores` derives the accuracies).
- evidence:  `test_unit(example)`, what one independent test unit is (`test_units` names it: "texts", "snippets"):
             the report's decision counts these as its test units, and honest validation splits never cut one.
             Optionally `parts` and `unit_part(examples)`: the parts a test set falls in, a unit at a time (AD: a
             snippet whose negative is a mutated acronym, or a pseudo acronym); the report reads every table by
             part, and tests its claims again on `aligned_part`.
- serving:   `serving_verbs` (Predictor methods it adds) and the `predict` CLI hooks.
The two head shapes the paper's tasks use (token tagging, [CLS] classification) are the base classes below.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from alignlab.platform.encoder.batching import IGNORE
from alignlab.platform.encoder.model import SequenceHead, TokenHead
from alignlab.platform.encoder.registry import registered, clash
from alignlab.platform.tasks import task_files
from alignlab.platform.tasks.holdout import HeldOutText
from alignlab.platform.tasks.task_files import TaskFormat

_TASKS: dict[str, "Task"] = {}


def _default_task() -> str:
    defaults = [t.name for t in registered_tasks() if t.default]
    if len(defaults) != 1:
        raise ValueError(f"exactly one registered task must declare default = True, got {defaults}")
    return defaults[0]


def register_task(cls: type) -> type:
    """Class decorator: register one instance of a Task subclass under its `name`."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"{cls.__name__} needs a class attribute `name`")
    if name in _TASKS and type(_TASKS[name]) is not cls:
        raise clash("task", name, origin(_TASKS[name]), cls.__module__)
    _TASKS[name] = cls()
    return cls


def register_instance(obj: "Task") -> "Task":
    """Register a task object (a task declared from files, `task_kinds.declare_task`)."""
    if obj.name in task_names():
        raise clash("task", obj.name, origin(task(obj.name)), origin(obj))
    _TASKS[obj.name] = obj
    return obj


def origin(t: "Task") -> str:
    """The module a task comes from: its class's, or the one that declared it from files."""
    return getattr(t, "declared_by", None) or type(t).__module__


def unregister(name: str) -> None:
    _TASKS.pop(name, None)


def _discover() -> None:
    registered()  # imports every module of objectives/, of tasks/ and of installed plugins


def registered_tasks() -> tuple["Task", ...]:
    """Every registered task, in `head_rank` order (the order a task model creates its heads in)."""
    _discover()
    return tuple(sorted(_TASKS.values(), key=lambda t: (t.head_rank, t.name)))


def task_names() -> tuple[str, ...]:
    return tuple(t.name for t in registered_tasks())


def task(name: str) -> "Task":
    """The registered task named `name` (a config value)."""
    _discover()
    if name not in _TASKS:
        raise ValueError(f"task must be one of {task_names()}, got {name!r}")
    return _TASKS[name]


def load_examples(name: str, path) -> list:
    """The examples of a task file (`TaskDataError` names every FILE:LINE: problem)."""
    return task(name).load_examples(path)


def validate_file(name: str, path) -> list[str]:
    return task(name).validate_file(path)


def example_key(obj: dict):
    """What makes a line of any task's file one example (None: no task's shape), for disjointness checks."""
    for i, t in enumerate(registered_tasks()):
        k = t.format.key(obj)
        if k is not None:
            return (i, k)
    return None


def check_disjoint(train_path, test_path) -> list[str]:
    """Problems if a test line repeats a training example (any task's file)."""
    return task_files.check_disjoint(example_key, train_path, test_path)


def head_for(name: str, hidden: int, dropout: float) -> torch.nn.Module:
    """A fresh head of a task, or of a task's aligned pretraining objective (the same shape)."""
    for t in registered_tasks():
        if name in (t.name, t.aligned_objective):
            return t.make_head(hidden, dropout)
    raise ValueError(f"no finetuning head named {name!r}")


@dataclass
class Encoded:
    """Padded inputs of a task's examples, and labels (per scored token, or per row)."""

    input_ids: torch.Tensor
    segment_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, idx) -> "Encoded":
        return Encoded(self.input_ids[idx], self.segment_ids[idx], self.attention_mask[idx], self.labels[idx])


@dataclass
class BuiltData:
    """What a task contributes to a task folder (`task_data.build_tasks`)."""

    files: dict[str, Any]
    """File name -> examples (written as JSONL) or text."""
    stats: dict
    """Top-level entries of the folder's stats.json."""
    heldout_doc_ids: set[str]
    """Corpus documents pretraining must not see (their text is, or gives away, a test answer)."""


class Task:
    """The interface; see the module docstring. Subclass `TokenTask` or `SequenceTask`, not this."""

    name: ClassVar[str]
    aligned_objective: ClassVar[str]
    multitask_partner: ClassVar[str]
    head_rank: ClassVar[int]
    unit: ClassVar[str]
    num_classes: ClassVar[int]
    baselines: ClassVar[tuple[str, ...]]
    data_files: ClassVar[dict[str, tuple[str, bool]]]
    """TaskData field -> (file name in the task folder, required)."""
    serving_verbs: ClassVar[tuple[str, ...]] = ()
    baseline_notes: ClassVar[str] = ""
    """What its context-free baselines (other than majority) are, for the report."""
    extra_test_notes: ClassVar[dict[str, str]] = {}
    """What each built-in extra test set (`extra_tests`) is, for the report."""
    default: ClassVar[bool] = False
    """The task a FinetuneConfig means when it names none (exactly one registered task declares it)."""
    plan_variance: ClassVar[dict[str, float | str] | None] = None
    """What `alignlab plan --detect` assumes of a claim on this task without a report to read (`report.power`):
    {"fold": a finetuning sample's variance, "units": the test units' part, "units_df": its degrees of freedom,
    "run_points": a pretraining run's shift sd in points per recipe, and optionally "run_from": the committed report
    with several pretraining runs it was measured from (without it, the plan says the run part is assumed)},
    accuracy 0-1 squared; None: the largest declared by another task."""

    def make_head(self, hidden: int, dropout: float) -> torch.nn.Module:
        raise NotImplementedError

    finetune_options: ClassVar[dict[str, tuple]] = {}
    """FinetuneConfig.task_options this task reads: name -> allowed values, the first the default (a flag each)."""
    options_in_every_id: ClassVar[tuple[str, ...]] = ()
    """Those in every FinetuneConfig's dict even at their default (were config fields: ids made before stay)."""

    def options(self, given: Any = ()) -> dict[str, Any]:
        """This task's `finetune_options` as set in `given` ((name, value) pairs or a dict), the rest at default."""
        given = dict(given)
        return {name: given.get(name, allowed[0]) for name, allowed in self.finetune_options.items()}

    def add_finetune_arguments(self, parser, seen: set) -> None:
        """`alignlab finetune`/`fel` flags for `finetune_options` (dest = its name), but those in `seen`."""
        for name, allowed in self.finetune_options.items():
            if name not in seen:
                seen.add(name)
                parser.add_argument("--" + name.replace("_", "-"), dest=name, choices=list(allowed), default=None,
                                    help=f"{self.name} option (default {allowed[0]})")

    def example_input(self, ex, tok, max_len: int, options: dict) -> tuple[list[int], list[int], Any]:
        """(ids, segment ids, label) of one example (an int or a per-token list); `options`: `self.options()`."""
        raise NotImplementedError

    def encode(self, examples, tok, max_len: int, options: Any = ()) -> Encoded:
        """`options`: FinetuneConfig.task_options (only this task's `finetune_options` are read)."""
        seqs, segs, labels = [], [], []
        opts = self.options(options)
        for ex in examples:
            ids, seg, lab = self.example_input(ex, tok, max_len, opts)
            seqs.append(ids)
            segs.append(seg)
            labels.append(lab)
        if not seqs:
            raise ValueError(f"no {self.name.upper()} examples to encode")
        T = max(len(s) for s in seqs)
        n = len(seqs)
        input_ids = torch.full((n, T), tok.pad_id, dtype=torch.long)
        segment_ids = torch.zeros((n, T), dtype=torch.long)
        mask = torch.zeros((n, T), dtype=torch.bool)
        for i, (s, g) in enumerate(zip(seqs, segs)):
            input_ids[i, : len(s)] = torch.tensor(s)
            segment_ids[i, : len(g)] = torch.tensor(g)
            mask[i, : len(s)] = True
        return Encoded(input_ids, segment_ids, mask, self._label_tensor(labels, n, T))

    def _label_tensor(self, labels: list, n: int, T: int) -> torch.Tensor:
        raise NotImplementedError

    def units(self, hidden: torch.Tensor, enc: Encoded, pooling: str = "first") -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden vectors of the scored units and their labels (`pooling`: `head_input.HeadInput.pooling`)."""
        raise NotImplementedError

    test_units: ClassVar[str] = "examples"
    """What one test unit is, in words for the report ("texts", "snippets")."""

    def test_unit(self, ex) -> str:
        """The test unit `ex` belongs to. Examples of one unit are not independent evidence (AD: a snippet's
        positive and negative pair), so the report's decision counts them as one and they never fall on
        both sides of a train/validation split. Default: each example is a unit of its own."""
        return repr(ex)

    def unit_rows(self, enc: Encoded) -> torch.Tensor:
        """The row of each scored unit (in `units` order)."""
        raise NotImplementedError

    parts: ClassVar[dict[str, str]] = {}
    """The parts its test units fall in (name -> what the part is, in words for the report); empty: none. Every
    calculation records each test unit's part (`task_scoring.parts_per_test_unit`), and the report gives each table's
    accuracy on each part beside the whole (`report.parts`)."""
    aligned_part: ClassVar[str | None] = None
    """The part (a key of `parts`) where the aligned objective's own rule decides the label (AD: positives against
    mutated negatives, which a perfect PAD solver tells apart): the report tests the study's claims on it again, as
    secondary tests. None: no such part."""

    zero_shot_head: ClassVar[bool] = False
    """True: its labels mean what its aligned objective's head predicts (AD's match is PAD's positive), so that head,
    as pretraining left it, can score its inputs zero-shot (`fel.zero_shot`, once per model). A head of the same shape
    is not enough: a declared tagging task aligned with WHP shares WHP's head shape, not its tags."""

    def unit_part(self, examples: list) -> str | None:
        """The part (a key of `parts`) of one test unit, from its examples (all of them, in test-set order); None:
        the unit is in no part (it counts in the whole only). Called only for a task with `parts`."""
        raise NotImplementedError

    # ---- data (paper §3.4's protocol)
    build_options: ClassVar[dict[str, Any]] = {}
    """Keyword options of `task_data.build_tasks` this task reads, with their defaults."""

    def add_build_arguments(self, parser) -> None:
        """`alignlab data build-tasks` flags for `build_options` (dest = the option's name)."""

    def build_key(self, options: dict) -> dict:
        """What this task's files depend on besides the documents and seed (part of the folder's id)."""
        return {}

    def folder_tag(self, options: dict) -> str:
        """A readable part of the task folder's name ("" for none)."""
        return ""

    def build_data(self, docs: list, *, seed: int, options: dict) -> BuiltData:
        raise NotImplementedError

    format: ClassVar[TaskFormat]
    """How this task's JSONL lines look: their problems, their parser, what makes two lines one example."""

    def load_examples(self, path) -> list:
        return task_files.load_examples(self.format, path)

    def validate_file(self, path) -> list[str]:
        return task_files.validate_file(self.format, path)

    def pool_and_test(self, data, fold: int) -> tuple[list, list]:
        """The examples a calculation of this fold may sample its budget from, and its test set."""
        raise NotImplementedError

    def search_pool_key(self, fold: int) -> str:
        """The part of a search's sampling key naming the pool it samples from."""
        raise NotImplementedError

    def search_groups(self, points: tuple) -> dict:
        """Outer fold (None: all) -> the (fold, seed) points one nested search serves."""
        raise NotImplementedError

    def extra_tests(self, data) -> dict[str, list]:
        return {}

    def heldout_text(self, data) -> HeldOutText:
        """What no corpus may hold (`holdout`): this task's test and pool texts, and the short forms its
        positives define. Default: nothing."""
        return HeldOutText()

    def baseline_context(self, data) -> dict:
        """Keyword arguments of `baseline_hits` read from the task folder (`task_data.TaskData`); none by default."""
        return {}

    def baseline_hits(self, train: list, test: list, **context) -> dict[str, list[list[bool]]]:
        """{baseline name: per test example, whether each of its scored units was right} of this task's
        context-free baselines, fitted on `train`. The report compares a model with them unit by unit on the same
        test units (`protocol.context_free_baselines`)."""
        raise NotImplementedError

    def baseline_scores(self, train: list, test: list, **context) -> dict[str, float]:
        """{baseline name: accuracy} of this task's context-free baselines: from `baseline_hits`. A task may
        override this alone (then the report compares its baselines by their accuracies, not unit by unit)."""
        return {k: sum(sum(h) for h in hits) / sum(len(h) for h in hits)
                for k, hits in self.baseline_hits(train, test, **context).items()}

    def unit_metrics(self, preds: list[int], rows: list[int], examples) -> dict[str, float]:
        """Metrics beyond accuracy from the predicted class of every scored unit and its example's index in
        `examples` (a tagging task's entity span F1); none by default."""
        return {}

    # ---- the command line
    def add_data_commands(self, data_subparsers) -> None:
        """`alignlab data ...` subcommands this task brings (e.g. converters of its own file formats); each sets
        `task_command=<function(args) -> exit code>` with `set_defaults`."""

    def add_predict_arguments(self, parser) -> None:
        pass

    def predict_usage(self) -> str:
        raise NotImplementedError

    def predict_requested(self, args) -> bool:
        """Whether these CLI arguments ask this task; raises ValueError on a half-given request."""
        return False

    def predict_line(self, predictor, args) -> str:
        raise NotImplementedError


def word_means(hidden_BTH: torch.Tensor, first_BT: torch.Tensor, keep_BT: torch.Tensor) -> torch.Tensor:
    """`hidden` with each word's first piece holding the mean of that word's pieces (other positions: undefined).

    A token task's input is `[CLS] pieces.. [SEP]` (`concept_tagging.query_input`) and `first` marks each word's
    first piece: a word runs from its first piece to the next one, or to the input's last token ([SEP]), which
    belongs to no word; `keep` marks the input's tokens (False at padding)."""
    B, T, H = hidden_BTH.shape
    word = first_BT.long().cumsum(1)  # 1 + the index of the word a piece belongs to; 0 for [CLS]
    last = keep_BT.long().sum(1, keepdim=True) - 1
    in_word = keep_BT & (word > 0) & (torch.arange(T, device=word.device)[None] != last)
    word = torch.where(in_word, word, 0)  # bin 0 gathers [CLS], [SEP] and padding, and is never read
    idx = word[..., None].expand(B, T, H)
    sums = torch.zeros(B, int(word.max()) + 1, H, dtype=hidden_BTH.dtype, device=hidden_BTH.device)
    sums.scatter_add_(1, idx, hidden_BTH)
    counts = torch.zeros(B, sums.shape[1], dtype=hidden_BTH.dtype, device=hidden_BTH.device)
    counts.scatter_add_(1, word, torch.ones_like(word, dtype=hidden_BTH.dtype))
    return torch.gather(sums / counts.clamp(min=1)[..., None], 1, idx)


class TokenTask(Task):
    """Tagging: one class per word, scored at each word's first piece (CT; WHP's head shape)."""

    def make_head(self, hidden: int, dropout: float) -> torch.nn.Module:
        return TokenHead(hidden, self.num_classes, dropout)

    def _label_tensor(self, labels: list, n: int, T: int) -> torch.Tensor:
        out = torch.full((n, T), IGNORE, dtype=torch.long)
        for i, lab in enumerate(labels):
            out[i, : len(lab)] = torch.tensor(lab)
        return out

    def units(self, hidden: torch.Tensor, enc: Encoded, pooling: str = "first") -> tuple[torch.Tensor, torch.Tensor]:
        sel = enc.labels != IGNORE
        if pooling == "mean":
            hidden = word_means(hidden, sel, enc.attention_mask)
        return hidden[sel], enc.labels[sel]

    def unit_rows(self, enc: Encoded) -> torch.Tensor:
        return torch.nonzero(enc.labels != IGNORE)[:, 0]


class SequenceTask(Task):
    """Classification of a whole input from its [CLS] vector (AD; PAD's head shape)."""

    def make_head(self, hidden: int, dropout: float) -> torch.nn.Module:
        return SequenceHead(hidden, self.num_classes, dropout)

    def _label_tensor(self, labels: list, n: int, T: int) -> torch.Tensor:
        return torch.tensor(labels, dtype=torch.long)

    def units(self, hidden: torch.Tensor, enc: Encoded, pooling: str = "first") -> tuple[torch.Tensor, torch.Tensor]:
        return hidden[:, 0], enc.labels  # [CLS]: one piece, so every pooling is the same

    def unit_rows(self, enc: Encoded) -> torch.Tensor:
        return torch.arange(len(enc))


def finetune_options() -> dict[str, tuple]:
    """Every registered task's `finetune_options`; two tasks declaring one name must allow the same values."""
    out: dict[str, tuple] = {}
    for t in registered_tasks():
        for name, allowed in t.finetune_options.items():
            if out.setdefault(name, tuple(allowed)) != tuple(allowed):
                raise ValueError(f"tasks declare the finetuning option {name!r} with different values: "
                                 f"{out[name]} and {t.name}'s {tuple(allowed)}")
    return out


def options_in_every_id() -> dict[str, Any]:
    return {name: t.finetune_options[name][0] for t in registered_tasks() for name in t.options_in_every_id}
