"""`python -m alignlab.platform.cli ARGS` or `python studies/NAME.py ARGS`, run inside the test process.

The refusal tests run dozens of commands that stop at a flag or at the first line of a file. As processes of their
own each spent most of its time importing torch to print one line. `runpy` runs the module or the script as `__main__`,
as the interpreter's `-m` and script modes do: the same `if __name__ == "__main__"` line and the same argv. The
result is read as a process's would be: the exit status from SystemExit, and an uncaught exception printed as a
traceback with status 1.

Two things differ from a real process: modules imported before stay imported (the command's own module runs
afresh), and the environment is the test process's. Real processes still run in test_faults' debug and tokenizer
tests, the cases listed in its `REAL_PROCESS`, and the study scripts of test_user_task_study.

A command that would start or join Ray is stopped with `ReachedRay`. A refusal must come before any work, and a Ray
started here would be the test session's own.
"""
from __future__ import annotations

import runpy
import sys
import traceback
import warnings
from pathlib import Path


class ReachedRay(BaseException):
    """Raised where the command would start or join Ray. A BaseException, so that the command's error boundary
    (which turns an Exception into one line) does not swallow it."""


def _stop_at_ray(monkeypatch) -> None:
    from alignlab.platform.runtime import ray_env

    original = ray_env.ensure_ray

    def stop(*args, **kwargs):
        raise ReachedRay("the command went on to start Ray: run this case as a process of its own")

    # Modules imported before bound the function by name; the ones the command imports now read it from ray_env.
    for module in list(sys.modules.values()):
        if getattr(module, "ensure_ray", None) is original:
            monkeypatch.setattr(module, "ensure_ray", stop)


def run_in_process(cmd: list[str], cwd: Path, capfd, monkeypatch) -> tuple[int, str]:
    """Run `cmd` (written as for subprocess: `[sys.executable, "-m", MODULE, *args]` or `[sys.executable, SCRIPT,
    *args]`) in `cwd`, without ALIGNLAB_DEBUG; return its exit status and its stdout + stderr."""
    assert cmd[0] == sys.executable, cmd
    if cmd[1] == "-m":
        target, args = cmd[2], cmd[3:]

        def run():
            return runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        target, args = cmd[1], cmd[2:]
        monkeypatch.syspath_prepend(str(Path(target).parent))  # as `python SCRIPT` puts the script's folder first

        def run():
            return runpy.run_path(target, run_name="__main__")
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", [target, *args])
    monkeypatch.delenv("ALIGNLAB_DEBUG", raising=False)
    _stop_at_ray(monkeypatch)
    capfd.readouterr()
    try:
        with warnings.catch_warnings():
            # runpy's note that the module was imported before (by the tests): it runs afresh as __main__.
            warnings.filterwarnings("ignore", message=".*found in sys.modules.*", category=RuntimeWarning)
            run()
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except Exception:  # noqa: BLE001 -- what the interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    out, err = capfd.readouterr()
    return code, out + err
