"""Tasks from files: three generic task kinds a user declares with a name and JSONL files, without code.

- "tagging":  `{"tokens": [...], "tags": [...]}`, one tag per word (BIO NER, POS, any tag set); input
  `[CLS] pieces [SEP]`, scored at each word's first piece; baselines majority tag and per-word lexicon;
  metrics accuracy and, when every tag is BIO/BIOES (`O`, `B-X`, `I-X`, `E-X`, `S-X`), entity span F1 (seqeval).
- "sequence": `{"text": ..., "label": ...}`; input `[CLS] text [SEP]`, scored from [CLS]; baselines majority and
  bag-of-words logistic regression.
- "pair":     `{"text_a": ..., "text_b": ..., "label": ...}`; input `[CLS] a [SEP] b [SEP]` (segments 0/1), scored
  from [CLS]; baselines majority and a logistic regression on lexical overlap.
The head is made from the data: as many classes as the tag/label set of the pool and test files. The protocol is
a fixed pool and test set (like a shipped pool/test task): five samples of the budget from the pool x two seeds,
honest selection and refit as configured. The declared aligned objective's pretrained head initialises the
task head in a kept-head column when the shapes match (same head type and class count).

A declared task lives in two forms: in the driver, with its source files (`declare_task`), which `build_data`
copies into the task folder; and in Ray workers, from its portable `declaration` (a small dict carried in calc
dicts), reading its examples from the task folder only.
"""
from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

import torch

from alignlab.platform.encoder.batching import IGNORE
from alignlab.platform.encoder.registry import registered, clash
from alignlab.platform.encoder.tokenizer import _split_at_word_starts
from alignlab.platform.tasks import task_files
from alignlab.platform.tasks.holdout import HeldOutText
from alignlab.platform.tasks.task import (BuiltData, SequenceTask, TokenTask, origin, register_instance, unregister,
                                    task_names, registered_tasks, task)
from alignlab.platform.tasks.task_files import TaskDataError, majority_hits
from alignlab.platform.tasks.task_kind_data import (FORMATS, PairExample, TextExample, bag_of_words_hits, is_span_scheme,
                                                  label_lists, labels_of, lexicon_hits, overlap_hits, texts_of)

KINDS = ("tagging", "sequence", "pair")


def word_pieces(tok, words) -> list[list[int]]:
    """The pieces of each word, as `tok.encode_words(words)` gives them, from one encode of the joined text.

    One string is ~10x faster than a list (sentencepiece starts its thread pool for a list), and equal,
    because pieces never cross whitespace: the tokenizer's own word-start split cuts it into words; where
    that does not give one start per word (a word normalised away), `encode_words` encodes them one by one.
    """
    words = list(words)
    if not words:
        return []
    return _split_at_word_starts(tok, tok.sp.encode(" ".join(words)), len(words)) or tok.encode_words(words)


def query_input(tok, words, max_len: int) -> tuple[list[int], list[int]]:
    """`[CLS] pieces.. [SEP]` of a word sequence and the position of each word's first piece.

    A word with no pieces becomes `<unk>`; words that would not fit are dropped (and not scored).
    Shared by training, evaluation and the predictor, so all three see the same inputs.
    """
    ids, first = [tok.cls_id], []
    for p in word_pieces(tok, words):
        p = p or [tok.unk_id]
        if len(ids) + len(p) > max_len - 1:
            break
        first.append(len(ids))
        ids += p
    ids.append(tok.sep_id)
    return ids, first


def tagged_input(tok, words, tag_ids, max_len: int) -> tuple[list[int], list[int], list[int]]:
    """(ids, segment ids, per-position labels) of a tagged word sequence: each word's tag id at its first piece,
    IGNORE elsewhere (`query_input`'s layout)."""
    ids, first = query_input(tok, words, max_len)
    lab = [IGNORE] * len(ids)
    for pos, tag in zip(first, tag_ids):
        lab[pos] = tag
    return ids, [0] * len(ids), lab


# ---------------------------------------------------------------- the task kinds


