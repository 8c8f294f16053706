"""The voice library in PostgreSQL, for several stateless replicas sharing one library.

Same contract as the embedded `VoiceStore` (SQLite + token files), but the encoded voice
lives in the row itself (`bytea`), so no replica needs a shared disk. Ids are made and
checked exactly as in the embedded store, and so are the limits: the count and the stored
bytes are checked and the row inserted in one transaction that holds an advisory lock, so
replicas adding at once cannot pass a limit together.

A voice deleted or evicted here is announced to every replica with `NOTIFY chorus_voices` in the
same transaction; each library listens on a connection of its own (a thread that reconnects
when it is lost) and tells its watchers, so a replica forgets a deleted voice as soon as the
delete commits. The service's cache also checks voices again on a timer (`--voice-cache-seconds`),
so a lost notification costs at most that.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from contextlib import contextmanager

from server.voices.sql_library import COLUMNS, SqlVoiceLibrary, Statements, new_voice, visible, well_formed
from server.voices.store import KEPT_ID_BYTES, Owner, VoiceInfo

log = logging.getLogger("chorus.voices")
CHANNEL = "chorus_voices"  # NOTIFY payload: a removed voice's id
LISTEN_RETRY_S = 1.0

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
                 "ALTER TABLE chorus_voices ADD COLUMN IF NOT EXISTS seq BIGSERIAL",  # order of arrival
                 "ALTER TABLE chorus_voices ADD COLUMN IF NOT EXISTS owner TEXT")  # who kept it
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
        kept="SELECT id, owner, expires_at FROM chorus_voices WHERE kept ORDER BY seq",
    )

    def __init__(self, dsn: str, *, max_voices: int | None = None, max_bytes: int | None = None):
        import psycopg  # lazy: optional (the `postgres` extra)

        self.max_voices = max_voices
        self.max_bytes = max_bytes
        self._dsn = dsn
        self._conn = psycopg.connect(dsn, autocommit=True)
        self._lock = threading.Lock()
        self._watchers = []
        self._closed = threading.Event()
        with self._lock, self._conn.transaction():
            self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (_ADD_LOCK,))  # replicas starting at once
            self._conn.execute(_SCHEMA)
            for statement in _KEPT_COLUMNS:
                self._conn.execute(statement)
            self._conn.execute(_BUILTIN_SCHEMA)
            self._conn.execute(_LEXICON_SCHEMA)
        self._listener = threading.Thread(target=self._listen, name="chorus-voices-listen", daemon=True)
        self._listener.start()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            self._conn.close()
        self._listener.join(timeout=5)

    def _listen(self) -> None:
        """Every replica's removals, as they commit: `NOTIFY chorus_voices, id`."""
        import psycopg  # lazy: optional (the `postgres` extra)

        while not self._closed.is_set():
            try:
                with psycopg.connect(self._dsn, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    while not self._closed.is_set():
                        for note in conn.notifies(timeout=0.5):
                            self._removed([note.payload])
            except Exception as exc:  # noqa: BLE001 - lost: reconnect (the cache's timer covers the gap)
                if not self._closed.is_set():
                    log.warning("listening for voice deletions failed; reconnecting: %r", exc)
                    self._closed.wait(LISTEN_RETRY_S)

    def _notify(self, voice_ids: list[str]) -> None:
        """Announce removals (the caller holds the lock; sent when its transaction commits)."""
        for voice_id in voice_ids:
            self._conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, voice_id))

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

    def _remove_kept(self, voice_ids: list[str]) -> None:
        self._conn.execute("DELETE FROM chorus_voices WHERE id = ANY(%s)", (voice_ids,))
        self._notify(voice_ids)

    def _insert(self, base: str, name: str | None, text: str, seconds: float, blob: bytes,
                expires_at: int | None = None, owner: str | None = None) -> VoiceInfo:
        """One row under a fresh id (the caller holds the lock and the transaction)."""
        while True:
            token = secrets.token_hex(KEPT_ID_BYTES if expires_at is not None else 4)
            info = new_voice(f"{base}-{token}", name, text, seconds, expires_at)
            inserted = self._conn.execute(
                f"INSERT INTO chorus_voices ({COLUMNS}, blob) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (id) DO NOTHING",
                (info.id, info.name, info.text, info.seconds, info.created_at, info.kept, info.expires_at, owner,
                 blob),
            ).rowcount
            if inserted:
                return info

    def load(self, voice_id: str, owner: Owner | None = None) -> bytes | None:
        if not well_formed(voice_id):
            return None
        with self._lock:
            row = self._conn.execute(f"SELECT {COLUMNS}, blob FROM chorus_voices WHERE id = %s AND "
                                     "(NOT kept OR expires_at > %s)", (voice_id, int(time.time()))).fetchone()
        return bytes(row[8]) if row and visible(row, owner) else None

    def delete(self, voice_id: str, owner: Owner | None = None) -> bool:
        if not well_formed(voice_id):
            return False
        with self._lock, self._conn.transaction():
            row = self._conn.execute(f"SELECT {COLUMNS} FROM chorus_voices WHERE id = %s FOR UPDATE",
                                     (voice_id,)).fetchone()
            gone = row is not None and visible(row, owner) and self._conn.execute(
                "DELETE FROM chorus_voices WHERE id = %s", (voice_id,)).rowcount > 0
            if gone:
                self._notify([voice_id])
        if gone:
            self._removed([voice_id])
        return gone
