"""The persistent Optuna study behind each of alignlab's searches (issue #18): where it lives, opening it, and
picking a search up again after its driver died. Plain Optuna, no Ray: the Tune searcher that asks and tells
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
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.trial import TrialState

from alignlab.platform.storage import Storage, redact

OPTUNA_STORAGE_ENV = "ALIGNLAB_OPTUNA_STORAGE"
JOURNAL_SUFFIX = ".optuna.journal"
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


@dataclass
class StudyPlace:
    """Where one search's Optuna study lives: an RDB URL, or else a journal file (optionally mirrored to a
    remote root at `journal_rel`)."""

    name: str
    journal: Path
    url: str | None = None
    root: Storage | None = None
    journal_rel: str | None = None
    source: str = "--optuna-storage"
    """Where the URL came from (the flag or the environment variable), named when it cannot be opened."""
    _lock: object = field(default=None, repr=False)
    _storage: object = field(default=None, repr=False)

    @property
    def shown(self) -> str:
        """The storage as printed and written into summaries: the journal's path or the URL without credentials."""
        return redact(self.url) if self.url else str(self.journal)

    def storage(self):
        if self._storage is None:
            if self.url:
                try:
                    self._storage = optuna.storages.RDBStorage(self.url)
                except Exception as e:  # noqa: BLE001 -- a bad URL, a missing driver, a server not there
                    raise ValueError(f"{self.source} {self.shown}: cannot open it ({redact(str(e))[:300]})") from e
            else:
                from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

                self.journal.parent.mkdir(parents=True, exist_ok=True)
                self._lock = JournalFileSymlinkLock(str(self.journal))  # Optuna's default, kept to push under it
                self._storage = optuna.storages.JournalStorage(JournalFileBackend(str(self.journal), self._lock))
        return self._storage

    @property
    def mirrored(self) -> bool:
        return not self.url and self.root is not None and self.root.remote and self.journal_rel is not None

    def pull(self) -> None:
        """Bring the root's copy of the journal here when it is longer than this node's (nothing else to do)."""
        if not self.mirrored:
            return
        here = self.journal.stat().st_size if self.journal.exists() else -1
        if self.root.sizes(str(Path(self.journal_rel).parent)).get(self.journal.name, -1) > here:
            self.root.pull_file(self.journal_rel)

    def push(self) -> None:
        """Upload the journal to the root (remote roots only), holding its file lock so no line is half there."""
        if not self.mirrored or not self.journal.exists():
            return
        self.storage()
        self._lock.acquire()
        try:
            self.root.push_file(self.journal_rel)
        finally:
            self._lock.release()

    def summary(self) -> dict:
        """What a search's summary records so that the report (or a person) can load the study again."""
        return {"study": self.name, "storage": self.shown, "journal": None if self.url else self.journal.name}


def study_place(name: str, journal: Path, *, url: str | None = None, root: Storage | None = None,
                journal_rel: str | None = None) -> StudyPlace:
    """The place of search `name`'s study: `url` (or `$ALIGNLAB_OPTUNA_STORAGE`) when given, else `journal`."""
    what = "--optuna-storage" if url else OPTUNA_STORAGE_ENV
    url = url or os.environ.get(OPTUNA_STORAGE_ENV) or None
    if url is not None and (problem := rdb_url_problem(url)):
        raise ValueError(f"{what} {redact(url)!r}: {problem}")
    return StudyPlace(name=name, journal=Path(journal), url=url, root=root, journal_rel=journal_rel, source=what)


def rdb_url_problem(url: str) -> str | None:
    """Why `url` is not a database URL SQLAlchemy (and so Optuna's RDBStorage) can take, or None."""
    from sqlalchemy.engine import make_url

    try:
        ok = "://" in url and make_url(url).drivername
    except Exception:  # noqa: BLE001 -- any parse failure is the answer
        ok = False
    return None if ok else ("not an RDB URL (e.g. sqlite:///path/optuna.db or postgresql://user@host/db); leave "
                            "it out for the journal file beside the search")


def rdb_url(text: str) -> str:
    """argparse type of `--optuna-storage`: refuses a value that is not a database URL at parse time."""
    import argparse

    if (problem := rdb_url_problem(text)):
        raise argparse.ArgumentTypeError(f"{redact(text)!r}: {problem}")
    return text


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


def load_recorded_study(sdir: Path, recorded: dict) -> optuna.Study:
    """The study a finished search's summary names (`StudyPlace.summary`): its journal beside the summary, or
    the RDB URL from `$ALIGNLAB_OPTUNA_STORAGE` (the summary's own copy has no password) or as recorded."""
    if recorded.get("journal"):
        journal = next((p for p in (sdir / "searches" / recorded["journal"], sdir / recorded["journal"]) if p.exists()),
                       None)
        if journal is None:
            raise FileNotFoundError(f"journal {recorded['journal']} not found under {sdir}")
        place = StudyPlace(name=recorded["study"], journal=journal)
    else:
        place = StudyPlace(name=recorded["study"], journal=sdir, url=os.environ.get(OPTUNA_STORAGE_ENV) or
                           recorded["storage"])
    return optuna.load_study(study_name=recorded["study"], storage=place.storage())
