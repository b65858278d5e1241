"""How a study's pretraining is laid out on a cluster: how many models train side by side (the default of
`--parallel-pretrain`), and the wall time that gives each stage (`alignlab plan`).

Pure functions of the cluster's resources (`ray.cluster_resources()`, or what a plan is told), so they are tested
without a GPU; no Ray or torch here.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from alignlab.platform.config import PretrainConfig

LAUNCH_FLOOR_S = 7.3e-3
"""How long one optimizer step takes however few FLOPs it makes: the 128x2 eager step on one H100 (MLM + NSP,
batch 256, GPU logs of 8cf0d68), whose matmuls need a few percent of it. Its time is kernel launches and the Python
between them, so a second process on the same GPU fills the gaps rather than waiting (benchmarks/throughput/side_by_side.py
measures what K processes get)."""
PACK_MFU = 0.45
"""The share of a GPU's peak a step's matmuls are assumed to run at when packing is decided (the MFU goal of the
768x3 step, docs/throughput.md): a model whose step needs less than 1/K of the launch floor at this rate is packed
K to a GPU."""
MAX_MODELS_PER_GPU = 4
"""At most this many models share one GPU: beyond it their CPUs (each keeps its own `cpus_per_worker`) and
context switches cost more than the idle GPU time they fill."""
REFERENCE_GPU = "H100"
"""The GPU `LAUNCH_FLOOR_S` was measured on, whose bf16 peak (throughput.PEAK_TFLOPS) the rule uses: a model that
cannot fill an H100 cannot fill a slower GPU of the same launch overhead either, so one rule serves every kind."""


def _packable(cfg: PretrainConfig) -> bool:
    """A run that trains, on one GPU worker: data-parallel workers need a GPU each."""
    return bool(cfg.max_steps and cfg.use_gpu and cfg.num_workers == 1)


def models_per_gpu(cfg: PretrainConfig, vocab_size: int) -> int:
    """How many one-worker runs of `cfg` a study trains on one GPU (fractional GPUs of 1/K each): K such that K
    steps' matmuls at `PACK_MFU` of an H100's peak fit in one `LAUNCH_FLOOR_S`, between 1 and `MAX_MODELS_PER_GPU`.
    1 for a run that does not train, trains on CPUs, or is data-parallel (its workers need a GPU each).

    A rule from one measured floor, not a measurement of packing: `--models-per-gpu K` overrides it, and
    benchmarks/throughput/side_by_side.py measures what K side by side get on a given GPU (docs/cluster.md#small-models-share-a-gpu)."""
    from alignlab.platform.pretrain.cost import expected_run_flops
    from alignlab.platform.runtime.throughput import peak_flops

    if not _packable(cfg):
        return 1
    step_s = expected_run_flops(cfg, vocab_size) / cfg.max_steps / (PACK_MFU * peak_flops(REFERENCE_GPU, "bf16"))
    return int(max(1, min(MAX_MODELS_PER_GPU, math.floor(LAUNCH_FLOOR_S / step_s))))


def pack(models: Sequence[PretrainConfig], vocab_size: int, per_gpu: int | None = None) -> list[PretrainConfig]:
    """`models` with the GPU share each Train worker asks for: 1/K of a GPU for the one-worker GPU runs that
    `models_per_gpu` packs K to a GPU (or `per_gpu` for every one of them, when the user gives it; 1 unpacks),
    a whole GPU for the others. Only `gpus_per_worker` changes, a runtime field: the model ids stay."""
    out = []
    for cfg in models:
        if _packable(cfg):
            k = per_gpu or models_per_gpu(cfg, vocab_size)
            cfg = dataclasses.replace(cfg, gpus_per_worker=1.0 / k)
        out.append(cfg)
    return out


def side_by_side(resources: Mapping[str, float], models: Sequence[PretrainConfig]) -> int:
    """Pretraining runs to train at once on a cluster of `resources` ({"GPU": G, "CPU": C}): as many as hold a
    whole run's GPUs and CPUs each (G models of one GPU worker on G GPUs, K times as many when they ask for 1/K of a
    GPU each, `pack`), at most one per model that trains.

    1 when any run trains on CPUs: on a small machine two trainers and their Ray Data pipelines starve each other
    (docs/cluster.md#ray-data-needs-a-whole-cpu), which is why 1 was the only default before. Under an autoscaler
    that has not added its GPU nodes yet the cluster shows no GPU, so this is 1 too: give --parallel-pretrain."""
    trained = [c for c in models if c.max_steps]
    if not trained or not all(c.use_gpu for c in trained):
        return 1
    gpus = max(c.num_workers * c.gpus_per_worker for c in trained)  # driver.worker_resources
    cpus = max(c.num_workers * c.cpus_per_worker for c in trained)
    # A small tolerance: three workers of 1/3 GPU fill one GPU although 1/3 has no exact binary form.
    fit = min(math.floor(resources.get("GPU", 0) / gpus + 1e-9),
              resources.get("CPU", 0) // cpus if cpus else len(trained))
    return int(max(1, min(fit, len(trained))))


def wall_hours(device_hours: Sequence[float | None], devices: Sequence[float], parallel: int) -> float | None:
    """Wall-clock hours of pretraining runs of `device_hours` each, each holding `devices` GPUs (its workers times
    each worker's share), `parallel` at once, each run started as a slot frees, in order (as
    `run.pretrain_models` does); None when a run's cost is unknown. Assumes a run over W devices takes 1/W of its
    device-hours (data parallelism scaling linearly), and a run on 1/K of a GPU K times its device-hours (as long
    as it would take alone: the premise of packing, `models_per_gpu`)."""
    if any(h is None for h in device_hours):
        return None
    slots = [0.0] * max(1, parallel)
    for h, w in zip(device_hours, devices):
        if h:
            i = slots.index(min(slots))
            slots[i] += h / (w or 1)
    return max(slots)
