"""Which torch device a Ray worker (Train rank or Tune trial) computes on, and what that device is called.

A Ray worker on a node with several GPUs may see all of them: Ray Train sets CUDA_VISIBLE_DEVICES of every worker
of a node to the union of the node's workers' GPUs (so NCCL can see its peers), and a bare "cuda" then means GPU 0
for every rank (docs/cluster.md#every-gpu-of-a-node-is-visible-to-every-worker). The worker's own GPU is the position,
in that visible list, of the
lowest GPU id Ray assigned it -- the rule of `ray.train.torch.get_device`, written here as a pure function so
that Tune trials (which have no Train context) use the same rule and a test can check it without GPUs.
No Ray import: callers pass `ray.get_gpu_ids()` in.
"""
from __future__ import annotations

import os

import torch


def device_for_worker(gpu_ids: list, visible: str | None, cuda_available: bool) -> torch.device:
    """The device of a worker that Ray assigned the GPUs `gpu_ids` (`ray.get_gpu_ids()`), given this process's
    CUDA_VISIBLE_DEVICES (`visible`; None when unset). No GPU assigned, or a torch without CUDA: the CPU.

    With CUDA_VISIBLE_DEVICES set, torch numbers the visible GPUs 0.. in the list's order, so the device index is
    the position of the lowest assigned id in that list; unset, the ids are physical indices already."""
    if not gpu_ids or not cuda_available:
        return torch.device("cpu")
    ids = [str(g) for g in gpu_ids]
    first = str(min(int(g) for g in ids)) if all(g.isdigit() for g in ids) else min(ids)  # ids or UUIDs
    if visible is None or visible.strip() == "":
        if not first.isdigit():
            raise ValueError(f"Ray assigned GPU {first!r} (a UUID) but CUDA_VISIBLE_DEVICES is unset: "
                             "the worker cannot tell which torch device that is")
        return torch.device(f"cuda:{int(first)}")
    order = [v.strip() for v in visible.split(",") if v.strip()]
    if first not in order:
        raise ValueError(f"Ray assigned GPU {first} but CUDA_VISIBLE_DEVICES={visible!r} does not list it: "
                         "this worker cannot reach its GPU")
    return torch.device(f"cuda:{order.index(first)}")


def use_device(device: torch.device) -> torch.device:
    """Make `device` this process's current CUDA device (before any model or tensor is built, so that kernels,
    NCCL and `torch.cuda.*` calls without an index land on it), and return it."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def ray_worker_device(gpu_ids: list) -> torch.device:
    """`device_for_worker` for this process: `gpu_ids` from `ray.get_gpu_ids()`, made current (`use_device`)."""
    return use_device(device_for_worker(gpu_ids, os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.is_available()))


def device_name(device: torch.device | str) -> str:
    """What the device is, for records and for the peak-FLOPs table (`throughput.peak_flops`): the CUDA device's
    name ("NVIDIA H100 80GB HBM3"), or "cpu"."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type
