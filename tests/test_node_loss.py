"""Issue #46: a worker node lost in the middle of pretraining, on a real multi-node Ray cluster on this machine
(`ray.cluster_utils.Cluster`: every node is its own raylet; `remove_node` kills one with everything on it, as a
spot or preemptible GPU node disappears). Slow and starts its own cluster: `pytest -m "cluster and slow"
tests/test_node_loss.py` (the default run leaves it out)."""
from __future__ import annotations

import dataclasses
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


def _remove_the_node_named_in(marker: Path, cluster, removed: list, stop: threading.Event) -> None:
    while not stop.is_set():
        if marker.exists() and marker.read_text():
            node_id = marker.read_text()
            (node,) = [n for n in cluster.worker_nodes if n.node_id == node_id]
            cluster.remove_node(node, allow_graceful=False)
            removed.append(node_id)
            return
        time.sleep(0.5)


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

    from alignlab.platform.config import CORPUS_PRESETS, PRETRAIN_PRESETS
    from alignlab.platform.corpus import build_corpus
    from alignlab.platform.pretrain_ray import is_finished, pretrain
    from alignlab.platform.ray_env import quiet_ray_data

    cfg = dataclasses.replace(PRETRAIN_PRESETS["smoke"], max_steps=8, checkpoint_every=2, log_every=1,
                              precision="fp32", cpus_per_worker=1.0)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    stop = threading.Event()
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=2)
        ray.init(address=cluster.address, log_to_driver=False)
        quiet_ray_data()
        cdir = build_corpus(CORPUS_PRESETS["smoke"], tmp_path / "corpus-root", progress=False)
        whole = pretrain(cdir, cfg, tmp_path / "uninterrupted")
        marker, removed = tmp_path / "node-of-rank0", []
        remover = threading.Thread(target=_remove_the_node_named_in, args=(marker, cluster, removed, stop), daemon=True)
        remover.start()
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
