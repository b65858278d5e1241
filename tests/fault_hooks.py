"""Faults injected into real Ray Train runs through `pretrain(after_step=...)`: production code carries none.

The workers are other processes that cannot import this test folder, so a test passes these objects pickled by
value (`ray.cloudpickle.register_pickle_by_value(fault_hooks)`)."""
from __future__ import annotations

import os
import time


class CrashOnce:
    """Rank 0 exits hard once, when it has finished `step` and before reporting it; a marker file in the model
    folder (`.crashed-once`) makes it happen only once, so the restarted worker group runs on."""

    def __init__(self, step: int):
        self.step = step

    def __call__(self, *, rank, step, model_dir, flush) -> None:
        marker = model_dir / ".crashed-once"
        if rank == 0 and step == self.step and not marker.exists():
            marker.touch()
            flush()
            time.sleep(3)  # let the controller register the previous checkpoint, as a real later failure would
            os._exit(1)


def crash_once_at(step: int) -> CrashOnce:
    import ray.cloudpickle

    import fault_hooks

    ray.cloudpickle.register_pickle_by_value(fault_hooks)
    return CrashOnce(step)
