"""End to end, as a user runs it: the worked example's token-tagging task (examples/software_ner, PyPI summaries
tagged B-/I-LANG and B-/I-TECH) declared on the command line of the objective-ablation study at the smoke
preset, on a real local Ray, with no code and no file of alignlab changed."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "software_ner"


@pytest.mark.ray
def test_a_declared_tagging_task_gets_its_own_rows_baselines_and_span_f1_in_the_ablation_study(tmp_path):
    storage = tmp_path / "storage"
    spec = f"name=swner,kind=tagging,pool={EXAMPLE / 'pool.jsonl'},test={EXAMPLE / 'test.jsonl'},aligned=whp"
    cmd = [sys.executable, str(REPO / "studies" / "objective_ablation.py"), "--preset", "smoke",
           "--storage", str(storage), "--task", spec, "--only-tasks", "swner"]
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    [sdir] = [p for p in (storage / "studies").iterdir() if p.name.startswith("objective_ablation-smoke-tasks-")]
    results = pd.read_parquet(sdir / "results.parquet")
    assert len(results) == 6 and set(results["row"]) == {"SWNER"}
    assert set(results["col"]) == {"all*", "-whp*", "-pad*"} and set(results["ft_task"]) == {"swner"}
    assert set(results["num_test"]) == {sum(len(line.split('"tags"')[1].split(",")) for line in
                                            (EXAMPLE / "test.jsonl").read_text().splitlines())}
    assert results["span_f1"].between(0, 1).all()
    assert results["baseline_lexicon"].gt(results["baseline_majority"]).all()
    text = (sdir / "report.md").read_text()
    assert "SWNER" in text and "lexicon" in text


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
