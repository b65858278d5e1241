"""Shared fixtures: one real local Ray instance per test session, and small real artifacts built once."""
from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def ray_session():
    """A real local Ray: 2 CPUs, no dashboard, started once per session (docs/cluster.md#a-local-ray-for-tests)."""
    import ray

    from alignlab.platform.runtime.ray_env import quiet_ray_data

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=1024**3)
    quiet_ray_data()
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def storage_root(tmp_path_factory):
    return tmp_path_factory.mktemp("storage")


@pytest.fixture(scope="session")
def smoke_corpus(ray_session, storage_root):
    """The smoke-preset bundled corpus, built once on the real Ray instance."""
    from alignlab.platform.corpus.corpus import build_corpus
    from alignlab.platform.presets import Preset

    return build_corpus(Preset.named("smoke").corpus, storage_root, progress=False)


@pytest.fixture(scope="session")
def smoke_model_cfg():
    """The config of the session's `smoke_model`: the smoke preset's pretraining of the four objectives, logging every
    step. A test that resumes to that model or reads it takes its config from here."""
    import dataclasses

    from alignlab.platform.presets import Preset

    return dataclasses.replace(Preset.named("smoke").pretrain, objectives="mlm,nsp,whp,pad", log_every=1)


@pytest.fixture(scope="session")
def smoke_model_probe(tmp_path_factory):
    """Where the session's `smoke_model` recorded every step (`fault_hooks.Probe`: the rows, a digest of the weights,
    and the device the worker trained on and the one Ray Train gave it)."""
    return tmp_path_factory.mktemp("smoke-model-probe")


@pytest.fixture(scope="session")
def smoke_model(smoke_corpus, smoke_model_cfg, smoke_model_probe, tmp_path_factory):
    """The smoke preset's model of the four objectives, logging every step: pretrained once per session under Ray
    Train, at a root of its own. It is the smoke objective ablation's first model (test_study_plan.py), and the
    uninterrupted run that test_pretrain.py's rerun and test_checkpoints.py's minutes' checkpoints resume to (log_every
    and the checkpoint intervals are not part of the id)."""
    from fault_hooks import Probe, registered

    from alignlab.platform.pretrain.driver import pretrain

    return pretrain(smoke_corpus, smoke_model_cfg, tmp_path_factory.mktemp("smoke-model-root"),
                    after_step=registered(Probe(str(smoke_model_probe))))


def pytest_configure(config):
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    # Ray Train's controller polls its workers every 2 s by default, so every run ended about 5 s after its last
    # step (the poll that sees the workers done, then the group's shutdown), a third of a smoke pretraining.
    # Polling every half second changes no result, only how soon a finished run is noticed; set before Ray starts,
    # it reaches every Ray process of the session and every driver a test starts (they inherit this environment).
    # A user's runs keep Ray's default: their steps take minutes, not seconds.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    # Two helper processes a test's Train run or dataset read starts and a 2-CPU session pays for in seconds each:
    # Ray Train's preemption watcher (an actor per run that only logs a spot node's notice of termination, which
    # a local test never receives), and the pool of parquet footer readers Ray Data starts for every read (32 actors,
    # each a Python process, sized for many remote files; a test's read lists a handful of local ones). Neither
    # changes which rows are read, in what order, or what a worker computes; a user's runs keep Ray's defaults.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    os.environ.setdefault("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", "1")


SLOW_TEST_TIMEOUT_S = 1800


def pytest_collection_modifyitems(config, items):
    """Cluster tests first, whatever order the files were named in: each starts its own Ray head, and one
    started while this session's `ray_session` instance is up never gets a job agent (seen here).

    A test that uses the session Ray without the `ray` marker is a collection error: `-m "not ray"` would run it
    and start Ray. A `slow` test without a timeout of its own gets SLOW_TEST_TIMEOUT_S instead of the default."""
    unmarked = [item.nodeid for item in items
                if "ray_session" in getattr(item, "fixturenames", ()) and item.get_closest_marker("ray") is None]
    if unmarked:
        raise pytest.UsageError("these tests use the session Ray (fixture ray_session, perhaps through another "
                                "fixture) without @pytest.mark.ray: " + ", ".join(unmarked))
    for item in items:
        if item.get_closest_marker("slow") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLOW_TEST_TIMEOUT_S))
    items.sort(key=lambda item: item.get_closest_marker("cluster") is None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A timeout says what it is and what to do, under the stacks pytest-timeout printed."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and "from pytest-timeout" in str(report.longrepr):
        marker = item.get_closest_marker("timeout")
        limit = marker.args[0] if marker and marker.args else item.config.getini("timeout")
        report.sections.append(("alignlab: test timed out", (
            f"{item.nodeid} ran past its {limit} s limit and was stopped: most likely a hang (a Ray task or "
            "actor waiting for a resource, a lock, a process that never exits). Its own stack is the traceback above; "
            "those of its other threads were printed when it stopped, between '+++ Timeout +++' lines. If the test "
            "really needs longer, give it "
            "@pytest.mark.timeout(SECONDS); the default is `timeout` in pyproject.toml.")))


@pytest.fixture
def interactive_sigint():
    """Ctrl-C as at an interactive prompt, for the tests that send one: a shell that starts the tests in the
    background (`cmd &`, nohup) starts them with SIGINT ignored, and Python keeps it ignored."""
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)
