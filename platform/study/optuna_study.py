"""The persistent Optuna study behind each of alignlab's searches (issue #18): opening it where it lives
(`storage.optuna_place`), and picking a search up again after its driver died. Plain Optuna, no Ray: the Tune searcher that asks and tells
it is `study.search_tune.OptunaStudySearch`.

Where: by default a journal file (Optuna's `JournalStorage` on a `JournalFileBackend`) beside the search's
outputs, e.g. `<root>/studies/<study>/searches/<search>.optuna.journal`. A user may give an RDB URL instead
(`--optuna-storage`, or `ALIGNLAB_OPTUNA_STORAGE`: `sqlite:///…`, `postgresql://…`), e.g. one database that
several drivers and `optuna-dashboard` share. The study name is the search's content-addressed name, so a
changed search is a new study (in the same file or database) and an unchanged one is found again.

Remote roots (`s3://…`): an object cannot be appended to, so the journal lives in the local cache copy of the
study folder (the search's driver runs on one node) and is uploaded after every finished trial and at the end,
under the journal's own file lock (never half a line); a rerun first pulls the root's copy when it is longer
than the local one. Drivers on two nodes cannot share such a journal; give them an RDB URL.

Resume: the study is the search's state. A rerun counts the trials already COMPLETE, PRUNED or FAIL and runs
only the rest (`trial_counts`); TPE samples from all of them. A trial left RUNNING by a driver that died is
failed, marked `alignlab.interrupted` (not counted), and its point enqueued again (`recover_interrupted`). A
driver is dead when its lease (a study user attribute it renews every `LEASE_INTERVAL_S` seconds) is older
than `LEASE_GRACE_S`, or at once when it ran on this host and its process is gone; so a trial of another
driver that is still alive is never taken from it.
"""
from __future__ import annotations

import math
import os
import socket
import threading
import time
import uuid

import optuna
from optuna.trial import TrialState

from alignlab.platform.storage.optuna_place import StudyPlace

LEASE_INTERVAL_S = 10.0
"""How often a live driver renews its lease in the study."""
LEASE_GRACE_S = 60.0
"""A lease older than this belongs to a dead driver (generous: it also absorbs clock skew between hosts)."""
DRIVER = "alignlab.driver"
"""Trial user attribute: the driver session that runs the trial."""
INTERRUPTED = "alignlab.interrupted"
"""Trial user attribute of a trial failed because its driver died: not a result, not counted."""
TUNE_TRIAL = "alignlab.tune_trial"
"""Trial user attribute: the Tune trial id that ran it (its folder under the search's `tune/` experiment)."""
RETRY_OF = "alignlab.retry_of"
"""Trial user attribute: the number of the interrupted trial whose point this trial tries again."""
_LEASE = "alignlab.lease."


def open_study(place: StudyPlace, directions: list[str], seed: int) -> optuna.Study:
    """The search's study, created or loaded, with a TPE sampler seeded by `seed` plus the number of trials the
    study already holds: a fresh search is reproducible, and a resumed one does not replay the random start-up
    points of its first session."""
    study = optuna.create_study(storage=place.storage(), study_name=place.name, directions=directions,
                                load_if_exists=True, sampler=optuna.samplers.TPESampler(seed=seed))
    have = [d.name.lower() for d in study.directions]
    if have != directions:
        raise ValueError(f"Optuna study {place.name} at {place.shown} has directions {have}, not {directions}; "
                         "it was made by another search")
    if (n := len(study.get_trials(deepcopy=False))):
        study.sampler = optuna.samplers.TPESampler(seed=seed + n)
    return study


