"""Refusing a resource request the cluster can never satisfy, before any work starts (issue #17).

Ray does not fail a request that no node can hold: a Train worker group or a Tune trial that asks for a GPU
on a CPU-only cluster, or for more CPUs than any node has, waits forever ("No available node types can
fulfill resource request", docs/cluster.md#a-gpu-worker-needs-its-cpus-named). `check_request` compares a request with
what the cluster has --
its live nodes and, where an autoscaler is configured, the node types it may add (up to their
`max_workers`) -- and raises `ResourceRequestError` (a ValueError: one line from the error boundary,
exit 2) naming what was asked and what exists. A GPU request on a cluster that is only this machine also
needs a torch that can use CUDA (`torch.cuda.is_available()`).
"""
from __future__ import annotations

import math

from alignlab.platform.runtime.ray_env import started_locally

RAY_DATA_CPUS = 1.0
"""CPUs a pretraining run must leave free: Ray Data's file listing task needs one whole CPU, and without it
the training input pipeline waits at 0 rows (docs/cluster.md#ray-data-needs-a-whole-cpu)."""


class ResourceRequestError(ValueError):
    """A request no node of the cluster (now or after autoscaling) can ever satisfy."""


def normalize(bundle: dict) -> dict[str, float]:
    """Ray's resource names ("CPU", "GPU", custom names as given) from Tune's lower-case "cpu"/"gpu"; zeros dropped."""
    out: dict[str, float] = {}
    for k, v in bundle.items():
        name = {"cpu": "CPU", "gpu": "GPU"}.get(k, k)
        if v:
            out[name] = out.get(name, 0.0) + float(v)
    return out


def _fits(bundle: dict[str, float], have: dict) -> float:
    """How many copies of `bundle` fit in `have` (inf for an empty bundle)."""
    n = math.inf
    for k, need in bundle.items():
        n = min(n, math.floor(have.get(k, 0.0) / need + 1e-9))
    return n


def _fmt(res: dict) -> str:
    keep = {k: v for k, v in res.items() if not k.startswith(("node:", "memory", "object_store_memory", "accelerator_type:"))}
    if not keep:
        return "{}"
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(keep.items())) + "}"


def autoscaler_configured(wait_s: float = 10.0) -> bool | None:
    """Is an autoscaler (`ray start --head --autoscaling-config`, `ray up`) configured? None when unknown.

    A local instance started by `ensure_ray` has none. Otherwise Ray's monitor publishes a status in the
    GCS; without an autoscaling config it runs a read-only provider whose node types are named
    `node_<node id>` (one per live node), with one the node types come from the config."""
    import json
    import time

    if started_locally():
        return False
    from ray._private import ray_constants
    from ray.experimental.internal_kv import _internal_kv_get

    deadline = time.monotonic() + wait_s
    while True:
        try:
            raw = _internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS)
        except Exception:  # noqa: BLE001 -- no GCS access: unknown
            return None
        if raw:
            break
        if time.monotonic() > deadline:
            return None
        time.sleep(0.5)
    try:
        report = json.loads(raw).get("autoscaler_report") or {}
    except ValueError:
        return None
    types = set(report.get("active_nodes") or {}) | set((report.get("node_type_mapping") or {}).values())
    types |= set(report.get("pending_launches") or {})
    if not types:
        return None
    return not all(t.startswith("node_") for t in types)


def cluster_view() -> tuple[list[dict], list[tuple[dict, float]]]:
    """(the resources of every live node, [(resources, how many more may be added)] per autoscaler node type).

    The second list is empty without an autoscaler. A node type's headroom is its max_count (-1: unlimited)
    minus the nodes of that type already up -- approximated by max_count, which only makes the check
    more lenient, never stricter."""
    import ray
    import ray._private.state

    nodes = [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]
    groups: list[tuple[dict, float]] = []
    try:
        config = ray._private.state.state.get_cluster_config()
    except Exception:  # noqa: BLE001 -- an older GCS without the key: treat as no autoscaler
        config = None
    for g in (config.node_group_configs if config else ()):
        if g.max_count == 0 or not g.resources:
            continue
        groups.append((dict(g.resources), math.inf if g.max_count < 0 else float(g.max_count)))
    return nodes, groups


def _only_this_machine() -> bool:
    import ray

    me = ray.get_runtime_context().get_node_id()
    alive = [n for n in ray.nodes() if n.get("Alive")]
    return len(alive) == 1 and alive[0]["NodeID"] == me


