"""Faults injected into real Ray Train runs through `pretrain(after_step=...)`: production code carries none.

The workers are other processes that cannot import this test folder, so a test passes these objects pickled by
value (`ray.cloudpickle.register_pickle_by_value(fault_hooks)`)."""
from __future__ import annotations

import os
import time

REGISTER_WAIT_S = 3 * float(os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "2")) + 1.5
"""How long a crashing rank waits first, so that the checkpoint before it is registered, as a real later failure
would find it: checkpoints are uploaded in the background (`CheckpointUploadMode.ASYNC`) and reach Ray Train's
controller through a queue of one result that it takes at each poll (every `RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`: 2 s
by default, 0.5 s in the test session, conftest.py), so the last one can need two polls after its step; a third and
1.5 s more leave room for the upload and a busy machine. Read in the test process, whose environment every Ray
process of the session (and of the clusters the tests start) inherits."""


class CrashOnce:
    """Rank 0 exits hard once, when it has finished `step` and before reporting it; a marker file in the model
    folder (`.crashed-once`) makes it happen only once, so the restarted worker group runs on."""

    def __init__(self, step: int):
        self.step = step

    def __call__(self, *, rank, step, model_dir, flush, **_) -> None:
        marker = model_dir / ".crashed-once"
        if rank == 0 and step == self.step and not marker.exists():
            marker.touch()
            flush()
            time.sleep(REGISTER_WAIT_S)  # let the controller register the previous checkpoint
            os._exit(1)


def crash_once_at(step: int) -> CrashOnce:
    import ray.cloudpickle

    import fault_hooks

    ray.cloudpickle.register_pickle_by_value(fault_hooks)
    return CrashOnce(step)


class CrashRankOnce(CrashOnce):
    """`CrashOnce` for any rank: the data-parallel resume test kills a rank other than 0."""

    def __init__(self, step: int, rank: int):
        super().__init__(step)
        self.rank = rank

    def __call__(self, *, rank, step, model_dir, flush, **_) -> None:
        marker = model_dir / ".crashed-once"
        if rank == self.rank and step == self.step and not marker.exists():
            marker.touch()
            flush()
            time.sleep(REGISTER_WAIT_S)
            os._exit(1)


class Probe:
    """Records, for every rank and reported step, the rows the rank trained on and a digest of its weights (one
    JSON line per rank and step in `out/rank<r>.jsonl`), and saves the weights and the applied gradient at the
    steps in `save_at`."""

    def __init__(self, out: str, save_at: tuple[int, ...] = ()):
        self.out, self.save_at = out, tuple(save_at)

    def __call__(self, *, rank, step, trainer, **_) -> None:
        import hashlib
        import json
        from pathlib import Path

        import torch

        sd = trainer.model.state_dict()
        h = hashlib.sha256()
        for k in sorted(sd):
            h.update(k.encode())
            h.update(sd[k].detach().cpu().contiguous().numpy().tobytes())
        with open(Path(self.out) / f"rank{rank}.jsonl", "a") as f:
            from ray.train.torch import get_device

            f.write(json.dumps({"step": step, "rows": list(trainer.last_row_ids), "digest": h.hexdigest(),
                                "device": str(trainer.device), "ray_device": str(get_device()),
                                "tensor_devices": tensor_devices(trainer)}) + "\n")
        if step in self.save_at:
            torch.save({k: v.detach().cpu().clone() for k, v in sd.items()}, Path(self.out) / f"rank{rank}-step{step}.pt")
            # The gradient this step applied (after DDP's average and the clipping): zero_grad runs in the next step.
            grads = {k: p.grad.detach().cpu().clone() for k, p in trainer.model.named_parameters() if p.grad is not None}
            torch.save(grads, Path(self.out) / f"rank{rank}-step{step}-grad.pt")


def tensor_devices(trainer) -> list[str]:
    """Where the step just taken ran, not the device the trainer was told: the devices of its weights, of the
    gradients its backward left (kept until the next step's zero_grad) and of its optimizer's state."""
    import torch

    params = list(trainer.model.parameters())
    tensors = params + [p.grad for p in params if p.grad is not None] + [
        v for s in trainer.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
    return sorted({str(t.device) for t in tensors})


class Chain:
    """Several hooks at each step, in order: a `Probe` before a crash records the step the crash follows."""

    def __init__(self, *hooks):
        self.hooks = hooks

    def __call__(self, **kwargs) -> None:
        for hook in self.hooks:
            hook(**kwargs)


def probed_steps(out, rank: int) -> list[dict]:
    """A `Probe`'s records of `rank`, in the order they were written (across a crash and its resume)."""
    import json
    from pathlib import Path

    path = Path(out) / f"rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def registered(obj):
    """`obj` with this module pickled by value, so that Ray workers can load it."""
    import ray.cloudpickle

    import fault_hooks

    ray.cloudpickle.register_pickle_by_value(fault_hooks)
    return obj


def assert_ctrl_c_raises_keyboard_interrupt() -> None:
    """A real SIGINT to this process must stop it with KeyboardInterrupt, as at a fresh prompt: not be swallowed
    (Ray Tune's leftover handler only logs) nor turned into an exit (Ray Train's aborts a finished run's controller,
    then `sys.exit(0)`)."""
    import os
    import signal
    import time

    import pytest

    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # Python raises at its next bytecode; a swallowed signal ends here and fails the test


class OutOfMemoryAt:
    """Rank `rank` raises CUDA's out-of-memory error (constructible on a CPU) when it has finished `step`, as a
    real allocation failure in the step would, and appends the step to `out/raised` each time it does."""

    def __init__(self, step: int, out: str, rank: int = 0):
        self.step, self.out, self.rank = step, out, rank

    def __call__(self, *, rank, step, **_) -> None:
        from pathlib import Path

        import torch

        if rank == self.rank and step == self.step:
            with open(Path(self.out) / "raised", "a") as f:
                f.write(f"{step}\n")
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected by a test)")


