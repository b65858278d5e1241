"""How a study's pretraining is laid out on a cluster: how many models train side by side (the default of
`--parallel-pretrain`), and the wall time that gives each stage (`alignlab plan`).

Pure functions of the cluster's resources (`ray.cluster_resources()`, or what a plan is told), so they are tested
without a GPU; no Ray or torch here.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from alignlab.platform.config import PretrainConfig


def side_by_side(resources: Mapping[str, float], models: Sequence[PretrainConfig]) -> int:
    """Pretraining runs to train at once on a cluster of `resources` ({"GPU": G, "CPU": C}): as many as hold a
    whole run's GPUs and CPUs each (G models of one GPU worker on G GPUs), at most one per model that trains.

    1 when any run trains on CPUs: on a small machine two trainers and their Ray Data pipelines starve each other
    (docs/cluster.md#ray-data-needs-a-whole-cpu), which is why 1 was the only default before. Under an autoscaler
    that has not added its GPU nodes yet the cluster shows no GPU, so this is 1 too: give --parallel-pretrain."""
    trained = [c for c in models if c.max_steps]
    if not trained or not all(c.use_gpu for c in trained):
        return 1
    gpus = max(c.num_workers for c in trained)  # one GPU per Train worker (driver.py's resources_per_worker)
    cpus = max(c.num_workers * c.cpus_per_worker for c in trained)
    fit = min(resources.get("GPU", 0) // gpus, resources.get("CPU", 0) // cpus if cpus else len(trained))
    return int(max(1, min(fit, len(trained))))


def wall_hours(device_hours: Sequence[float | None], workers: Sequence[int], parallel: int) -> float | None:
    """Wall-clock hours of pretraining runs of `device_hours` each over `workers` devices each, `parallel` at once,
    each run started as a slot frees, in order (as `run.pretrain_models` does); None when a run's cost is
    unknown. Assumes a run over W devices takes 1/W of its device-hours (data parallelism scaling linearly)."""
    if any(h is None for h in device_hours):
        return None
    slots = [0.0] * max(1, parallel)
    for h, w in zip(device_hours, workers):
        if h:
            i = slots.index(min(slots))
            slots[i] += h / max(1, w)
    return max(slots)
