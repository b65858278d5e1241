"""One front door: `alignlab study NAME [flags]` runs the study script NAME's own entry (`main`, what
`python studies/NAME.py` runs) with exactly its flags, so both commands build the same study, with the same id
(its folder name), and write the same report. Nothing here runs a study: `run_study` (and the objective search)
are replaced by a recorder of what they were asked to run."""
from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from alignlab.platform import cli
from in_process import run_in_process

REPO = Path(__file__).resolve().parents[1]
STUDIES = REPO / "studies"
SCRIPTS = sorted(p.stem for p in STUDIES.glob("*.py") if not p.stem.startswith("_"))


def script_module(name: str):
    """The script as `python studies/NAME.py` loads it: from its file, not as a package module."""
    spec = importlib.util.spec_from_file_location(f"front_door_script_{name}", STUDIES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Recorder:
    """Stands in for `run_study` and `run_objective_search`: records what it was asked to run."""

    def __init__(self):
        self.runs: list = []

    def __call__(self, study, root, **kw):
        self.runs.append((study, kw))
        return Path("report.md")


@pytest.fixture
def recorded(monkeypatch):
    """Every study (or objective search) a command would run, recorded instead of run."""
    recorder = Recorder()
    # `run_study` where the scripts' `study_main` calls it (found through a script, wherever the module lives)
    monkeypatch.setattr(sys.modules[script_module("learning_rate").study_main.__module__], "run_study", recorder)
    # objective_mix runs its search itself: patched in the package module the front door imports
    monkeypatch.setattr(importlib.import_module("alignlab.studies.objective_mix"), "run_objective_search", recorder)
    return recorder


def run_script(name: str, argv: list[str], monkeypatch, recorder: Recorder) -> None:
    """The script's `main`, as its `if __name__ == "__main__"` calls it, on `argv`."""
    module = script_module(name)
    if hasattr(module, "run_objective_search"):
        monkeypatch.setattr(module, "run_objective_search", recorder)
    module.main(argv)


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_front_door_and_the_script_build_the_same_study_with_the_same_id(name, recorded, monkeypatch, tmp_path):
    # The alignment control runs its A/A as a second study (one is compared here) and declares its synthetic task
    # in this process: forgotten afterwards, so that later tests see only their own declared tasks.
    extra = ["--skip-aa"] if name == "alignment_control" else []
    try:
        run_script(name, ["--preset", "smoke", *extra, "--storage", str(tmp_path / "script")], monkeypatch, recorded)
        assert cli.main(["study", name, "--preset", "smoke", *extra, "--storage", str(tmp_path / "door")]) == 0
    finally:
        if name == "alignment_control":
            from alignlab.platform.tasks.task import task_names
            from alignlab.platform.tasks.task_kinds import undeclare

            from alignlab.studies.alignment_control import TASK
            if TASK in task_names():
                undeclare(TASK)
    (by_script, script_kw), (by_door, door_kw) = recorded.runs
    assert by_door == by_script
    assert by_door.name == by_script.name and by_door.name.startswith(f"{name}-smoke")
    assert door_kw == script_kw  # the same trial resources, concurrency, Optuna storage


def test_a_flag_given_to_the_front_door_changes_the_study_as_it_does_through_the_script(recorded, monkeypatch,
                                                                                          tmp_path):
    flags = ["--preset", "smoke", "--precision", "fp32", "--objectives", "mlm,nsp,whp,pad,rtd", "--storage"]
    run_script("objective_ablation", [*flags, str(tmp_path / "a")], monkeypatch, recorded)
    assert cli.main(["study", "objective_ablation", *flags, str(tmp_path / "b")]) == 0
    (by_script, _), (by_door, _) = recorded.runs
    assert by_door == by_script and by_door.name == "objective_ablation-smoke+rtd-fp32"


def test_study_help_lists_every_script_in_studies_with_the_first_line_of_its_docstring(capsys):
    assert cli.main(["study", "--help"]) == 0
    out = capsys.readouterr().out
    for name in SCRIPTS:
        first = (script_module(name).__doc__ or "").strip().splitlines()[0]
        assert re.search(rf"^  {name} +{re.escape(first)}$", out, re.M), name


def test_an_unknown_study_exits_non_zero_naming_the_available_studies():
    run = subprocess.run([sys.executable, "-m", "alignlab.platform.cli", "study", "no_such_study"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "no study 'no_such_study'" in run.stderr
    assert all(name in run.stderr for name in SCRIPTS)


def test_a_study_named_with_no_name_is_an_error_listing_the_studies(capsys):
    assert cli.main(["study"]) == 2
    err = capsys.readouterr().err
    assert all(name in err for name in SCRIPTS)


def options(help_text: str) -> tuple[set[str], str]:
    """The long flags a --help names, and its options section (the usage above it names the program)."""
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", help_text)), help_text[help_text.index("\noptions:"):]


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_flags_of_the_front_door_are_those_of_the_script(name, capfd, monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "100")
    code, script = run_in_process([sys.executable, str(STUDIES / f"{name}.py"), "--help"], tmp_path, capfd, monkeypatch)
    assert code == 0, script
    assert cli.main(["study", name, "--help"]) == 0
    door = capfd.readouterr().out
    assert door.startswith(f"usage: alignlab study {name} ")
    assert options(door) == options(script)
    assert "--preset" in options(door)[0] and "--storage" in options(door)[0]


def test_plan_takes_a_studys_name_as_it_takes_the_scripts_path(capsys, tmp_path):
    flags = ["--preset", "smoke", "--storage", str(tmp_path / "root")]
    assert cli.main(["plan", "learning_rate", *flags]) == 0
    by_name = capsys.readouterr().out
    assert cli.main(["plan", str(STUDIES / "learning_rate.py"), *flags]) == 0
    assert capsys.readouterr().out == by_name and "learning_rate-smoke" in by_name
