"""An interrupted Optuna search resumes through its persistent Optuna study (issue #18): a rerun counts what the
study holds, fails and retries the trials a dead driver left RUNNING, never takes a live driver's trial, and
asks for exactly the trials still missing. (Before #18 it resumed from Tune's snapshot; issue #17 listed how
that broke.) These drive the study and the Tune searcher by hand; test_optuna_storage.py and test_e2e.py kill
real drivers."""
from __future__ import annotations

import subprocess
import sys
import time

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from alignlab.platform.storage.optuna_place import study_place
from alignlab.platform.study import optuna_study as os_
from alignlab.platform.study.optuna_study import (DRIVER, INTERRUPTED, RETRY_OF, DriverSession, open_study,
                                                  recover_interrupted, trial_counts)

SPACE = {"lr": FloatDistribution(0.0, 1.0)}


def _study(tmp_path, directions=("maximize",), seed=0):
    place = study_place("s", tmp_path / "s.optuna.journal")
    return open_study(place, list(directions), seed), place


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _driver(study, driver: str, *, host: str, pid: int, alive: float) -> optuna.Trial:
    """A trial left RUNNING by driver `driver`, whose lease says it was last alive at `alive`."""
    study.set_user_attr(f"alignlab.lease.{driver}", {"host": host, "pid": pid, "alive": alive, "ended": False})
    t = study.ask(SPACE)
    t.set_user_attr(DRIVER, driver)
    return t


def _searcher(study, session, num_samples=3, max_concurrent=1, complete_key=None):
    from alignlab.platform.study.search_tune import OptunaStudySearch

    return OptunaStudySearch(study, session, SPACE, metrics=["acc"], num_samples=num_samples,
                             max_concurrent=max_concurrent, keep=("acc", "epoch", "failed"), complete_key=complete_key)


def test_a_trial_left_running_by_a_dead_driver_is_failed_as_interrupted_and_its_point_is_tried_next(tmp_path):
    import socket

    study, place = _study(tmp_path)
    done = study.ask(SPACE)
    study.tell(done, 0.5)
    left = _driver(study, "dead", host=socket.gethostname(), pid=_dead_pid(), alive=time.time())
    assert trial_counts(study) == (1, 1)
    said = []
    assert recover_interrupted(study, place, say=lambda m, **k: said.append(m)) == 1
    assert "will run again" in said[0]
    frozen = study.trials[left.number]
    assert frozen.state == TrialState.FAIL and frozen.user_attrs[INTERRUPTED]
    assert trial_counts(study) == (1, 0), "an interrupted trial is not a result: it does not count"
    again = study.ask(SPACE)
    assert again.params == left.params and study.trials[again.number].user_attrs[RETRY_OF] == left.number
    assert study.trials[done.number].state == TrialState.COMPLETE, "a finished trial is never touched"


def test_a_trial_of_a_live_driver_elsewhere_is_left_running_until_its_lease_runs_out(tmp_path, monkeypatch):
    study, place = _study(tmp_path)
    live = _driver(study, "other", host="another-host", pid=1, alive=time.time())
    assert recover_interrupted(study, place) == 0
    assert study.trials[live.number].state == TrialState.RUNNING
    monkeypatch.setattr(os_, "LEASE_GRACE_S", 0.0)  # the other driver stopped renewing its lease
    assert recover_interrupted(study, place, say=lambda *a, **k: None) == 1
    assert study.trials[live.number].user_attrs[INTERRUPTED]


def test_a_running_driver_renews_its_lease_and_a_closed_one_gives_back_its_running_trials_at_once(tmp_path,
                                                                                                    monkeypatch):
    monkeypatch.setattr(os_, "LEASE_INTERVAL_S", 0.05)
    study, place = _study(tmp_path)
    session = DriverSession(study, place)
    first = study.user_attrs[f"alignlab.lease.{session.id}"]["alive"]
    t = study.ask(SPACE)
    session.claim(t, "tune-1")
    time.sleep(0.3)
    assert study.user_attrs[f"alignlab.lease.{session.id}"]["alive"] > first
    assert recover_interrupted(study, place) == 0, "this driver is alive: its trial is its own"
    session.close(say=lambda *a, **k: None)  # e.g. Ctrl-C: the next run need not wait for the lease to expire
    assert study.trials[t.number].user_attrs[INTERRUPTED]
    assert study.user_attrs[f"alignlab.lease.{session.id}"]["ended"]


def test_failed_and_pruned_trials_count_toward_the_search_and_interrupted_ones_do_not(tmp_path):
    study, place = _study(tmp_path)
    for state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL):
        t = study.ask(SPACE)
        study.tell(t, 0.5 if state == TrialState.COMPLETE else None, state=state)
    _driver(study, "gone", host="another-host", pid=1, alive=0.0)
    recover_interrupted(study, place, say=lambda *a, **k: None)
    assert trial_counts(study) == (3, 0)
    assert [t.number for t in os_.finished_trials(study)] == [0, 1, 2]


