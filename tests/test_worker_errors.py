"""User errors reach the user as one line (issue #56): a pretraining run whose corpus cannot fill one batch is
refused by the driver before Ray Train starts, and an error a Train worker raises is shown as itself (its own type
and message, one line, exit 2 for bad input), not as Ray's `WorkerGroupError` with the worker's traceback in it."""
from __future__ import annotations

import dataclasses

import pytest
from fault_hooks import RaiseAt, registered

from alignlab.platform.presets import Preset
from alignlab.platform.runtime.errors import raised_in_worker, run_guarded

SMOKE = dataclasses.replace(Preset.named("smoke").pretrain, objectives="mlm", max_steps=4, checkpoint_every=2,
                            cpus_per_worker=0.25, threads_per_worker=1)


@pytest.mark.ray
def test_pretraining_on_a_corpus_smaller_than_one_batch_is_refused_in_one_line_before_ray_train_starts(
        ray_session, tmp_path, capsys):
    """What a new user tried: three documents of their own and the smoke preset's batch of 16."""
    from alignlab.platform.cli import main

    docs = tmp_path / "three.txt"
    docs.write_text("\n\n".join(f"Document {i} says a few plain words about models, data and the weather." * 2
                                for i in range(3)))
    root = tmp_path / "root"
    code = main(["pretrain", "--preset", "smoke", "--objectives", "mlm", "--source", "web", "--path", str(docs),
                 "--vocab-size", "100", "--allow-smaller-vocab", "--storage", str(root)])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("alignlab:")]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("alignlab: error: corpus ") and "fewer than one global batch of 16" in lines[0], err
    assert "--source/--path" in lines[0] and "go over the" not in err  # refused, not warned about and started
    assert list((root / "corpus").iterdir()) and not (root / "models").exists()  # Ray Train never started


@pytest.mark.ray
def test_a_value_error_raised_inside_a_train_worker_reaches_the_caller_and_the_command_line_as_itself(
        ray_session, smoke_corpus, tmp_path, capsys):
    from alignlab.platform.pretrain.driver import pretrain

    hook = registered(RaiseAt(2, ValueError("the shard at step 2 is not what this objective reads: rebuild it")))
    with pytest.raises(ValueError, match="^the shard at step 2 is not what this objective reads: rebuild it$") as got:
        pretrain(smoke_corpus, SMOKE, tmp_path / "api", max_failures=0, after_step=hook)

    def the_same_run():  # the command line's boundary, given what that run raised
        raise got.value

    code = run_guarded(the_same_run, argv=[])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1] == "alignlab: error: the shard at step 2 is not what this objective reads: rebuild it"
    assert not [ln for ln in err if "WorkerGroupError" in ln or "Traceback" in ln]


def test_ray_s_wrapping_of_a_workers_error_is_seen_through_to_the_error_itself(capsys):
    """Ray's own error classes, as Train V2 and Ray tasks build them (a worker's failure in a `WorkerGroupError`,
    a task's in a `RayTaskError`); a bug is still called one, in one line, naming the worker."""
    from ray.exceptions import RayTaskError
    from ray.train import ControllerError, WorkerGroupError
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback

    bad = ValueError("corpus c1 has 3 training rows")
    wrapped = WorkerGroupError("rank 0 failed: Traceback ...\nValueError: corpus c1 has 3 training rows",
                               {1: UserExceptionWithTraceback(KeyError("second"), "Traceback ..."),
                                0: UserExceptionWithTraceback(bad, "Traceback ...")})
    assert raised_in_worker(wrapped) is bad  # the lowest rank's
    assert raised_in_worker(ControllerError(wrapped)) is bad
    task = RayTaskError("fn", "Traceback ...", bad).as_instanceof_cause()
    assert raised_in_worker(task) is bad
    assert raised_in_worker(bad) is None and raised_in_worker(RuntimeError("plain")) is None

    def fail(e):
        def fn():
            raise e
        return fn

    assert run_guarded(fail(wrapped), argv=[]) == 2
    assert capsys.readouterr().err == "alignlab: error: corpus c1 has 3 training rows\n"
    bug = WorkerGroupError("...", {0: UserExceptionWithTraceback(ZeroDivisionError("division by zero"), "tb")})
    assert run_guarded(fail(bug), argv=[]) == 1
    assert capsys.readouterr().err == ("alignlab: internal error: ZeroDivisionError: division by zero (raised in a Ray "
                                       "worker) (run with --debug or ALIGNLAB_DEBUG=1 for the traceback)\n")
