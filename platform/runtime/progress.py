"""The one line a person watching a long pretraining run reads: step, loss, rate and ETA, throttled."""
from __future__ import annotations

import math
import time
from collections.abc import Callable


class ProgressLine:
    """What a person watching a long pretraining run needs: `[pretrain NAME] step 1200/2000 (60%), loss 5.31,
    4.12 steps/s, ETA 3m20s`. Printed at most every `every_s` seconds and always at the last step, so a
    2,000-step run prints a few dozen lines, not 2,000. The rate (and so the ETA) counts only the steps this
    process ran: a resumed run does not claim the steps of its previous life."""

    def __init__(self, name: str, max_steps: int, start_step: int, every_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic):
        self.name, self.max_steps, self.start_step, self.every_s, self.clock = name, max_steps, start_step, every_s, clock
        self.t0 = self.last = clock()

    def update(self, step: int, loss: float) -> str | None:
        now = self.clock()
        if step < self.max_steps and now - self.last < self.every_s:
            return None
        self.last = now
        ran, el = step - self.start_step, now - self.t0
        rate = ran / el if el > 0 else 0.0
        eta = (self.max_steps - step) / rate if rate > 0 else float("nan")
        return (f"[pretrain {self.name}] step {step}/{self.max_steps} ({100 * step / self.max_steps:.0f}%), "
                f"loss {loss:.3f}, {rate:.2f} steps/s, ETA {_duration(eta)}")


def _duration(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = round(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