def check_request(what: str, bundle: dict, count: int = 1, *, spare_cpus: float = 0.0, hint: str = "") -> None:
    """Raise ResourceRequestError unless `count` copies of `bundle` (each on one node) fit the cluster, with
    `spare_cpus` CPUs left over; Ray must be initialised. `what` names the request ("pretraining",
    "an FEL trial"), `hint` says how to ask for less."""
    b = normalize(bundle)
    nodes, groups = cluster_view()
    if not groups and autoscaler_configured() is not False:
        # An autoscaler whose node types Ray does not publish (the v1 autoscaler, the default in 2.60), or no
        # way to tell: it may add nodes that hold the request, so nothing is refused.
        return
    capacity = sum(_fits(b, n) for n in nodes) + sum(_fits(b, r) * k if _fits(b, r) else 0 for r, k in groups)
    max_cpus = sum(n.get("CPU", 0.0) for n in nodes) + sum(r.get("CPU", 0.0) * k for r, k in groups)
    total = {}
    for n in nodes:
        for k, v in n.items():
            total[k] = total.get(k, 0.0) + v
    asked = f"{count} x {_fmt(b)}" if count != 1 else _fmt(b)
    where = f"the cluster has {_fmt(total)} on {len(nodes)} node{'s' if len(nodes) != 1 else ''}"
    where += (f" and an autoscaler that may add {', '.join(f'{_fmt(r)} x {k:g}' for r, k in groups)}" if groups
              else " and no autoscaler to add more")
    tail = f"; {hint}" if hint else ""
    if capacity < count:
        one = "no node can hold even one" if capacity == 0 else f"only {capacity:g} fit"
        raise ResourceRequestError(f"{what} asks for {asked}, but {where} ({one}), so it would wait forever{tail}")
    need_cpus = count * b.get("CPU", 0.0) + spare_cpus
    if spare_cpus and need_cpus > max_cpus + 1e-9:
        raise ResourceRequestError(
            f"{what} asks for {asked} plus {spare_cpus:g} CPU left free for Ray Data's reads ({need_cpus:g} CPUs), "
            f"but {where}, so its input pipeline would wait forever{tail}")
    if b.get("GPU") and _only_this_machine():
        import torch

        if not torch.cuda.is_available():
            raise ResourceRequestError(
                f"{what} asks for {asked}, but torch {torch.__version__} on this machine cannot use CUDA "
                f"(no CUDA build or no driver){tail}")


def _sees(path: str, token: str) -> bool:
    """On one node: does `path` hold `token`?"""
    from pathlib import Path

    try:
        return Path(path).read_text() == token
    except OSError:
        return False


def check_root_on_every_node(root, *, timeout_s: float = 120.0) -> None:
    """Refuse, before anything is trained, a storage root that is a folder of this machine when the cluster has
    other nodes that do not see it. Train workers on another node would write their checkpoints and the finished
    model to that node's own disk, where neither the driver nor a restarted worker finds them (a resume then starts
    from scratch; `final/` never appears). A bucket URI is shared by definition; a local path passes when every
    alive node finds, at the same path, a file this process has just written there (a shared mount: NFS, EFS,
    a FUSE-mounted bucket; or nodes that are all this machine). Nodes an autoscaler adds later are not asked.
    `root` is a `storage.Storage`; Ray must be initialised."""
    import secrets

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if root.remote:
        return
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) < 2:
        return
    token = secrets.token_hex(16)
    probe = root.local / f".alignlab-node-check-{token}"
    probe.parent.mkdir(parents=True, exist_ok=True)
    probe.write_text(token)
    sees = ray.remote(num_cpus=0, max_retries=0)(_sees)
    try:
        answers = ray.get([sees.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                           .remote(str(probe), token) for n in nodes], timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        print(f"[storage] warning: could not ask every node of the cluster within {timeout_s:.0f} s whether it sees "
              f"{root.local}; going on", flush=True)
        return
    finally:
        probe.unlink(missing_ok=True)
    blind = [n for n, ok in zip(nodes, answers) if not ok]
    if blind:
        where = ", ".join(sorted({n.get("NodeManagerAddress", "?") for n in blind}))
        raise ValueError(f"storage root {root.local} is a folder that {len(blind)} of the cluster's {len(nodes)} nodes "
                         f"do not see ({where}): their workers would keep checkpoints and models on their own disks; "
                         "use a root every node shares: --storage s3://BUCKET/PREFIX or gs://..., or a folder mounted "
                         "at the same path on every node")
