"""The prepared GPU check (benchmarks/gpu_checks.sh) cannot fail for a typo when GPU time comes: its dry run on CPU
runs every part's command at toy sizes and prints every summary line."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(sys.platform == "win32", reason="a bash script")
def test_the_gpu_checks_dry_run_runs_every_part_on_cpu_and_prints_its_figures(tmp_path):
    out = tmp_path / "checks"
    run = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_checks.sh"), "--dry-run", str(out)],
                         capture_output=True, text=True, timeout=900, env={**os.environ, "ALIGNLAB_COMMIT": "dryrun"})
    assert run.returncode == 0, run.stdout + run.stderr
    parts = ("cuda_tests", "step_128x2_vocab32000", "step_128x2_vocab111000", "paper_input_path_128x2",
             "side_by_side_128x2")
    for part in parts:
        assert f"{part}: exit 0" in run.stdout, run.stdout
        assert (out / f"{part}.log").read_text().splitlines()[1].startswith("# commit dryrun")
    for name in parts[1:]:
        assert (out / f"{name}.json").is_file(), name  # each benchmark's figures, with its command and commit
    assert "Ray Train end to end" in run.stdout and "side by side give" in run.stdout
    assert run.stdout.count("ms/step") >= 2  # the step alone at both vocabularies
