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
    _forward_progress()


PROGRESS_ACTOR = "alignlab-progress"
"""A named actor in the driver's namespace that holds progress lines posted from inside Ray (pretraining workers)
until the driver prints them. Needed because the driver starts Ray with `log_to_driver=False`: forwarding every
worker's output would bury the study's own lines under Ray Train's and Ray Data's."""


def _forward_progress(interval_s: float = 2.0) -> None:
    import atexit
    import threading

    import ray

    @ray.remote(num_cpus=0)
    class ProgressSink:
        def __init__(self):
            self.lines: list[str] = []

        def post(self, line: str) -> None:
            self.lines.append(line)

        def take(self) -> list[str]:
            out, self.lines = self.lines, []
            return out

    sink = ProgressSink.options(name=PROGRESS_ACTOR, get_if_exists=True).remote()
    stop = threading.Event()

    def drain() -> bool:
        try:
            for line in ray.get(sink.take.remote(), timeout=30):
                print(line, flush=True)
            return True
        except Exception:  # Ray shut down or the sink is gone: nothing left to forward
            return False

    def loop() -> None:
        while not stop.wait(interval_s) and drain():
            pass

    threading.Thread(target=loop, name="alignlab-progress", daemon=True).start()

    @atexit.register
    def _last() -> None:  # atexit runs before Ray's own shutdown hook (registered earlier): the last lines print
        stop.set()
        if ray.is_initialized():
            drain()


def post_progress(line: str) -> None:
    """Show `line` on the driver's console: through the driver's progress sink when there is one (a process
    inside Ray), printed directly otherwise."""
    import ray

    try:
        ray.get_actor(PROGRESS_ACTOR).post.remote(line)
    except (ValueError, RuntimeError):  # no sink (e.g. Ray started by a test fixture) or no Ray at all
        print(line, flush=True)


def quiet_ray_data() -> None:
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    # Deterministic row order: shards and training batches are reproducible for a seed, and a resumed
    # pretraining run can skip exactly the batches it had consumed.
    ctx.execution_options.preserve_order = True