class _FileTask:
    """What the three kinds share: a declared name, labels from the data, a fixed pool and test set."""

    kind: str
    head_rank = 100  # after every built-in task: their heads' random init does not move when a file task is declared
    default = False
    builtin = False
    """True for a built-in task made as an instance of a kind (CT): registered by its module, never declared."""

    def _setup(self, declaration: dict, sources: dict | None) -> None:
        self.declaration = declaration
        self.name = declaration["name"]
        self.labels = tuple(declaration["labels"])
        self.num_classes = len(self.labels)
        self.aligned_objective = declaration.get("aligned_objective") or ""
        self.multitask_partner = self.name
        self.format = FORMATS[self.kind]
        self.sources = sources or {}
        extra = tuple(declaration.get("extra_tests", ()))
        self.data_files = {f"{self.name}_pool": (f"{self.name}_pool.jsonl", True),
                           f"{self.name}_test": (f"{self.name}_test.jsonl", True),
                           **{f"{self.name}_{x}": (f"{self.name}_{x}.jsonl", False) for x in extra}}
        self.extra_test_notes = {x: f"{self.name}: the declared extra test file {x!r}" for x in extra}
        self.baseline_notes = f"{self.name.upper()}: {self.baseline_text}"

    def label_id(self, label: str) -> int:
        return self.labels.index(label)

    def build_key(self, options: dict) -> dict:
        return {f"declared:{self.name}": self.declaration["digest"]}

    def folder_tag(self, options: dict) -> str:
        return self.name

    def build_data(self, docs, *, seed, options) -> BuiltData:
        if not self.sources:
            raise RuntimeError(f"task {self.name!r} was declared without its files (a worker's copy)")
        files = {self.data_files[k][0]: self.load_examples(p) for k, p in self.sources.items()}
        stats = {"kind": self.kind, "labels": list(self.labels),
                 **{k: len(v) for k, v in zip(self.sources, files.values())}}
        return BuiltData(files, {self.name: stats}, set())

    def pool_and_test(self, data, fold):
        return list(data.files[f"{self.name}_pool"]), list(data.files[f"{self.name}_test"])

    def search_pool_key(self, fold):
        return "pool"

    def search_groups(self, points):
        return {None: points}  # one fixed test set: one search on the pool serves every sample

    def extra_tests(self, data):
        return {x: data.files[f"{self.name}_{x}"] for x in self.declaration.get("extra_tests", ())
                if data.files.get(f"{self.name}_{x}")}

    def heldout_text(self, data):
        """Every text of the task's files: no corpus may hold a test (or pool) sentence of a declared task."""
        examples = [ex for k in self.data_files for ex in data.files.get(k, [])]
        return HeldOutText(tuple(sorted({t for ex in examples for t in texts_of(ex)})))

    # ---- serving: `alignlab predict --model ID --text TEXT [--text-b TEXT]` (`add_kind_predict_arguments`)
    def predict_usage(self) -> str:
        return f"--text TEXT{' --text-b TEXT' if self.kind == 'pair' else ''} ({self.name})"

    def predict_requested(self, args) -> bool:
        return getattr(args, "text", None) is not None

    def classify(self, predictor, ids: list[int], seg: list[int]) -> str:
        """A [CLS] task's label of one input, with its probability."""
        predictor.need(self.name)
        pool_w, pool_b, w, b = predictor.heads[self.name]
        with torch.inference_mode():
            h = predictor.unit_vectors(self.name, torch.tensor(ids), torch.tensor(seg), torch.zeros(1, dtype=torch.long))
            probs = torch.softmax(torch.addmm(b, torch.tanh(torch.addmm(pool_b, h, pool_w)), w)[0], -1)
        k = int(probs.argmax())
        return f"{self.labels[k]} ({float(probs[k]):.3f})"

    def baseline_hits(self, train, test, **context):
        """Majority, and the kind's own baseline (`baselines[1]`, fitted by `fit_and_score`)."""
        return {"majority": majority_hits(labels_of(self.kind, train), label_lists(self.kind, test)),
                self.baselines[1]: type(self).fit_and_score(train, test)}


