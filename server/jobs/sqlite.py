"""The embedded job store: an SQLite index and one audio file per item done, under `--jobs-dir`
(by default `jobs/` beside the voices folder), for one server.

An item's file is put in place inside the transaction that marks it done (written beside it
first, then renamed), so a file whose item is not done is at most a leftover of a crash, which
the item's next run replaces. One process owns the folder: claims still open when it starts are
those of a process that died, and go back to the queue at once (each counted as a lapse).
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

from server.jobs.sql_store import Dialect, SqlJobStore
from server.jobs.store import ItemAudio, well_formed

log = logging.getLogger("chorus.jobs")

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS jobs (
        id TEXT PRIMARY KEY, owner TEXT NOT NULL, by_key INTEGER NOT NULL, status TEXT NOT NULL,
        chained INTEGER NOT NULL, voice BLOB, items_total INTEGER NOT NULL, items_done INTEGER NOT NULL DEFAULT 0,
        audio_seconds REAL NOT NULL DEFAULT 0, planned_seconds REAL NOT NULL, planned_done REAL NOT NULL DEFAULT 0,
        attempts INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL, started_at REAL, finished_at REAL,
        error_item INTEGER, error_code TEXT, error_message TEXT)""",
    """CREATE TABLE IF NOT EXISTS job_items (
        job TEXT NOT NULL, n INTEGER NOT NULL, work TEXT NOT NULL, state TEXT NOT NULL, worker TEXT,
        lease_until REAL, attempts INTEGER NOT NULL DEFAULT 0, lapses INTEGER NOT NULL DEFAULT 0,
        audio_seconds REAL, format TEXT, finished_at REAL, PRIMARY KEY (job, n))""",
    "CREATE INDEX IF NOT EXISTS job_items_state ON job_items (state)",
    "CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status, finished_at)",
)


class JobFolder(SqlJobStore):
    """The embedded `JobStore` (one process owns the folder)."""

    dialect: ClassVar[Dialect] = Dialect(jobs="jobs", items="job_items",
                                         now="((julianday('now') - 2440587.5) * 86400.0)", skip_locked="",
                                         for_update="")

    def __init__(self, root: Path):
        self.root = Path(root)
        self._audio = self.root / "audio"
        self._audio.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.root / "jobs.sqlite3", check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        for statement in _SCHEMA:
            self._db.execute(statement)
        released = self._db.execute("UPDATE job_items SET state = 'queued', worker = NULL, lease_until = NULL, "
                                    "lapses = lapses + 1 WHERE state = 'running'").rowcount
        if released:
            log.warning("items left running by a server that stopped went back to the queue",
                        extra={"items": released})

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _execute(self, statement: str, params: tuple = ()) -> sqlite3.Cursor:
        return self._db.execute(statement, params)

    def _execute_many(self, statement: str, rows: list[tuple]) -> None:
        self._db.executemany(statement, rows)

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _path(self, job_id: str, n: int, fmt: str) -> Path:
        assert well_formed(job_id) and fmt.isalnum(), (job_id, fmt)  # no id or format names a path elsewhere
        return self._audio / job_id / f"{int(n)}.{fmt}"

    def _put_audio(self, job_id: str, n: int, audio: ItemAudio) -> None:
        path = self._path(job_id, n, audio.format)
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_bytes(audio.data)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def _get_audio(self, job_id: str, n: int, fmt: str) -> bytes | None:
        try:
            return self._path(job_id, n, fmt).read_bytes()
        except FileNotFoundError:
            return None

    def _drop_audio(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            if well_formed(job_id):
                shutil.rmtree(self._audio / job_id, ignore_errors=True)