class FillDiskAt:
    """Rank 0 fills the filesystem of `path` (one file, written until the disk refuses more) when it has finished
    `step`, before that step's checkpoint is written; once (a marker file `marker`, kept on another disk)."""

    def __init__(self, step: int, path: str, marker: str):
        self.step, self.path, self.marker = step, path, marker

    def __call__(self, *, rank, step, **_) -> None:
        from pathlib import Path

        if rank != 0 or step != self.step or Path(self.marker).exists():
            return
        Path(self.marker).touch()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, b"\0" * 2**20)
        except OSError:  # ENOSPC: full
            pass
        finally:
            os.close(fd)


class WaitToBeRemovedAt:
    """Rank 0 writes the id of its Ray node to `marker` when it has finished `step` (after that step's
    checkpoint, if any, is registered), then waits there: the test removes that node. Once only (the marker).
    Every step rank 0 finishes is appended to `<marker>.steps`."""

    def __init__(self, step: int, marker: str):
        self.step, self.marker = step, marker

    def __call__(self, *, rank, step, flush, **_) -> None:
        from pathlib import Path

        import ray

        if rank != 0:
            return
        with open(f"{self.marker}.steps", "a") as f:
            f.write(f"{step}\n")
        if step != self.step or Path(self.marker).exists():
            return
        flush()
        time.sleep(REGISTER_WAIT_S)  # let the controller register the previous checkpoint
        Path(self.marker).write_text(ray.get_runtime_context().get_node_id())
        time.sleep(600)  # the node goes away under it


class RaiseAt:
    """Rank 0 raises `error` (an exception object, pickled to the worker) when it has finished `step`: a user error
    raised inside a real Train worker, as alignlab's own checks there raise them."""

    def __init__(self, step: int, error: BaseException):
        self.step, self.error = step, error

    def __call__(self, *, rank, step, **_) -> None:
        if rank == 0 and step == self.step:
            raise self.error


class Each:
    """Several hooks, called in order at every step."""

    def __init__(self, *hooks):
        self.hooks = hooks

    def __call__(self, **kw) -> None:
        for hook in self.hooks:
            hook(**kw)


class StepTimes:
    """Records when each rank finished each reported step, and on which device (one JSON line per step in
    `out/<tag>-rank<r>.jsonl`): the side-by-side tests read whether two runs trained at the same time.

    `meet`: the tags of the runs that must train at the same time. After its first step each waits (up to
    `meet_s` seconds) until all of them have made theirs, so that their training overlaps whatever their start-up
    skew; a run that could not start beside the others records `"met": false` instead of hanging."""

    def __init__(self, out: str, tag: str, meet: tuple[str, ...] = (), meet_s: float = 300.0):
        self.out, self.tag, self.meet, self.meet_s = out, tag, tuple(meet), meet_s

    def __call__(self, *, rank, step, trainer, **_) -> None:
        import json
        import time
        from pathlib import Path

        out = Path(self.out)
        t, met = time.time(), None  # when the step finished, before any wait for the others
        if self.meet and not (out / f"{self.tag}-rank{rank}.jsonl").exists():
            (out / f"{self.tag}-rank{rank}.started").touch()
            deadline = time.monotonic() + self.meet_s
            while not (met := all((out / f"{t}-rank{rank}.started").exists() for t in self.meet)):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        with open(out / f"{self.tag}-rank{rank}.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "t": t, "device": str(trainer.device),
                                "tensor_devices": tensor_devices(trainer)}
                               | ({} if met is None else {"met": met})) + "\n")


def pretrain_in_task(cdir: str, cfg: dict, root: str, after_step) -> str:
    """`pretrain` as the body of a Ray task, as a study runs models side by side (`study.run._pretrain_task`),
    with a probe after each step."""
    from alignlab.platform.config import pretrain_from_dict
    from alignlab.platform.pretrain.driver import pretrain

    return str(pretrain(cdir, pretrain_from_dict(cfg), root, after_step=after_step))