class TaggingTask(_FileTask, TokenTask):
    kind = "tagging"
    unit = "words"
    baselines = ("majority", "lexicon")
    baseline_text = "lexicon (each word's most frequent training tag, unknown words the majority tag)."
    fit_and_score = staticmethod(lexicon_hits)

    def example_input(self, ex, tok, max_len, options):
        return tagged_input(tok, ex.tokens, [self.label_id(t) for t in ex.tags], max_len)

    def unit_metrics(self, preds: list[int], rows: list[int], examples) -> dict[str, float]:
        """Entity span F1 (seqeval, strict to the tags' scheme) when the tags are BIO/BIOES; words past the
        model's max length (never scored) count as `O`."""
        if not is_span_scheme(self.labels):
            return {}
        from seqeval.metrics import f1_score

        pred = [["O"] * len(ex.tags) for ex in examples]
        seen = Counter()
        for p, r in zip(preds, rows):
            pred[r][seen[r]] = self.labels[p]
            seen[r] += 1
        return {"span_f1": float(f1_score([list(ex.tags) for ex in examples], pred))}

    def predict_line(self, predictor, args) -> str:
        """Each word of the text with its predicted tag (`word/TAG`); words past the max length get `?`."""
        words = args.text.split()
        if not words:
            raise ValueError("the text is empty")
        predictor.need(self.name)
        ids, first = query_input(predictor.tok, words, predictor.max_len)
        w, b = predictor.heads[self.name]
        with torch.inference_mode():
            h = predictor.unit_vectors(self.name, torch.tensor(ids), None, torch.tensor(first))
            pred = torch.addmm(b, h, w).argmax(-1).tolist()
        return " ".join(f"{wd}/{t}" for wd, t in zip(words, [self.labels[p] for p in pred] + ["?"] * len(words)))


class SequenceClassificationTask(_FileTask, SequenceTask):
    kind = "sequence"
    unit = "texts"
    baselines = ("majority", "bag_of_words")
    baseline_text = "bag of words (logistic regression on the text's lowercased word counts)."
    fit_and_score = staticmethod(bag_of_words_hits)

    def example_input(self, ex, tok, max_len, options):
        ids = [tok.cls_id, *tok.sp.encode(" ".join(ex.text.split()))[: max_len - 2], tok.sep_id]
        return ids, [0] * len(ids), self.label_id(ex.label)

    def predict_line(self, predictor, args) -> str:
        ids, seg, _ = self.example_input(TextExample(args.text, self.labels[0]), predictor.tok, predictor.max_len, {})
        return self.classify(predictor, ids, seg)


