"""Batches made ahead of the training step, on a background thread.

The pretraining loop's batches are made on the host (collation: masking, pairing, label gathering, padding) and
then wait for the accelerator. Made on the training thread, the two never overlap: a GPU step waits for the
host's next batch, and the host waits for the GPU. `Prefetcher` runs the iterator that makes them on a daemon
thread, at most `depth` batches ahead, and hands them over in order; an error there is raised in the consumer at
the batch where it happened. Which batch is made for which step does not depend on the thread (the iterator
decides it, keyed by step), so a resumed run makes the same batches with or without it. No Ray here.

The thread runs its torch operations on itself alone (`torch_on_this_thread_only`): on a CPU, a second team of
OpenMP threads beside the training step's made every step slower (docs/input_path.md#on-a-cpu).
"""
from __future__ import annotations

import ctypes
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch

_END = object()


def torch_on_this_thread_only() -> None:
    """Make the calling thread run its torch operations on itself, never on a team of threads of its own.

    With OpenMP (torch's CPU backend on Linux), an operation large enough to split starts a team of worker threads
    for the thread that calls it, beside the training thread's team. Once a process's OpenMP threads outnumber the
    cores, libgomp stops spinning at the end of each parallel region and puts the waiting threads to sleep, so every
    parallel region of the training step pays for waking them (docs/input_path.md#on-a-cpu). The batches a side
    thread makes are too small to gain from a team. OpenMP keeps the thread count per
    thread, so the training thread keeps its own; torch's own thread pool (builds without OpenMP) is one pool for
    all threads and needs nothing."""
    torch.get_num_threads()  # torch's per-thread set-up first: it would set the count back on this thread's first op
    try:
        set_threads = ctypes.CDLL(None).omp_set_num_threads
    except (AttributeError, OSError, TypeError):  # no OpenMP loaded, or no process-wide symbol lookup (Windows)
        return
    set_threads(1)


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


class Prefetcher(Iterator):
    """Iterates `source` on a background thread, `depth` items ahead (0: on the caller's thread, nothing ahead).
    Use as a context manager, or call `close()`, so that a loop left early stops the thread."""

    def __init__(self, source: Iterable, *, depth: int):
        if depth < 0:
            raise ValueError(f"prefetch depth must be >= 0, got {depth}")
        self._source = iter(source)
        self._thread: threading.Thread | None = None
        if depth:
            self._queue: queue.Queue = queue.Queue(maxsize=depth)
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, name="alignlab-prefetch", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            torch_on_this_thread_only()
            for item in self._source:
                if not self._put(item):
                    return
            self._put(_END)
        except BaseException as e:  # noqa: BLE001 -- handed to the consumer, which raises it
            self._put(_Failed(e))

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __next__(self) -> Any:
        if self._thread is None:
            return next(self._source)
        item = self._queue.get()
        if item is _END:
            self._queue.put(_END)  # a further next() ends again instead of waiting for ever
            raise StopIteration
        if isinstance(item, _Failed):
            raise item.error
        return item

    def close(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        deadline = time.monotonic() + 60.0  # a source blocked for longer is left to its daemon thread
        while self._thread.is_alive() and time.monotonic() < deadline:
            try:
                self._queue.get(timeout=0.1)
            except queue.Empty:
                pass
        self._thread = None

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
