"""Issue #46: a worker node lost in the middle of pretraining, on a real multi-node Ray cluster on this machine
(`ray.cluster_utils.Cluster`: every node is its own raylet; `remove_node` kills one with everything on it, as a
spot or preemptible GPU node disappears). The heavy forms are slow and start their own cluster in the test process:
`pytest -m "cluster and slow" tests/test_node_loss.py` (the default run leaves them out). The default run's form
loses a node of a cluster that a subprocess starts, four steps into a smoke pretraining."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


def _in_background(step, stop: threading.Event) -> threading.Thread:
    """Call `step()` every 0.2 s until it returns True or `stop` is set."""
    def loop() -> None:
        while not stop.is_set() and not step():
            time.sleep(0.2)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


def _remove_the_node_named_in(marker: Path, cluster, removed: list):
    def step() -> bool:
        if not (marker.exists() and marker.read_text()):
            return False
        (node,) = [n for n in cluster.worker_nodes if n.node_id == marker.read_text()]
        cluster.remove_node(node, allow_graceful=False)
        removed.append(node.node_id)
        return True

    return step


_LOSE_A_NODE = r'''
import json, sys, threading
from pathlib import Path

args = json.loads(sys.argv[1])
sys.path.insert(0, args["tests"])
import ray
from ray.cluster_utils import Cluster

from fault_hooks import Chain, Probe, WaitToBeRemovedAt, registered
from test_node_loss import _in_background, _remove_the_node_named_in

from alignlab.platform.config import pretrain_from_dict
from alignlab.platform.pretrain.driver import pretrain
from alignlab.platform.runtime.ray_env import quiet_ray_data

# The GCS checks every node every second and takes it for dead after 3 failed checks in a row (Ray's defaults: every
# 3 s, 5 checks): the Train worker on the removed node is reported dead, and the run goes on, that much sooner. A
# live raylet on a busy machine still has each check's 10 s to answer.
cluster = Cluster(initialize_head=True, head_node_args={
    "num_cpus": 0, "include_dashboard": False,
    "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}})
stop = threading.Event()
try:
    for _ in range(2):
        cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, log_to_driver=False)
    quiet_ray_data()
    marker, removed = Path(args["marker"]), []
    _in_background(_remove_the_node_named_in(marker, cluster, removed), stop)
    mdir = pretrain(args["corpus"], pretrain_from_dict(args["cfg"]), args["root"], max_failures=2,
                    after_step=registered(Chain(Probe(args["probe"]), WaitToBeRemovedAt(3, str(marker)))))
    alive = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    print("RESULT=" + json.dumps({"model": str(mdir), "removed": removed, "alive": alive}))
finally:
    stop.set()
    ray.shutdown()
    cluster.shutdown()
'''
"""A driver of a cluster of its own (`ray.cluster_utils.Cluster`: a head with no CPUs, two worker nodes of 2 CPUs)
that pretrains and removes the node of rank 0 once it has finished step 3; prints RESULT=<json>."""


@pytest.mark.ray
@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_a_smoke_pretraining_whose_worker_node_is_lost_resumes_on_the_other_node_from_its_checkpoint(smoke_corpus,
                                                                                                     tmp_path):
    """The default run's form of the test below, at 4 steps: the node of the Train worker goes after step 3 (the
    checkpoint of step 2 is registered), the worker group is placed on the other node and trains steps 3 and 4
    only, step 3 to the weights the first life reached there. The cluster runs in a subprocess, beside the session's
    Ray, on the session's smoke corpus."""
    from fault_hooks import probed_steps

    from alignlab.platform.config import to_dict
    from alignlab.platform.pretrain.models import is_finished
    from alignlab.platform.presets import Preset

    cfg = dataclasses.replace(Preset.named("smoke").pretrain, objectives="mlm,nsp", max_steps=4, checkpoint_every=2,
                              log_every=1, precision="fp32", cpus_per_worker=1.0)
    probe = tmp_path / "probe"
    probe.mkdir()
    args = {"tests": str(Path(__file__).parent), "corpus": str(smoke_corpus), "cfg": to_dict(cfg),
            "root": str(tmp_path / "root"), "probe": str(probe), "marker": str(tmp_path / "node-of-rank0")}
    run = subprocess.run([sys.executable, "-c", _LOSE_A_NODE, json.dumps(args)], capture_output=True, text=True,
                         timeout=540, env={**os.environ, "RAY_ADDRESS": ""})
    line = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT=")]
    assert run.returncode == 0 and line, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(line[0][len("RESULT="):])
    assert result["removed"] and result["removed"][0] not in result["alive"]  # the node really went
    assert is_finished(Path(result["model"]))
    records = probed_steps(probe, 0)
    assert [r["step"] for r in records] == [1, 2, 3, 3, 4], [r["step"] for r in records]
    assert records[3]["digest"] == records[2]["digest"], "step 3 again did not reach step 3's weights"


