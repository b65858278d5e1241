"""Where a search's Optuna study lives: a journal file beside the search's outputs (mirrored to a remote root), or an
RDB URL a user gives; and loading a finished search's study again from what its summary recorded (the report's
parameter importance). Opening, resuming and leasing the study is `study.optuna_study`'s."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import optuna

from alignlab.platform.storage.root import Storage, redact

OPTUNA_STORAGE_ENV = "ALIGNLAB_OPTUNA_STORAGE"
JOURNAL_SUFFIX = ".optuna.journal"


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
