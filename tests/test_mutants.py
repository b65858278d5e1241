"""The mutants of tests/mutants/mutants.py: deliberate breakages of the guarantees, each with the default-run tests
that must fail on it. By default only that every mutant still applies (its text is in the code once, its tests
exist); under `-m slow` the script runs them all, each in a copy of the checkout, and none may survive."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "mutants"))

import mutants  # noqa: E402


def test_every_mutant_still_applies_to_the_code_and_names_default_run_tests_that_exist():
    assert len(mutants.MUTANTS) >= 7
    assert [p for m in mutants.MUTANTS for p in mutants.problems(m)] == []


# -m slow: every mutant's tests in a copy of the checkout, one mutant after another (the resume, key and holdout
# mutants pretrain or build a corpus: several minutes in all on 2 cores).
@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_no_mutant_survives_the_default_run_tests_named_for_it():
    done = subprocess.run([sys.executable, str(Path(__file__).parent / "mutants" / "mutants.py"), "--baseline"],
                          capture_output=True, text=True, timeout=3500)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 survived" in done.stdout and "0 errors" in done.stdout