def test_the_searcher_asks_only_for_the_missing_trials_counting_those_running_elsewhere(tmp_path):
    from ray.tune.search import Searcher

    study, place = _study(tmp_path)
    t = study.ask(SPACE)
    study.tell(t, 0.5)  # one done in an earlier session
    _driver(study, "other", host="another-host", pid=1, alive=time.time())  # one running in another driver
    session = DriverSession(study, place)
    try:
        s = _searcher(study, session, num_samples=4, max_concurrent=1)
        assert isinstance(s.suggest("a"), dict)
        assert s.suggest("b") is None, "one trial at a time"
        s.on_trial_complete("a", {"acc": 0.7, "training_iteration": 1})
        assert isinstance(s.suggest("c"), dict)
        s.on_trial_complete("c", {"acc": 0.6, "training_iteration": 1})
        assert s.suggest("d") == Searcher.FINISHED, "2 done here + 1 before + 1 running elsewhere = 4"
        assert trial_counts(study) == (3, 1)
    finally:
        session.close(say=lambda *a, **k: None)


def test_the_searcher_tells_pruned_failed_and_errored_trials_apart(tmp_path):
    study, place = _study(tmp_path)
    session = DriverSession(study, place)
    try:
        s = _searcher(study, session, num_samples=10, max_concurrent=5, complete_key="done")
        for tid in "abcde":
            assert isinstance(s.suggest(tid), dict)
        s.on_trial_result("a", {"acc": 0.4, "training_iteration": 1})
        s.on_trial_complete("a", {"acc": 0.45, "training_iteration": 2, "epoch": 2})  # stopped early: no "done"
        s.on_trial_complete("b", {"acc": 0.8, "training_iteration": 3, "done": 1})
        s.on_trial_complete("c", {"acc": float("nan"), "failed": "diverged", "training_iteration": 1})
        s.on_trial_complete("d", error=True)
        s.tell_error("d", "RuntimeError: boom")
        s.on_trial_complete("e", None)  # stopped before its first result: interrupted, tried again
    finally:
        session.close(say=lambda *a, **k: None)
    a, b, c, d, e = study.trials[:5]
    assert a.state == TrialState.PRUNED and a.intermediate_values == {1: 0.4, 2: 0.45}
    assert b.state == TrialState.COMPLETE and b.value == 0.8
    assert c.state == TrialState.FAIL and c.user_attrs["failed"] == "diverged" and "acc" not in c.user_attrs
    assert d.state == TrialState.FAIL and d.user_attrs["error"] == "RuntimeError: boom"
    assert e.state == TrialState.FAIL and e.user_attrs[INTERRUPTED]
    assert trial_counts(study) == (4, 0)
    assert study.ask(SPACE).params == e.params, "the interrupted point is the next one asked for"


def test_a_resumed_study_does_not_replay_the_random_points_of_its_first_session(tmp_path):
    first, _ = _study(tmp_path, seed=7)
    points = []
    for _ in range(2):
        t = first.ask(SPACE)
        points.append(t.params["lr"])
        first.tell(t, t.params["lr"])
    again, _ = _study(tmp_path, seed=7)  # a new driver session: a new sampler over the same study
    assert again.ask(SPACE).params["lr"] not in points
    fresh, _ = _study(tmp_path / "other", seed=7)
    assert fresh.ask(SPACE).params["lr"] == points[0], "a fresh search with the same seed is reproducible"


def test_a_study_made_by_another_kind_of_search_is_refused(tmp_path):
    _study(tmp_path, directions=("maximize", "maximize"))
    with pytest.raises(ValueError, match="directions"):
        _study(tmp_path, directions=("maximize",))


def test_a_resumed_searchs_eta_counts_only_the_trials_this_session_ran(capsys):
    """8 of 10 trials came from a dead driver's session; this session finished 1 in 10 s: ~10 s per trial, so the
    last one is ~10 s away, not 10 s / 9 (the old ETA took the resumed trials as this session's)."""
    from alignlab.platform.study.grid import Progress

    prog = Progress(10, True, what="search s", already=8)
    prog.t0 -= 10.0  # this session started 10 s ago
    prog.tick()
    line = capsys.readouterr().out.strip()
    assert line.startswith("[search s] 9/10 done, 10s elapsed, ETA 10s"), line
    fresh = Progress(10, True, already=10)
    fresh.tick(done=10)  # nothing run in this session: no rate to say
    assert capsys.readouterr().out.strip().endswith("ETA ?")
