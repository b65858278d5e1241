"""Bad input through the real command line and the real study scripts: each case exits non-zero within a
time limit, prints one line naming the flag or file and the problem, shows no traceback, and registers
nothing under the storage root. (The first slice of issue #17; see docs/guarantees.md.) Most cases run the
command's `__main__` in this process (tests/in_process.py), which also fails a case that goes on to start Ray;
those in `REAL_PROCESS` and the debug and tokenizer tests run it as a process of its own."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from in_process import run_in_process

REPO = Path(__file__).resolve().parents[1]
ALIGNLAB = [sys.executable, "-m", "alignlab.platform.cli"]
STUDY = [sys.executable, str(REPO / "studies" / "objective_ablation.py"), "--preset", "smoke"]


def _run(cmd: list[str], tmp_path: Path, timeout: float = 60) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k != "ALIGNLAB_DEBUG"}
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=timeout, env=env)
    return p.returncode, p.stdout + p.stderr


def _bad_files(tmp_path: Path) -> dict[str, Path]:
    files = {"dir": tmp_path / "a_folder", "utf8": tmp_path / "latin1.jsonl", "nested": tmp_path / "nested.jsonl",
             "ct_bad": tmp_path / "ct_bad.jsonl", "brackets": tmp_path / "brackets.txt", "missing": tmp_path / "nope.jsonl",
             "file_root": tmp_path / "root_is_a_file"}
    files["dir"].mkdir()
    files["utf8"].write_bytes(b'{"tokens": ["caf\xe9"], "tags": ["N"]}\n')
    files["nested"].write_text("[" * 200000 + "\n")
    files["ct_bad"].write_text('{"tokens": ["a", "b"], "tags": ["N"]}\n')
    files["brackets"].write_text("a [b c\n")
    files["file_root"].write_text("not a folder\n")
    return files


# (case id, argv after the command, words the one line must contain)
CLI_CASES = [
    ("objectives-empty", ["pretrain", "--objectives", ""], ["--objectives", "at least one objective"]),
    ("objectives-unknown", ["pretrain", "--objectives", "mlm,bogus"], ["--objectives", "bogus"]),
    ("max-steps-zero", ["pretrain", "--max-steps", "0"], ["--max-steps", ">= 1"]),
    ("max-steps-text", ["pretrain", "--max-steps", "ten"], ["--max-steps", "whole number"]),
    ("precision-unknown", ["pretrain", "--precision", "fp16"], ["--precision", "fp16"]),
    ("fold-out-of-range", ["finetune", "--model", "m", "--task", "ct", "--fold", "7"], ["--fold", "0..4"]),
    ("lr-nan", ["finetune", "--model", "m", "--task", "ct", "--lr", "nan"], ["--lr", "finite"]),
    ("lr-negative", ["fel", "--model", "m", "--task", "ad", "--lr=-1e-3"], ["--lr", "> 0"]),
    ("budget-zero", ["finetune", "--model", "m", "--task", "ct", "--budget", "0"], ["--budget", ">= 1"]),
    ("seed-negative", ["finetune", "--model", "m", "--task", "ct", "--seed", "-1"], ["--seed", ">= 0"]),
    ("task-unknown", ["finetune", "--model", "m", "--task", "ner"], ["--task", "invalid choice"]),
    ("workers-zero", ["corpus", "build", "--workers", "0"], ["--workers", ">= 1"]),
    ("preset-unknown", ["pretrain", "--preset", "huge"], ["huge"]),
    ("validate-a-folder", ["data", "validate", "--task", "ct", "{dir}"], ["a_folder", "folder"]),
    ("validate-not-utf8", ["data", "validate", "--task", "ct", "{utf8}"], ["latin1.jsonl:1", "not UTF-8"]),
    ("validate-nested-json", ["data", "validate", "--task", "ct", "{nested}"], ["nested.jsonl:1", "nested too deeply"]),
    ("validate-bad-ct-line", ["data", "validate", "--task", "ct", "{ct_bad}"], ["ct_bad.jsonl:1", "1 tags for 2 tokens"]),
    ("validate-missing", ["data", "validate", "--task", "ad", "{missing}"], ["nope.jsonl", "No such file"]),
    ("convert-malformed", ["data", "convert-ct", "{brackets}", "{tmp}/out.jsonl"], ["brackets.txt:1", "never closed"]),
    ("report-not-a-study", ["report", "{tmp}"], ["not a study folder"]),
    ("report-remote-without-study", ["report", "s3://bucket/prefix"], ["s3://bucket/prefix", "not a study folder"]),
    ("evaluate-unknown-model", ["evaluate", "--model", "ct-0000", "--task", "ct", "{ct_bad}", "--storage", "{tmp}/st"],
     ["ct-0000", "no finetuned model"]),
    ("web-source-missing-path", ["corpus", "build", "--source", "web", "--path", "{missing}", "--storage", "{tmp}/st"],
     ["nope.jsonl"]),
]

STUDY_CASES = [
    ("max-concurrent-negative", ["--max-concurrent", "-1"], ["--max-concurrent", ">= 1"]),
    ("max-concurrent-zero", ["--max-concurrent", "0"], ["--max-concurrent", ">= 1"]),
    ("cpus-per-trial-zero", ["--cpus-per-trial", "0"], ["--cpus-per-trial", "> 0"]),
    ("gpus-per-trial-nan", ["--gpus-per-trial", "nan"], ["--gpus-per-trial", "finite"]),
    ("parallel-pretrain-zero", ["--parallel-pretrain", "0"], ["--parallel-pretrain", ">= 1"]),
    ("train-workers-zero", ["--train-workers", "0"], ["--train-workers", ">= 1"]),
    ("precision-unknown", ["--precision", "fp16"], ["--precision", "fp16"]),
    ("cpus-per-train-worker-zero", ["--cpus-per-train-worker", "0"], ["--cpus-per-train-worker", "> 0"]),
    ("preset-unknown", ["--preset", "huge"], ["--preset", "huge"]),
    ("eval-file-without-task", ["--eval-file", "{ct_bad}"], ["--eval-file", "ct=PATH"]),
    ("eval-file-missing", ["--eval-file", "ct={missing}"], ["--eval-file", "not a file"]),
    ("trial-resources-not-json", ["--trial-resources", "{{fel_node: 1}}"], ["--trial-resources", "not JSON"]),
    ("trial-resources-negative", ["--trial-resources", '{{"fel_node": -1}}'], ["--trial-resources", "positive"]),
]


# Run as processes of their own, as a user's shell runs them; every other case runs in this process
# (tests/in_process.py: the same `__main__` code, without importing torch again for each one-line refusal).
REAL_PROCESS = {"report-not-a-study", "eval-file-missing"}


def _fill(argv: list[str], files: dict[str, Path], tmp_path: Path) -> list[str]:
    return [a.format(tmp=tmp_path, **files) for a in argv]


def _check(code: int, out: str, words: list[str], tmp_path: Path) -> None:
    assert code != 0, out
    assert "Traceback" not in out, out
    lines = [l for l in out.splitlines() if l.strip() and "WARNING" not in l and "INFO" not in l]
    assert len(lines) <= 2, out  # the error line (a task file's error adds its one FILE:LINE problem)
    for w in words:
        assert w in out, (w, out)
    assert not list((tmp_path / "st").glob("*/*/manifest.json")) and not list((tmp_path / "st").glob("models/*/final"))


def _run_case(case: str, cmd: list[str], tmp_path: Path, capfd, monkeypatch) -> tuple[int, str]:
    if case in REAL_PROCESS:
        return _run(cmd, tmp_path)
    return run_in_process(cmd, tmp_path, capfd, monkeypatch)


@pytest.mark.parametrize("case, argv, words", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_the_cli_refuses_bad_input_in_one_line_without_a_traceback(tmp_path, case, argv, words, capfd, monkeypatch):
    files = _bad_files(tmp_path)
    code, out = _run_case(case, ALIGNLAB + _fill(argv, files, tmp_path), tmp_path, capfd, monkeypatch)
    _check(code, out, words, tmp_path)


@pytest.mark.parametrize("case, argv, words", STUDY_CASES, ids=[c[0] for c in STUDY_CASES])
def test_a_study_script_refuses_bad_flags_in_one_line_without_a_traceback(tmp_path, case, argv, words, capfd,
                                                                           monkeypatch):
    files = _bad_files(tmp_path)
    cmd = STUDY + ["--storage", str(tmp_path / "st")] + _fill(argv, files, tmp_path)
    code, out = _run_case(case, cmd, tmp_path, capfd, monkeypatch)
    _check(code, out, words, tmp_path)
    assert not (tmp_path / "st").exists(), "a refused flag must not start any work"


def test_debug_shows_the_traceback_that_the_boundary_otherwise_hides(tmp_path):
    code, out = _run(ALIGNLAB + ["report", str(tmp_path)], tmp_path)
    assert code == 2 and "Traceback" not in out
    code, out = _run(ALIGNLAB + ["--debug", "report", str(tmp_path)], tmp_path)
    assert code != 0 and "Traceback" in out and "not a study folder" in out


def test_a_model_folder_whose_tokenizer_is_not_its_own_is_refused_in_one_line(tmp_path):
    """A tokenizer.model copied in from another model (its marker rewritten, so the folder looks whole): every
    id would index the wrong embedding row, silently. Loading refuses it, naming the folder and both sizes."""
    from alignlab.platform.storage.root import MARKER, write_marker
    from tiny_model import tiny_pretrained, tiny_tokenizer

    root = tmp_path / "st"
    mdir = tiny_pretrained(root)
    other = tiny_tokenizer(tmp_path / "other", vocab_size=400)
    final = mdir / "final"
    (final / "tokenizer.model").write_bytes(Path(other.model_path).read_bytes())
    (final / MARKER).unlink()
    write_marker(final)
    code, out = _run(ALIGNLAB + ["finetune", "--model", mdir.name, "--task", "ct", "--preset", "smoke",
                                 "--storage", str(root)], tmp_path, timeout=120)
    assert code == 2 and "Traceback" not in out, out
    assert "tokenizer.model has 400 pieces but the model was trained with 600" in out, out
