"""The flags every benchmark shares, and the command line it records, in one place (issue #57).

`--device`, `--rounds`, `--threads` and `--out` mean the same in every script that has them (where to run, timed
rounds, torch's CPU threads, the JSON file the figures go to); each script gives only its own default.
`add_storage_flags` does the same for the folders a benchmark reads (`--storage`, `--models`, `--corpus`, `--tasks`,
`--task`). `command()`
is the line a benchmark prints before and after its figures and records with them in benchmarks/results/, where an
entry with the same command is replaced (machine_info.record). Each script keeps its own flags, its header lines and
where it sets torch's threads.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
"""benchmarks/results/ of the checkout alignlab is imported from (the benchmarks run from a clone, installed editable)."""


def add_flags(p: argparse.ArgumentParser, *, device: str | None = None, rounds: int | None = None,
              threads: int | None = None, out: str | Path | None = None, help: dict[str, str] | None = None) -> None:
    """Add `--device` (cuda or cpu), `--rounds`, `--threads` and `--out`, in that order, each whose default is given.

    `out`: a file name in benchmarks/results/, or an absolute path (kept as it is). `help`: a flag's help text, by
    its name, where the script has one."""
    help = help or {}
    if device is not None:
        p.add_argument("--device", choices=("cuda", "cpu"), default=device, help=help.get("device"))
    if rounds is not None:
        p.add_argument("--rounds", type=int, default=rounds, help=help.get("rounds"))
    if threads is not None:
        p.add_argument("--threads", type=int, default=threads, help=help.get("threads"))
    if out is not None:
        p.add_argument("--out", type=Path, default=RESULTS / out, help=help.get("out"))


def add_storage_flags(p: argparse.ArgumentParser, *, models: bool = False, corpus: bool = False,
                      task: str | None = None) -> None:
    """`--storage` (the storage root), then, as asked, `--models` (finished model ids under it, required) and
    `--corpus` (a finished corpus folder), always `--tasks` (a task folder) and, given `task`, `--task` with that
    default: the folders a benchmark reads, a corpus or task folder defaulting to the only one under --storage
    (bench_corpus.only_folder)."""
    p.add_argument("--storage", type=Path, default=Path("alignlab-storage"))
    if models:
        p.add_argument("--models", required=True, help="comma-separated finished model ids under <storage>/models")
    if corpus:
        p.add_argument("--corpus", type=Path, help="a finished corpus folder (default: the only one under --storage)")
    p.add_argument("--tasks", type=Path, help="a task folder (default: the only one under --storage)")
    if task is not None:
        p.add_argument("--task", default=task)


def command(script: str, argv: list[str] | None) -> str:
    """`python benchmarks/SCRIPT ARGS` (SCRIPT with its folder: "throughput/feed_rate.py"): the arguments given to
    main(), or the shell's when argv is None."""
    return f"python benchmarks/{script} " + " ".join(sys.argv[1:] if argv is None else argv)