class DriverSession:
    """This driver's claim on the trials it runs: trials carry its id (`DRIVER`), and a daemon thread renews
    its lease in the study every `LEASE_INTERVAL_S` seconds until `close()`."""

    def __init__(self, study: optuna.Study, place: StudyPlace):
        self.study, self.place, self.host, self.pid = study, place, socket.gethostname(), os.getpid()
        self.id = f"{self.host}:{self.pid}:{uuid.uuid4().hex[:8]}"
        self._stop = threading.Event()
        self._renew()
        self._thread = threading.Thread(target=self._loop, name="alignlab-optuna-lease", daemon=True)
        self._thread.start()

    def _renew(self, ended: bool = False) -> None:
        self.study.set_user_attr(_LEASE + self.id, {"host": self.host, "pid": self.pid, "alive": time.time(),
                                                    "ended": ended})

    def _loop(self) -> None:
        while not self._stop.wait(LEASE_INTERVAL_S):
            try:
                self._renew()
            except Exception:  # noqa: BLE001 -- a missed renewal only makes the lease look older
                pass

    def claim(self, trial: optuna.Trial, tune_trial: str) -> None:
        trial.set_user_attr(DRIVER, self.id)
        trial.set_user_attr(TUNE_TRIAL, tune_trial)

    def close(self, say=print) -> None:
        """End the lease, and give back this driver's trials that are still RUNNING (a Ctrl-C, an exception)."""
        self._stop.set()
        self._thread.join()
        self._renew(ended=True)
        recover_interrupted(self.study, self.place, say=say, mine=self.id)


def _dead(driver: str | None, leases: dict) -> bool:
    lease = leases.get(_LEASE + driver) if driver else None
    if not lease or lease.get("ended") or time.time() - lease.get("alive", 0) > LEASE_GRACE_S:
        return True
    if lease.get("host") == socket.gethostname() and lease.get("pid") != os.getpid():
        try:
            os.kill(int(lease["pid"]), 0)
        except ProcessLookupError:
            return True
        except (PermissionError, ValueError):
            pass
    return False


def recover_interrupted(study: optuna.Study, place: StudyPlace, *, say=print, mine: str | None = None) -> int:
    """Give back (`give_back`) every RUNNING trial whose driver is dead -- or, with `mine`, every RUNNING trial
    of that driver; returns how many."""
    leases = study.user_attrs
    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        driver = t.user_attrs.get(DRIVER)
        if ((driver == mine) if mine else _dead(driver, leases)) and give_back(study, place, t.number, t.params):
            n += 1
    if n:
        say(f"[optuna {study.study_name}] {n} trial(s) of a driver that stopped before finishing them will run again",
            flush=True)
    return n


def give_back(study: optuna.Study, place: StudyPlace, number: int, params: dict) -> bool:
    """Fail RUNNING trial `number` as `INTERRUPTED` (not a result, not counted) and enqueue its point again, so
    the same point is tried next; False when it had finished meanwhile (or another driver gave it back)."""
    storage = place.storage()
    try:
        tid = storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name), number)
        storage.set_trial_user_attr(tid, INTERRUPTED, True)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
    study.enqueue_trial(params, user_attrs={RETRY_OF: number})
    return True


def counted(t: optuna.trial.FrozenTrial) -> bool:
    """Does a finished trial count toward the search's number of trials (every end but an interruption)?"""
    return t.state in (TrialState.COMPLETE, TrialState.PRUNED) or \
        (t.state == TrialState.FAIL and not t.user_attrs.get(INTERRUPTED))


def trial_counts(study: optuna.Study) -> tuple[int, int]:
    """(trials that count as done, trials RUNNING now) of the study."""
    trials = study.get_trials(deepcopy=False)
    return sum(counted(t) for t in trials), sum(t.state == TrialState.RUNNING for t in trials)


def finished_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The trials that count, in the order they were asked for."""
    return sorted((t for t in study.get_trials(deepcopy=False) if counted(t)), key=lambda t: t.number)


def attr_value(v):
    """A result value as a trial user attribute: JSON-safe (a non-finite float is left out: None)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v if isinstance(v, (str, int, float, bool)) or v is None else str(v)