@pytest.mark.ray
@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_pretraining_finishes_on_another_node_from_the_last_checkpoint_when_its_worker_node_is_lost(tmp_path):
    """Head with no CPUs (the driver and the Train controller live there, as on a cluster whose head runs no work),
    two worker nodes of 2 CPUs. The node running the Train worker is removed after step 5 (the last checkpoint:
    step 4); the run restarts on the other node from that checkpoint, and the model is bit-identical to an
    uninterrupted run's."""
    import ray
    import torch
    from ray.cluster_utils import Cluster

    from fault_hooks import WaitToBeRemovedAt, registered

    from alignlab.platform.corpus.corpus import build_corpus
    from alignlab.platform.presets import Preset
    from alignlab.platform.pretrain.driver import pretrain
    from alignlab.platform.pretrain.models import is_finished
    from alignlab.platform.runtime.ray_env import quiet_ray_data

    cfg = dataclasses.replace(Preset.named("smoke").pretrain, max_steps=8, checkpoint_every=2, log_every=1,
                              precision="fp32", cpus_per_worker=1.0)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    stop = threading.Event()
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=2)
        ray.init(address=cluster.address, log_to_driver=False)
        quiet_ray_data()
        cdir = build_corpus(Preset.named("smoke").corpus, tmp_path / "corpus-root", progress=False)
        whole = pretrain(cdir, cfg, tmp_path / "uninterrupted")
        marker, removed = tmp_path / "node-of-rank0", []
        _in_background(_remove_the_node_named_in(marker, cluster, removed), stop)
        mdir = pretrain(cdir, cfg, tmp_path / "lost", max_failures=2,
                        after_step=registered(WaitToBeRemovedAt(5, str(marker))))
        assert removed and removed[0] not in {n["NodeID"] for n in ray.nodes() if n["Alive"]}  # it really went
        assert is_finished(mdir)
        a = torch.load(whole / "final" / "model.pt", weights_only=True)
        b = torch.load(mdir / "final" / "model.pt", weights_only=True)
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), f"{k} differs from the uninterrupted run"
        steps = [int(s) for s in Path(f"{marker}.steps").read_text().split()]
        assert steps == [1, 2, 3, 4, 5, 5, 6, 7, 8], steps  # resumed after the step-4 checkpoint: step 5 again
    finally:
        stop.set()
        ray.shutdown()
        cluster.shutdown()


def _remove_a_node_that_ran_a_calculation(sdir: Path, cluster, removed: list):
    """Once two calculations are finished, remove the node the latest ran on: its trial actor is reused for the
    next calculation there (`reuse_actors`), so that one is cut off mid-way. Records {calc_id: started_at} of the
    calculations finished by then, and the node."""
    import json

    def step() -> bool:
        files = sorted((sdir / "trials").glob("*.json"), key=lambda p: p.stat().st_mtime) \
            if (sdir / "trials").exists() else []
        if len(files) < 2:
            return False
        rows = [json.loads(p.read_text()) for p in files]
        node = next(n for n in cluster.worker_nodes if n.node_id == rows[-1]["node"])
        cluster.remove_node(node, allow_graceful=False)
        removed.append(({r["calc_id"]: r["started_at"] for r in rows}, node.node_id))
        return True

    return step


