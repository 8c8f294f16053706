"""Jobs in PostgreSQL, beside the shared voice library (`--voices-db`), for replicas.

Any replica works on any job: items are claimed with `SELECT ... FOR UPDATE SKIP LOCKED` (two
replicas claiming at once take different items, neither waits), each under a lease on the
database's clock. An item's audio lives in its row (`bytea`), written in the transaction that
marks it done, so no replica keeps anything on its disk and any of them serves any result: the
replicas stay as stateless as the voice library lets them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

from server.jobs.sql_store import Dialect, SqlJobStore
from server.jobs.store import ItemAudio

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS chorus_jobs (
        id TEXT PRIMARY KEY, owner TEXT NOT NULL, by_key INTEGER NOT NULL, status TEXT NOT NULL,
        chained INTEGER NOT NULL, voice BYTEA, items_total INTEGER NOT NULL, items_done INTEGER NOT NULL DEFAULT 0,
        audio_seconds DOUBLE PRECISION NOT NULL DEFAULT 0, planned_seconds DOUBLE PRECISION NOT NULL,
        planned_done DOUBLE PRECISION NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0,
        created_at DOUBLE PRECISION NOT NULL, started_at DOUBLE PRECISION, finished_at DOUBLE PRECISION,
        error_item INTEGER, error_code TEXT, error_message TEXT)""",
    """CREATE TABLE IF NOT EXISTS chorus_job_items (
        job TEXT NOT NULL, n INTEGER NOT NULL, work TEXT NOT NULL, state TEXT NOT NULL, worker TEXT,
        lease_until DOUBLE PRECISION, attempts INTEGER NOT NULL DEFAULT 0, lapses INTEGER NOT NULL DEFAULT 0,
        audio_seconds DOUBLE PRECISION, format TEXT, finished_at DOUBLE PRECISION, audio BYTEA,
        PRIMARY KEY (job, n))""",
    "CREATE INDEX IF NOT EXISTS chorus_job_items_state ON chorus_job_items (state)",
    "CREATE INDEX IF NOT EXISTS chorus_jobs_status ON chorus_jobs (status, finished_at)",
)
_SCHEMA_LOCK = 0x63686F7275730002  # pg_advisory_xact_lock key: replicas creating the tables at once


class PostgresJobStore(SqlJobStore):
    """The shared `JobStore` (psycopg is imported only when one is opened)."""

    dialect: ClassVar[Dialect] = Dialect(jobs="chorus_jobs", items="chorus_job_items",
                                         now="extract(epoch from clock_timestamp())::double precision",
                                         skip_locked=" FOR UPDATE OF i SKIP LOCKED", for_update=" FOR UPDATE")

    def __init__(self, dsn: str):
        import psycopg  # lazy: optional (the `postgres` extra)

        self._conn = psycopg.connect(dsn, autocommit=True)
        self._lock = threading.Lock()
        with self._lock, self._conn.transaction():
            self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            for statement in _SCHEMA:
                self._conn.execute(statement)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _execute(self, statement: str, params: tuple = ()):
        return self._conn.execute(statement.replace("?", "%s"), params or None)

    def _execute_many(self, statement: str, rows: list[tuple]) -> None:
        with self._conn.cursor() as cursor:
            cursor.executemany(statement.replace("?", "%s"), rows)

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        with self._lock, self._conn.transaction():
            yield

    def _put_audio(self, job_id: str, n: int, audio: ItemAudio) -> None:
        self._execute("UPDATE chorus_job_items SET audio = ? WHERE job = ? AND n = ?", (audio.data, job_id, n))

    def _get_audio(self, job_id: str, n: int, fmt: str) -> bytes | None:
        row = self._execute("SELECT audio FROM chorus_job_items WHERE job = ? AND n = ?", (job_id, n)).fetchone()
        return bytes(row[0]) if row and row[0] is not None else None
