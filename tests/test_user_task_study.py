"""A plugin package's objective and task in the objective-ablation study at the smoke preset, on a real local Ray,
with no file of alignlab changed; and bad task files stopping a study before any work. A token-tagging task declared
on the study's command line (examples/software_ner) runs end to end in tests/test_e2e.py's study."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.test_plugins import _env, _install

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "software_ner"


# -m slow (~180 s): its parts run in the default suite -- an installed plugin registers its objective and task
# (test_plugins.py), a new objective is pretrained under Ray Train and reaches the report (test_new_objective.py),
# a task that is not bundled runs in this study (test_e2e.py).
@pytest.mark.slow
@pytest.mark.ray
def test_a_plugins_objective_and_task_run_in_the_smoke_ablation_study_and_reach_the_report(tmp_path):
    site = _install(tmp_path, "toyplugin", "par", "toytag")
    storage = tmp_path / "storage"
    cmd = [sys.executable, str(REPO / "studies" / "objective_ablation.py"), "--preset", "smoke",
           "--storage", str(storage), "--objectives", "mlm,nsp,whp,pad,par", "--only-tasks", "toytag"]
    run = subprocess.run(cmd, cwd=REPO, env=_env(site), capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    [sdir] = [p for p in (storage / "studies").iterdir() if p.name.startswith("objective_ablation-smoke+par-tasks-")]
    text = (sdir / "report.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| model | objectives | steps |"))
    assert "| PAR |" in header
    row = next(line for line in text.splitlines() if "| mlm+nsp+whp+pad+par |" in line)
    assert row.split("|")[-2].strip() != "/"  # the plugin objective's held-out accuracy / perplexity
    assert "TOYTAG" in text
    assert set(pd.read_parquet(sdir / "results.parquet")["ft_task"]) == {"toytag"}


def test_bad_task_files_stop_the_study_before_any_work_naming_file_and_line(tmp_path):
    pool = tmp_path / "pool.jsonl"
    pool.write_text('{"tokens": ["a", "b"], "tags": ["O", "B-X"]}\n{"tokens": ["a"], "tags": ["O", "O"]}\n')
    cmd = [sys.executable, str(REPO / "studies" / "objective_ablation.py"), "--preset", "smoke",
           "--storage", str(tmp_path / "storage"), "--task",
           f"name=bad,kind=tagging,pool={pool},test={EXAMPLE / 'test.jsonl'}"]
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert f"{pool}:2: 2 tags for 1 tokens" in run.stderr
    assert not (tmp_path / "storage" / "studies").exists()
