"""Starting or joining Ray the same way everywhere: a laptop, a test session, a `ray job submit` driver."""
from __future__ import annotations

import os


def ensure_ray(num_cpus: int | None = None) -> None:
    """Join the cluster named by RAY_ADDRESS (set by `ray job submit`) or start a local instance."""
    import ray

    if ray.is_initialized():
        return
    kwargs: dict = {"include_dashboard": False, "log_to_driver": bool(os.environ.get("ALIGNLAB_RAY_LOGS"))}
    if not os.environ.get("RAY_ADDRESS"):
        kwargs["num_cpus"] = num_cpus or os.cpu_count()
        kwargs["object_store_memory"] = 2 * 1024**3
    ray.init(**kwargs)
    quiet_ray_data()


def quiet_ray_data() -> None:
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    # Deterministic row order: shards and training batches are reproducible for a seed, and a resumed
    # pretraining run can skip exactly the batches it had consumed.
    ctx.execution_options.preserve_order = True
