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

from server.voices.store import VOICE_ID, VoiceInfo, check_room, slug

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
_BUILTIN_SCHEMA = "CREATE TABLE IF NOT EXISTS chorus_builtin_voices (key TEXT PRIMARY KEY, blob BYTEA NOT NULL)"
_COLUMNS = "id, name, text, seconds, created_at"
_ADD_LOCK = 0x63686F7275730001  # pg_advisory_xact_lock key: serialises adds across replicas


class PostgresVoiceStore:
    """The shared `VoiceLibrary` (psycopg is imported only when one is opened)."""

    def __init__(self, dsn: str, *, max_voices: int | None = None, max_bytes: int | None = None):
        import psycopg  # lazy: optional (the `postgres` extra)

        self.max_voices = max_voices
        self.max_bytes = max_bytes
        self._conn = psycopg.connect(dsn, autocommit=True)
        self._lock = threading.Lock()
        with self._lock:
            self._conn.execute(_SCHEMA)
            self._conn.execute(_BUILTIN_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def add(self, name: str | None, text: str, seconds: float, blob: bytes) -> VoiceInfo:
        base = slug(name or "voice")
        with self._lock, self._conn.transaction():
            self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (_ADD_LOCK,))
            count, stored = self._conn.execute(
                "SELECT count(*), coalesce(sum(octet_length(blob)), 0) FROM chorus_voices").fetchone()
            check_room(int(count), int(stored), len(blob), self.max_voices, self.max_bytes)
            while True:
                voice_id = f"{base}-{secrets.token_hex(4)}"
                info = VoiceInfo(voice_id, name or voice_id, text, round(float(seconds), 3), int(time.time()))
                inserted = self._conn.execute(
                    f"INSERT INTO chorus_voices ({_COLUMNS}, blob) VALUES (%s, %s, %s, %s, %s, %s) "
                    "ON CONFLICT (id) DO NOTHING",
                    (info.id, info.name, info.text, info.seconds, info.created_at, blob),
                ).rowcount
                if inserted:
                    return info

    def get(self, voice_id: str) -> VoiceInfo | None:
        if not isinstance(voice_id, str) or not VOICE_ID.match(voice_id):
            return None
        with self._lock:
            row = self._conn.execute(f"SELECT {_COLUMNS} FROM chorus_voices WHERE id = %s", (voice_id,)).fetchone()
        return VoiceInfo(*row) if row else None

    def list(self) -> list[VoiceInfo]:
        with self._lock:
            rows = self._conn.execute(f"SELECT {_COLUMNS} FROM chorus_voices ORDER BY created_at, id").fetchall()
        return [VoiceInfo(*row) for row in rows]

    def load(self, voice_id: str) -> bytes | None:
        if not isinstance(voice_id, str) or not VOICE_ID.match(voice_id):
            return None
        with self._lock:
            row = self._conn.execute("SELECT blob FROM chorus_voices WHERE id = %s", (voice_id,)).fetchone()
        return bytes(row[0]) if row else None

    def delete(self, voice_id: str) -> bool:
        if not isinstance(voice_id, str) or not VOICE_ID.match(voice_id):
            return False
        with self._lock:
            return self._conn.execute("DELETE FROM chorus_voices WHERE id = %s", (voice_id,)).rowcount > 0

    def load_builtin(self, key: str) -> bytes | None:
        with self._lock:
            row = self._conn.execute("SELECT blob FROM chorus_builtin_voices WHERE key = %s", (key,)).fetchone()
        return bytes(row[0]) if row else None

    def save_builtin(self, key: str, blob: bytes) -> bytes:
        with self._lock:
            self._conn.execute("INSERT INTO chorus_builtin_voices (key, blob) VALUES (%s, %s) "
                               "ON CONFLICT (key) DO NOTHING", (key, blob))
            row = self._conn.execute("SELECT blob FROM chorus_builtin_voices WHERE key = %s", (key,)).fetchone()
        return bytes(row[0])
