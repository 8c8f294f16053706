"""The voice library in PostgreSQL, for several stateless replicas sharing one library.

Same contract as the embedded `VoiceStore` (SQLite + token files), but the encoded voice
lives in the row itself (`bytea`), so no replica needs a shared disk. Ids are made and
checked exactly as in the embedded store, and so are the limits: the count and the stored
bytes are checked and the row inserted in one transaction that holds an advisory lock, so
replicas adding at once cannot pass a limit together.
"""

from __future__ import annotations

import secrets
import threading
import time
from contextlib import contextmanager

from server.voices.sql_library import COLUMNS, SqlVoiceLibrary, Statements, new_voice, well_formed
from server.voices.store import KEPT_PREFIX, VoiceInfo

_SCHEMA = """
CREATE TABLE IF NOT EXISTS chorus_voices (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    text TEXT NOT NULL,
    seconds DOUBLE PRECISION NOT NULL,
    created_at BIGINT NOT NULL,
    blob BYTEA NOT NULL
)
"""
# kept voices (`keep_voice`): added in place to libraries made before them
_KEPT_COLUMNS = ("ALTER TABLE chorus_voices ADD COLUMN IF NOT EXISTS kept BOOLEAN NOT NULL DEFAULT false",
                 "ALTER TABLE chorus_voices ADD COLUMN IF NOT EXISTS expires_at BIGINT",
                 "ALTER TABLE chorus_voices ADD COLUMN IF NOT EXISTS seq BIGSERIAL")  # order of arrival
_BUILTIN_SCHEMA = "CREATE TABLE IF NOT EXISTS chorus_builtin_voices (key TEXT PRIMARY KEY, blob BYTEA NOT NULL)"
_LEXICON_SCHEMA = ("CREATE TABLE IF NOT EXISTS chorus_pronunciations (id TEXT PRIMARY KEY, text TEXT NOT NULL, "
                   "say TEXT NOT NULL, voice TEXT, created_at BIGINT NOT NULL, seq BIGSERIAL)")
_ADD_LOCK = 0x63686F7275730001  # pg_advisory_xact_lock key: serialises adds across replicas


class PostgresVoiceStore(SqlVoiceLibrary):
    """The shared `VoiceLibrary` (psycopg is imported only when one is opened)."""

    sql = Statements(
        voice=f"SELECT {COLUMNS} FROM chorus_voices WHERE id = %s",
        voices=f"SELECT {COLUMNS} FROM chorus_voices ORDER BY created_at, id",
        pronunciations="SELECT id, text, say, voice FROM chorus_pronunciations ORDER BY seq",
        add_pronunciation="INSERT INTO chorus_pronunciations (id, text, say, voice, created_at) "
                          "VALUES (%s, %s, %s, %s, %s)",
        delete_pronunciation="DELETE FROM chorus_pronunciations WHERE id = %s",
        builtin="SELECT blob FROM chorus_builtin_voices WHERE key = %s",
        keep_builtin="INSERT INTO chorus_builtin_voices (key, blob) VALUES (%s, %s) ON CONFLICT (key) DO NOTHING",
    )

    def __init__(self, dsn: str, *, max_voices: int | None = None, max_bytes: int | None = None):
        import psycopg  # lazy: optional (the `postgres` extra)

        self.max_voices = max_voices
        self.max_bytes = max_bytes
        self._conn = psycopg.connect(dsn, autocommit=True)
        self._lock = threading.Lock()
        with self._lock:
            self._conn.execute(_SCHEMA)
            for statement in _KEPT_COLUMNS:
                self._conn.execute(statement)
            self._conn.execute(_BUILTIN_SCHEMA)
            self._conn.execute(_LEXICON_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _execute(self, statement: str, params: tuple = ()):
        return self._conn.execute(statement, params or None)

    @contextmanager
    def _adding(self):
        with self._lock, self._conn.transaction():
            self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (_ADD_LOCK,))
            yield

    def _usage(self) -> tuple[int, int]:
        count, stored = self._conn.execute(
            "SELECT count(*) FILTER (WHERE NOT kept), coalesce(sum(octet_length(blob)), 0) "
            "FROM chorus_voices").fetchone()
        return int(count), int(stored)

    def add_kept(self, text: str, seconds: float, blob: bytes, expires_at: int, max_kept: int) -> VoiceInfo:
        with self._adding():
            now = int(time.time())
            self._conn.execute("DELETE FROM chorus_voices WHERE kept AND expires_at <= %s", (now,))
            self._conn.execute(
                "DELETE FROM chorus_voices WHERE id IN (SELECT id FROM chorus_voices WHERE kept "
                "ORDER BY expires_at, seq LIMIT greatest(0, (SELECT count(*) FROM chorus_voices WHERE kept) - %s + 1))",
                (max_kept,))
            return self._insert(KEPT_PREFIX, None, text, seconds, blob, expires_at)

    def _insert(self, base: str, name: str | None, text: str, seconds: float, blob: bytes,
                expires_at: int | None = None) -> VoiceInfo:
        """One row under a fresh id (the caller holds the lock and the transaction)."""
        while True:
            info = new_voice(f"{base}-{secrets.token_hex(4)}", name, text, seconds, expires_at)
            inserted = self._conn.execute(
                f"INSERT INTO chorus_voices ({COLUMNS}, blob) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (id) DO NOTHING",
                (info.id, info.name, info.text, info.seconds, info.created_at, info.kept, info.expires_at, blob),
            ).rowcount
            if inserted:
                return info

    def load(self, voice_id: str) -> bytes | None:
        if not well_formed(voice_id):
            return None
        with self._lock:
            row = self._conn.execute("SELECT blob FROM chorus_voices WHERE id = %s AND (NOT kept OR expires_at > %s)",
                                     (voice_id, int(time.time()))).fetchone()
        return bytes(row[0]) if row else None

    def delete(self, voice_id: str) -> bool:
        if not well_formed(voice_id):
            return False
        with self._lock:
            return self._conn.execute("DELETE FROM chorus_voices WHERE id = %s", (voice_id,)).rowcount > 0