class PairClassificationTask(_FileTask, SequenceTask):
    kind = "pair"
    unit = "pairs"
    baselines = ("majority", "overlap")
    baseline_text = "overlap (logistic regression on the two texts' word overlap: Jaccard, shares, counts)."
    fit_and_score = staticmethod(overlap_hits)

    def example_input(self, ex, tok, max_len, options):
        a = tok.sp.encode(" ".join(ex.text_a.split()))[: (max_len - 3) // 2]
        b = tok.sp.encode(" ".join(ex.text_b.split()))[: max_len - 3 - len(a)]
        ids = [tok.cls_id, *a, tok.sep_id, *b, tok.sep_id]
        return ids, [0] * (len(a) + 2) + [1] * (len(b) + 1), self.label_id(ex.label)

    def predict_line(self, predictor, args) -> str:
        if getattr(args, "text_b", None) is None:
            raise ValueError(f"{self.name} scores a pair: give --text and --text-b")
        ex = PairExample(args.text, args.text_b, self.labels[0])
        ids, seg, _ = self.example_input(ex, predictor.tok, predictor.max_len, {})
        return self.classify(predictor, ids, seg)


def add_kind_predict_arguments(parser) -> None:
    """`alignlab predict` inputs of the declared tasks (one set for every kind: the model says which task)."""
    parser.add_argument("--text", default=None, help="a declared task's input: its words (tagging) or its text")
    parser.add_argument("--text-b", default=None, help="a declared pair task's second text")


KIND_CLASSES = {c.kind: c for c in (TaggingTask, SequenceClassificationTask, PairClassificationTask)}


# ---------------------------------------------------------------- declaring


def declare_task(name: str, kind: str, pool, test, *, extra_tests: dict | None = None,
                 aligned_objective: str = "") -> _FileTask:
    """Register a task from its files (the Python API; `--task` on the command line). Every file is validated
    (`TaskDataError` lists every FILE:LINE: problem), the label set of pool and test makes the head, and an
    extra test file may only use those labels. Declaring the same name with the same files again is a no-op."""
    if kind not in KINDS:
        raise ValueError(f"task {name!r}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not name.isidentifier() or not name.islower():
        raise ValueError(f"task name {name!r} must be a lowercase identifier (it names files and columns)")
    if aligned_objective:
        if aligned_objective not in registered():
            raise ValueError(f"task {name!r}: aligned objective {aligned_objective!r} is not one of "
                             f"{', '.join(registered())}")
    extra_tests = dict(extra_tests or {})
    sources = {f"{name}_pool": Path(pool), f"{name}_test": Path(test),
               **{f"{name}_{x}": Path(p) for x, p in extra_tests.items()}}
    fmt, loaded, problems = FORMATS[kind], {}, []
    for key, path in sources.items():
        if not path.is_file():
            problems.append(f"{path}: no such file (task {name!r})")
            continue
        file_problems, examples = task_files.validate(fmt, path)
        problems += file_problems
        loaded[key] = examples
    if problems:
        raise TaskDataError(problems)
    labels = sorted(set(labels_of(kind, loaded[f"{name}_pool"])) | set(labels_of(kind, loaded[f"{name}_test"])))
    if len(labels) < 2:
        raise TaskDataError([f"{sources[f'{name}_pool']}: task {name!r} needs at least two labels, got {labels}"])
    for x in extra_tests:
        path = sources[f"{name}_{x}"]
        for line_no, obj, _ in task_files.read_lines(path):
            unknown = sorted(set(labels_of(kind, [fmt.parse(obj)])) - set(labels))
            if unknown:
                problems.append(f"{path}:{line_no}: label(s) {unknown} not in the pool and test files' {labels}")
    if problems:
        raise TaskDataError(problems)
    digest = hashlib.sha256(json.dumps([kind, labels, aligned_objective, sorted(extra_tests)]).encode())
    for path in sources.values():
        digest.update(path.read_bytes())
    declaration = {"name": name, "kind": kind, "labels": labels, "aligned_objective": aligned_objective,
                   "extra_tests": sorted(extra_tests), "digest": digest.hexdigest()[:16]}
    if name in task_names():
        old = getattr(task(name), "declaration", None)
        if old != declaration:
            raise clash("task", name, origin(task(name)), _caller())
        return task(name)
    t = _make(declaration, sources)
    t.declared_by = _caller()
    t.pool_size = len(loaded[f"{name}_pool"])
    return t


def _caller() -> str:
    """The module that called `declare_task` (a plugin's), for a clash message naming its package."""
    return sys._getframe(2).f_globals.get("__name__", "?")


def _make(declaration: dict, sources: dict | None) -> _FileTask:
    t = KIND_CLASSES[declaration["kind"]]()
    t._setup(declaration, sources)
    register_instance(t)
    return t


def declarations() -> list[dict]:
    """The portable declarations of every declared task (what a Ray worker needs to register them too)."""
    return [t.declaration for t in registered_tasks() if isinstance(t, _FileTask) and not t.builtin]


def declare_all(decls) -> None:
    """Register declared tasks in this process from their portable declarations (a Ray worker's side)."""
    for d in decls or ():
        if d["name"] not in task_names():
            _make(d, None)


def undeclare(name: str) -> None:
    """Forget a declared task (tests; a session declaring other files under the same name)."""
    unregister(name)
