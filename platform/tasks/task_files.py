"""Task data files: one JSON object per line, read, validated and written the same way for every task.

A task says how its lines look through a `TaskFormat` (its problems, its parser, what makes two lines
the same example); its example objects write themselves (`to_json()`). Everything here is generic:
line numbers, encoding and JSON errors, duplicates, train/test overlap, atomic writes.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Iterator, Sequence


class TaskDataError(ValueError):
    """A task data file has problems; `problems` lists each as "file:line: problem"."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__(f"{len(self.problems)} problem(s) in task data:\n" + "\n".join(self.problems))


@dataclass(frozen=True)
class TaskFormat:
    """How one task's examples sit in a line of a task file."""

    problems: Callable[[dict], list[str]]
    """Every problem of one parsed line (empty if it is a valid example)."""
    parse: Callable[[dict], Any]
    """The example of a valid line."""
    key: Callable[[dict], Hashable | None]
    """What makes two lines the same example (None if the line has no such key)."""


def read_lines(path) -> Iterator[tuple[int, dict | None, str | None]]:
    """(line number, parsed object or None, problem or None) for each non-blank line."""
    if Path(path).is_dir():
        raise TaskDataError([f"{path}: is a folder, not a task file"])
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield line_no, None, f"not UTF-8 ({e.reason} at byte {e.start + 1} of the line)"
                continue
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                yield line_no, None, f"invalid JSON ({e.msg} at column {e.colno})"
                continue
            except RecursionError:
                yield line_no, None, "JSON nested too deeply"
                continue
            if not isinstance(obj, dict):
                yield line_no, None, f"expected a JSON object, got {type(obj).__name__}"
                continue
            yield line_no, obj, None


def validate(fmt: TaskFormat, path) -> tuple[list[str], list]:
    """(every problem of the file as "file:line: problem", the examples of its valid lines)."""
    problems, examples, seen, any_line = [], [], {}, False
    for line_no, obj, problem in read_lines(path):
        any_line = True
        line_problems = [problem] if problem else fmt.problems(obj)
        problems.extend(f"{path}:{line_no}: {p}" for p in line_problems)
        if line_problems:
            continue
        key = fmt.key(obj)
        if key in seen:
            problems.append(f"{path}:{line_no}: duplicate of the example at line {seen[key]}")
            continue
        seen[key] = line_no
        examples.append(fmt.parse(obj))
    if not any_line:
        problems.append(f"{path}: empty file")
    return problems, examples


def validate_file(fmt: TaskFormat, path) -> list[str]:
    """Every problem of a task file as "file:line: problem" (empty if the file is fine)."""
    return validate(fmt, path)[0]


def load_examples(fmt: TaskFormat, path) -> list:
    """The examples of a task file; raises TaskDataError listing every problem if it has any."""
    problems, examples = validate(fmt, path)
    if problems:
        raise TaskDataError(problems)
    return examples


def check_disjoint(key: Callable[[dict], Hashable | None], train_path, test_path) -> list[str]:
    """Examples of `test_path` that also occur in `train_path` (same `key`), as problems naming both places."""
    train_lines = {}
    for line_no, obj, _ in read_lines(train_path):
        k = key(obj) if obj is not None else None
        if k is not None:
            train_lines.setdefault(k, line_no)
    problems = []
    for line_no, obj, _ in read_lines(test_path):
        k = key(obj) if obj is not None else None
        if k in train_lines:
            problems.append(f"{test_path}:{line_no}: duplicate of {train_path}:{train_lines[k]} "
                            "(the same example in train and test)")
    return problems


def write_jsonl(path, examples: Iterable) -> None:
    """Write examples (each with a `to_json()`) one JSON object a line; written to `path.tmp` and
    renamed, so never half done."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for example in examples:
            f.write(json.dumps(example.to_json(), ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def majority_label(train_labels: Sequence):
    """Train's most frequent label (ties: the smallest): what the majority baseline always predicts."""
    counts = Counter(train_labels)
    best = max(counts.values())
    return min(l for l, n in counts.items() if n == best)


def majority_baseline(train_labels: Sequence, test_labels: Sequence) -> float:
    """Test accuracy of always predicting train's most frequent label (ties: the smallest label): the
    context-free baseline every task has."""
    if not train_labels or not test_labels:
        raise ValueError("majority_baseline needs non-empty train and test labels")
    label = majority_label(train_labels)
    return sum(1 for l in test_labels if l == label) / len(test_labels)


def majority_hits(train_labels: Sequence, test_labels: Sequence[Sequence]) -> list[list[bool]]:
    """`majority_baseline` per test example: whether each of its scored labels (`test_labels`, one list per
    example) is train's most frequent label."""
    if not train_labels or not any(test_labels):
        raise ValueError("majority_baseline needs non-empty train and test labels")
    label = majority_label(train_labels)
    return [[l == label for l in labels] for labels in test_labels]