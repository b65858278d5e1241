"""One error boundary for the `alignlab` command and every study script, and argparse types that refuse
bad numbers at parse time.

A user sees one line, `alignlab: <file or thing>: <problem>`, and a non-zero exit: 2 for bad input
(a ValueError such as a task file's FILE:LINE problems, a missing file, an OS error on a path), 1 for
anything unexpected, 130 for Ctrl-C. `--debug` or `ALIGNLAB_DEBUG=1` shows the traceback instead.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Callable

from alignlab.platform.storage.root import redact

USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError, OSError)


def debugging(argv: list[str] | None = None) -> bool:
    return bool(os.environ.get("ALIGNLAB_DEBUG")) or "--debug" in (sys.argv[1:] if argv is None else argv)


def raised_in_worker(e: BaseException) -> BaseException | None:
    """The error a Ray worker raised, found inside `e` when `e` is Ray's wrapping of it (a Train run's
    `WorkerGroupError` or `ControllerError`, a task's `RayTaskError`, Tune's errors, or a chain of them), or None.
    Ray's errors are told by their module (`ray.*`), so nothing here imports Ray. With several failed Train
    workers, the lowest rank's."""
    seen, todo = set(), [e]
    while todo:
        x = todo.pop(0)
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if not type(x).__module__.startswith("ray.") and x is not e:
            return x
        failures = getattr(x, "worker_failures", None) or {}
        todo += [failures[rank] for rank in sorted(failures)]
        # Train's UserExceptionWithTraceback, a task's RayTaskError, Train's ControllerError; then the chain.
        todo += [getattr(x, "_base_exc", None), getattr(x, "cause", None), getattr(x, "controller_failure", None),
                 x.__cause__]
    return None


def run_guarded(fn: Callable[[], object], argv: list[str] | None = None) -> int:
    """Run `fn` and turn any exception into one line on stderr and an exit code (see the module doc); `fn`'s
    own int result is the exit code, any other result means 0. An error a Ray worker raised is shown as itself, not
    as Ray's wrapping of it (`raised_in_worker`)."""
    def call() -> int:
        result = fn()
        return result if isinstance(result, int) else 0

    if debugging(argv):
        return call()
    try:
        return call()
    except KeyboardInterrupt:
        print("alignlab: interrupted", file=sys.stderr)
        return 130
    except RecursionError:
        print("alignlab: error: input nested too deeply to read", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 -- the boundary: anything but bad input is a bug, reported in one line
        inner = raised_in_worker(e) if type(e).__module__.startswith("ray.") else None
        shown = e if inner is None else inner
        if isinstance(shown, USER_ERRORS):
            print(f"alignlab: error: {_describe(shown)}", file=sys.stderr)
            return 2
        where = "" if inner is None else " (raised in a Ray worker)"
        print(f"alignlab: internal error: {type(shown).__name__}: {_describe(shown)}{where} (run with --debug or "
              "ALIGNLAB_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


def _describe(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename and e.strerror:
        return redact(f"{e.filename}: {e.strerror}")
    return redact(str(e)) or type(e).__name__


# ------------------------------------------------------------------------- argparse


class Parser(argparse.ArgumentParser):
    """argparse, with a bad flag reported in one line (`PROG: error: argument --lr: ...`) instead of the usage
    block; `--help` still prints the usage. Subcommand parsers inherit it."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")



def positive_int(text: str) -> int:
    v = _int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return v


def positive_int_list(text: str) -> tuple[int, ...]:
    """A comma-separated list of distinct whole numbers >= 1, e.g. budgets "25,50,100"."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"give at least one whole number, e.g. 50,100; got {text!r}")
    values = tuple(positive_int(p) for p in parts)
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"a number repeats in {text!r}")
    return values


def nonneg_int(text: str) -> int:
    v = _int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text!r}")
    return v


def positive_float(text: str) -> float:
    return _finite(text, lambda v: v > 0, "> 0")


def nonneg_float(text: str) -> float:
    return _finite(text, lambda v: v >= 0, ">= 0")


def _finite(text: str, ok: Callable[[float], bool], what: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(v) or not ok(v):
        raise argparse.ArgumentTypeError(f"must be a finite number {what}, got {text!r}")
    return v


def int_below(limit: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        v = _int(text)
        if not 0 <= v < limit:
            raise argparse.ArgumentTypeError(f"must be one of 0..{limit - 1}, got {text!r}")
        return v

    parse.__name__ = f"int in 0..{limit - 1}"
    return parse


def name_list(known: Callable[[], set[str]], what: str) -> Callable[[str], str]:
    """A comma-separated, non-empty list of known names (e.g. objectives), returned as given."""
    def parse(text: str) -> str:
        names = [s.strip() for s in text.split(",") if s.strip()]
        if not names:
            raise argparse.ArgumentTypeError(f"give at least one {what}, e.g. mlm,nsp")
        unknown = sorted(set(names) - known())
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(unknown)}: choose from {', '.join(sorted(known()))}")
        return ",".join(names)

    parse.__name__ = f"{what} list"
    return parse


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
