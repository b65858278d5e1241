"""Out of memory on a device: the one line a user reads, and the pretraining run's record of it.

A CUDA out-of-memory error is not a fault that a retry cures: the same model and batch run out of memory again.
Pretraining stops at the first one -- the rank that hit it records the line in the model folder (`RECORD`), the
workers stop, and the driver raises it as `OutOfMemory` -- instead of Ray Train retrying its worker group
`max_failures` times. An FEL calculation that runs out of memory is recorded as failed with the line and is run
again by a rerun of its study (`study.grid.run_one`, `trial_files`): the GPU may have been shared with other
trials at the time. Plain Python and torch: no Ray.
"""
from __future__ import annotations

import os

import torch

from alignlab.platform.storage.root import Storage, read_json, write_json

ERRORS = (torch.cuda.OutOfMemoryError,)
"""The error types that mean the device ran out of memory (`torch.OutOfMemoryError` is the same class)."""

RECORD = "out_of_memory.json"
"""Written into the model folder (and pushed) by a Train rank that ran out of memory; read and removed by the
driver, which raises its line. While it is there, a restarted worker group stops at once instead of training."""


class OutOfMemory(ValueError):
    """A run that does not fit the device's memory: what to lower is in the message (a user's setting to change,
    hence a ValueError: one line at the command line's error boundary)."""


def device_memory(device: str | torch.device) -> str:
    """The memory of `device`, as a person reads it: a GPU's total memory, or this machine's RAM on a CPU."""
    device = str(device)  # Ray Train hands a worker a torch.device, FEL trials a name
    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.device(device))
        return f"{props.name}, {props.total_memory / 2**30:.1f} GiB"
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return "CPU"
    return f"CPU, {ram / 2**30:.1f} GiB RAM"


def pretrain_message(cfg, device: str | torch.device, step: int) -> str:
    """The line for a pretraining run that ran out of memory at `step`."""
    seq = cfg.seq_len or cfg.model.max_len
    return (f"out of memory on {device} ({device_memory(device)}) at step {step}: model {cfg.model.label}, "
            f"{cfg.worker_batch_size} sequences of up to {seq} tokens per worker (global batch {cfg.batch_size} over "
            f"{cfg.num_workers} worker{'s' if cfg.num_workers != 1 else ''}); lower the per-worker batch -- a smaller "
            "batch_size, or more workers (--train-workers) -- or the sequence length or the model size")


def finetune_message(ft, model_label: str, device: str) -> str:
    """The line for an FEL calculation that ran out of memory."""
    return (f"out of memory on {device} ({device_memory(device)}): model {model_label}, {ft.task.upper()} batch "
            f"{ft.batch_size}; a rerun of the study runs it again -- lower FinetuneConfig.batch_size, or give each "
            "trial more of a GPU (--gpus-per-trial) so fewer trials share one")


def record(st: Storage, mid: str, mdir, message: str) -> None:
    write_json(mdir / RECORD, {"error": message})
    st.push_file(st.model(mid, RECORD))


def recorded(st: Storage, mid: str) -> str | None:
    """The line a rank recorded for model `mid`, or None."""
    rel = st.model(mid, RECORD)
    if not st.pull_file(rel):
        return None
    try:
        return read_json(st.local / rel).get("error", "out of memory")
    except ValueError:  # cut short while written: still out of memory
        return "out of memory"


def clear(st: Storage, mid: str) -> None:
    """Forget a recorded out-of-memory (a new attempt, perhaps on a larger device or with more workers)."""
    st.here(st.model(mid, RECORD)).unlink(missing_ok=True)
    if st.remote and st.has(st.model(mid, RECORD)):
        st.ray_filesystem().delete_file(st.ray_path(st.model(mid, RECORD)))