@pytest.mark.ray
@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_node_lost_mid_study_runs_no_finished_calculation_again_and_the_results_are_the_same(tmp_path):
    """Six FEL calculations on two worker nodes of 1 CPU (trials run there only: the head has none). One run
    undisturbed; another loses a node once two calculations are finished. The calculations cut off are run
    again (by Tune's retry, or else by a rerun of the pending ones, as `run_study` does), the finished ones are
    not (their trial files are untouched), and every calculation's numbers equal the undisturbed run's."""
    import ray
    from ray.cluster_utils import Cluster

    from tiny_model import tiny_pretrained

    from alignlab.platform.config import to_dict
    from alignlab.platform.fel.finetune_config import FinetuneConfig
    from alignlab.platform.fel.trial_files import finished_calculations
    from alignlab.platform.report.report import collect_results
    from alignlab.platform.storage.root import as_storage, read_json, Storage
    from alignlab.platform.study.grid import run_trials
    from alignlab.platform.study.spec import calc_id
    from alignlab.platform.tasks.task_data import build_tasks

    root = tmp_path / "root"
    mdir = tiny_pretrained(root)
    tdir = build_tasks(root, langs=("en",), max_docs_per_lang=300, target_snippets=60)
    st = as_storage(root)
    fts = [FinetuneConfig(task="ct", budget=10, max_epochs=3, patience=1, batch_size=8, lr=1e-3, selection="honest",
                          seed=s) for s in range(6)]

    def calcs(name: str) -> list[dict]:
        return [{"calc_id": calc_id(mdir.name, ft), "model_key": "m", "model_id": mdir.name, "model_dir": str(mdir),
                 "task_dir": str(tdir), "row": "seed", "col": str(ft.seed), "group": "seed", "finetune": to_dict(ft),
                 "study_dir": str(root / Storage.study(name)), "storage": st.uri, "task_id": tdir.name, "study_name": name,
                 "eval_sets": {}} for ft in fts]

    def study_json(name: str) -> None:
        from alignlab.platform.storage.root import write_json

        cs = calcs(name)
        write_json(root / Storage.study(name) / "study.json", {
            "name": name, "title": name, "baseline_col": "0", "baseline_cells": [], "plots": [], "notes": "",
            "models": {}, "calculations": [c["calc_id"] for c in cs],
            "cells": {c["calc_id"]: {"row": c["row"], "col": c["col"], "group": c["group"]} for c in cs},
            "searches": []})

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    stop = threading.Event()
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address, log_to_driver=False)
        run_trials(calcs("whole"), root / Storage.study("whole"), progress=False, storage=st)
        sdir, removed = root / Storage.study("lost"), []
        remover = _in_background(_remove_a_node_that_ran_a_calculation(sdir, cluster, removed), stop)
        try:
            run_trials(calcs("lost"), sdir, progress=False, storage=st)
        except RuntimeError:  # Tune gave the cut-off trial up: the rerun below runs it, as a study's rerun would
            pass
        remover.join(timeout=60)
        assert removed, "no node was removed: the calculations finished before two of them were"
        finished_then, _ = removed[0]
        pending = [c for c in calcs("lost") if c["calc_id"] not in finished_calculations(st, "studies/lost")]
        if pending:
            run_trials(pending, sdir, progress=False, storage=st)
        for cid, started in finished_then.items():  # never run again
            assert read_json(sdir / "trials" / f"{cid}.json")["started_at"] == started, cid
        study_json("whole")
        study_json("lost")
        metrics = ["calc_id", "accuracy", "perplexity", "best_accuracy", "epochs"]
        a = collect_results(root / Storage.study("whole"))[metrics].sort_values("calc_id").reset_index(drop=True)
        b = collect_results(sdir)[metrics].sort_values("calc_id").reset_index(drop=True)
        assert len(a) == len(b) == 6
        assert a.equals(b), (a, b)
    finally:
        stop.set()
        ray.shutdown()
        cluster.shutdown()
