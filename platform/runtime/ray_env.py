"""Starting or joining Ray the same way everywhere: a laptop, a test session, a `ray job submit` driver."""
from __future__ import annotations

import contextlib
import os
import signal
import threading


_STARTED_HERE = False

LISTEN_ALL_ENV = "ALIGNLAB_RAY_LISTEN_ALL"
"""Set to 1 to let a local instance started by `ensure_ray` listen on every interface (Ray's default)."""


def _loopback_only() -> None:
    """Make the local instance `ensure_ray` starts listen on 127.0.0.1 only (GCS, raylet, object manager,
    workers, agents): a single-machine run needs no port reachable from the network.

    Ray 2.60 binds its gRPC servers to 127.0.0.1 when the node's address is the loopback address, but
    `ray.init(_node_ip_address="127.0.0.1")` is turned back into the machine's outward address. What does
    give the loopback address is Ray's switch for single-machine platforms, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
    (read when `ray` is imported, so the already-imported constant is set too); its processes inherit it.
    Checked with `ss -ltnp`: every listening socket of the instance was on 127.0.0.1. A value the user set is
    kept."""
    if "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" in os.environ:
        return
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


@contextlib.contextmanager
def own_sigint():
    """Put this process's Ctrl-C handler back after a Ray Tune or Ray Train `fit()`.

    Ray 2.60 leaves its own: `Tuner.fit` installs a handler that only logs and sets an event (it puts the old one
    back only once a Ctrl-C arrives), and Train V2's `fit` one that aborts its controller, which after the run has
    ended means `sys.exit(0)`. Checked by running them. A study driver that pretrains, then finetunes, then writes
    its report would swallow a Ctrl-C or exit 0 at it, instead of stopping with KeyboardInterrupt where its
    temp-name-and-rename writes keep what is finished. Inside `fit()` Ray's handlers stay: they stop it cleanly."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGINT) if main else None
    try:
        yield
    finally:
        if before is not None:
            signal.signal(signal.SIGINT, before)


def started_locally() -> bool:
    """Did `ensure_ray` start the Ray instance this process uses (a single machine, no autoscaler)?"""
    import ray

    return _STARTED_HERE and ray.is_initialized()


def ensure_ray(num_cpus: int | None = None) -> None:
    """Join the cluster named by RAY_ADDRESS (set by `ray job submit`) or start a local instance."""
    global _STARTED_HERE
    import ray

    if ray.is_initialized():
        # Ray started by someone else (a test fixture, a user's script, `ray.init()` before a study): the row
        # order must still be this process's deterministic one, or two runs of one model id train on other rows.
        quiet_ray_data()
        return
    kwargs: dict = {"include_dashboard": False, "log_to_driver": bool(os.environ.get("ALIGNLAB_RAY_LOGS"))}
    local = not os.environ.get("RAY_ADDRESS")
    if local:
        kwargs["num_cpus"] = num_cpus or os.cpu_count()
        kwargs["object_store_memory"] = 2 * 1024**3
        if not os.environ.get(LISTEN_ALL_ENV):
            _loopback_only()
    ray.init(**kwargs)
    _STARTED_HERE = local
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
        if not ray.is_initialized():  # a call on the actor would start a new local Ray (Ray's auto-init)
            return False
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
