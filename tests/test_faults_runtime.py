"""Faults at run time (issue #17, the rest after test_faults.py): impossible resource requests, non-finite
numbers, and what a local Ray instance listens on. Through the real command line and study scripts, on a real
Ray instance; no mocks of Ray or the model."""
from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ALIGNLAB = [sys.executable, "-m", "alignlab.platform.cli"]
STUDY = [sys.executable, str(REPO / "studies" / "objective_ablation.py"), "--preset", "smoke"]


def _run(cmd: list[str], cwd: Path, timeout: float = 120, env: dict | None = None) -> tuple[int, str, float]:
    env = {**{k: v for k, v in os.environ.items() if k not in ("ALIGNLAB_DEBUG", "RAY_ADDRESS")}, **(env or {})}
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    return p.returncode, p.stdout + p.stderr, time.monotonic() - t0


def _one_error_line(out: str) -> str:
    lines = [l for l in out.splitlines() if l.startswith("alignlab: ")]
    assert len(lines) == 1, out
    assert "Traceback" not in out, out
    return lines[0]


# ---------------------------------------------------------------- 1. impossible resource requests


def test_pretraining_that_asks_for_gpus_and_more_cpus_than_this_machine_has_is_refused_before_the_corpus_is_built(
        tmp_path):
    # The paper preset: 4 Train workers x {CPU: 4, GPU: 1}. On a CPU-only machine this used to wait forever.
    code, out, took = _run(ALIGNLAB + ["pretrain", "--preset", "paper", "--storage", str(tmp_path / "st")], tmp_path)
    assert code == 2, out
    line = _one_error_line(out)
    for words in ("pretraining", "4 x {CPU: 4, GPU: 1}", f"CPU: {os.cpu_count()}", "wait forever"):
        assert words in line, (words, line)
    assert took < 90, f"took {took:.0f}s"
    assert not (tmp_path / "st" / "corpus").exists() and not (tmp_path / "st" / "models").exists()


def test_an_fel_trial_asking_for_a_gpu_on_a_cpu_only_machine_is_refused_before_any_work(tmp_path):
    code, out, took = _run(STUDY + ["--storage", str(tmp_path / "st"), "--gpus-per-trial", "1"], tmp_path)
    assert code == 2, out
    line = _one_error_line(out)
    for words in ("an FEL trial", "{CPU: 1, GPU: 1}", "no autoscaler", "--gpus-per-trial"):
        assert words in line, (words, line)
    assert took < 90, f"took {took:.0f}s"
    assert not (tmp_path / "st" / "studies").exists() and not (tmp_path / "st" / "tasks").exists()


def test_an_fel_trial_asking_for_a_custom_resource_that_no_node_offers_is_refused_without_an_autoscaler(tmp_path):
    code, out, _ = _run(STUDY + ["--storage", str(tmp_path / "st"), "--trial-resources", '{"fel_node": 1}'], tmp_path)
    assert code == 2, out
    assert "fel_node: 1" in _one_error_line(out)


@pytest.mark.ray
def test_a_request_that_fits_passes_and_one_that_does_not_names_what_was_asked_and_what_exists(ray_session):
    from alignlab.platform.resources import ResourceRequestError, check_request

    check_request("an FEL trial", {"cpu": 1})
    check_request("pretraining", {"CPU": 0.5}, 2, spare_cpus=1)
    with pytest.raises(ResourceRequestError, match=r"an FEL trial asks for \{CPU: 3\}, but the cluster has \{CPU: 2\}"):
        check_request("an FEL trial", {"cpu": 3})
    with pytest.raises(ResourceRequestError, match=r"3 x \{CPU: 1\}.*only 2 fit"):
        check_request("pretraining", {"CPU": 1}, 3)
    with pytest.raises(ResourceRequestError, match=r"plus 1 CPU left free for Ray Data"):
        check_request("pretraining", {"CPU": 1}, 2, spare_cpus=1)


@pytest.mark.ray
def test_pretrain_itself_refuses_an_impossible_request_before_writing_the_model_folder(ray_session, smoke_corpus,
                                                                                      tmp_path):
    import dataclasses

    from alignlab.platform.config import PRETRAIN_PRESETS
    from alignlab.platform.pretrain_ray import pretrain
    from alignlab.platform.resources import ResourceRequestError

    cfg = dataclasses.replace(PRETRAIN_PRESETS["smoke"], use_gpu=True)
    with pytest.raises(ResourceRequestError, match="GPU: 1"):
        pretrain(smoke_corpus, cfg, tmp_path / "root")
    assert not (tmp_path / "root" / "models").exists()


# ---------------------------------------------------------------- 5. what a local Ray instance listens on

_LISTENERS = """
import json, psutil
from alignlab.platform.ray_env import ensure_ray
ensure_ray()
import ray
me = psutil.Process()
procs = [me] + me.children(recursive=True)
out = []
for p in procs:
    try:
        conns = p.net_connections(kind="inet")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        continue
    out += [[p.name(), c.laddr.ip, c.laddr.port] for c in conns if c.status == psutil.CONN_LISTEN]
print("LISTEN " + json.dumps({"nodes": [n["NodeManagerAddress"] for n in ray.nodes()], "sockets": out}))
"""


def _listeners(tmp_path: Path, env: dict | None = None) -> dict:
    code, out, _ = _run([sys.executable, "-c", _LISTENERS], tmp_path, env=env)
    assert code == 0, out
    return json.loads(next(l for l in out.splitlines() if l.startswith("LISTEN "))[len("LISTEN "):])


def _loopback(ip: str) -> bool:
    ip = ip.removeprefix("::ffff:")
    return ipaddress.ip_address(ip).is_loopback


def test_a_local_ray_instance_started_by_alignlab_listens_on_the_loopback_address_only(tmp_path):
    seen = _listeners(tmp_path)
    assert seen["nodes"] == ["127.0.0.1"], seen
    names = {name for name, _, _ in seen["sockets"]}
    assert {"gcs_server", "raylet"} <= names, seen  # the instance's own servers were found
    outside = [s for s in seen["sockets"] if not _loopback(s[1])]
    assert not outside, f"listening beyond loopback: {outside}"
