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

from server.text.lexicon import Pronunciation
from server.voices.store import (
    KEPT_PREFIX,
    PRONUNCIATION_PREFIX,
    VOICE_ID,
    NameTaken,
    PronunciationTaken,
    VoiceInfo,
    check_room,
    live,
    pronunciation_clash,
    same_name,
    slug,
)

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
                 "ALTER TABLE chorus_voices ADD COLUMN IF NOT EXISTS expires_at BIGINT")
_BUILTIN_SCHEMA = "CREATE TABLE IF NOT EXISTS chorus_builtin_voices (key TEXT PRIMARY KEY, blob BYTEA NOT NULL)"
_LEXICON_SCHEMA = ("CREATE TABLE IF NOT EXISTS chorus_pronunciations (id TEXT PRIMARY KEY, text TEXT NOT NULL, "
                   "say TEXT NOT NULL, voice TEXT, created_at BIGINT NOT NULL, seq BIGSERIAL)")
_COLUMNS = "id, name, text, seconds, created_at, kept, expires_at"


def _info(row) -> VoiceInfo:
    voice_id, name, text, seconds, created_at, kept, expires_at = row
    return VoiceInfo(voice_id, name, text, seconds, created_at, kept=bool(kept), expires_at=expires_at)
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
            for statement in _KEPT_COLUMNS:
                self._conn.execute(statement)
            self._conn.execute(_BUILTIN_SCHEMA)
            self._conn.execute(_LEXICON_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def add(self, name: str | None, text: str, seconds: float, blob: bytes) -> VoiceInfo:
        with self._lock, self._conn.transaction():
            self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (_ADD_LOCK,))
            count, stored = self._conn.execute(
                "SELECT count(*) FILTER (WHERE NOT kept), coalesce(sum(octet_length(blob)), 0) "
                "FROM chorus_voices").fetchone()
            check_room(int(count), int(stored), len(blob), self.max_voices, self.max_bytes)
            if name is not None:  # under the add lock: two replicas cannot both take a name
                for row in self._conn.execute(f"SELECT {_COLUMNS} FROM chorus_voices"):
                    if same_name(row[1], name):
                        raise NameTaken(_info(row))
            return self._insert(slug(name or "voice"), name, text, seconds, blob)

    def add_kept(self, text: str, seconds: float, blob: bytes, expires_at: int, max_kept: int) -> VoiceInfo:
        with self._lock, self._conn.transaction():
            self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (_ADD_LOCK,))
            now = int(time.time())
            self._conn.execute("DELETE FROM chorus_voices WHERE kept AND expires_at <= %s", (now,))
            self._conn.execute(
                "DELETE FROM chorus_voices WHERE id IN (SELECT id FROM chorus_voices WHERE kept "
                "ORDER BY expires_at, id LIMIT greatest(0, (SELECT count(*) FROM chorus_voices WHERE kept) - %s + 1))",
                (max_kept,))
            return self._insert(KEPT_PREFIX, None, text, seconds, blob, expires_at)

    def _insert(self, base: str, name: str | None, text: str, seconds: float, blob: bytes,
                expires_at: int | None = None) -> VoiceInfo:
        """One row under a fresh id (the caller holds the lock and the transaction)."""
        while True:
            voice_id = f"{base}-{secrets.token_hex(4)}"
            info = VoiceInfo(voice_id, name or voice_id, text, round(float(seconds), 3), int(time.time()),
                             kept=expires_at is not None, expires_at=expires_at)
            inserted = self._conn.execute(
                f"INSERT INTO chorus_voices ({_COLUMNS}, blob) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (id) DO NOTHING",
                (info.id, info.name, info.text, info.seconds, info.created_at, info.kept, info.expires_at, blob),
            ).rowcount
            if inserted:
                return info

    def get(self, voice_id: str) -> VoiceInfo | None:
        if not isinstance(voice_id, str) or not VOICE_ID.match(voice_id):
            return None
        with self._lock:
            row = self._conn.execute(f"SELECT {_COLUMNS} FROM chorus_voices WHERE id = %s", (voice_id,)).fetchone()
        info = _info(row) if row else None
        return info if info is not None and live(info, time.time()) else None

    def list(self) -> list[VoiceInfo]:
        with self._lock:
            rows = self._conn.execute(f"SELECT {_COLUMNS} FROM chorus_voices ORDER BY created_at, id").fetchall()
        now = time.time()
        return [info for info in map(_info, rows) if live(info, now)]

    def load(self, voice_id: str) -> bytes | None:
        if not isinstance(voice_id, str) or not VOICE_ID.match(voice_id):
            return None
        with self._lock:
            row = self._conn.execute("SELECT blob FROM chorus_voices WHERE id = %s AND (NOT kept OR expires_at > %s)",
                                     (voice_id, int(time.time()))).fetchone()
        return bytes(row[0]) if row else None

    def delete(self, voice_id: str) -> bool:
        if not isinstance(voice_id, str) or not VOICE_ID.match(voice_id):
            return False
        with self._lock:
            return self._conn.execute("DELETE FROM chorus_voices WHERE id = %s", (voice_id,)).rowcount > 0

    def add_pronunciation(self, text: str, say: str, voice: str | None) -> Pronunciation:
        with self._lock, self._conn.transaction():
            self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (_ADD_LOCK,))  # one text, one entry
            if (clash := pronunciation_clash(self._pronunciations(), text, voice)) is not None:
                raise PronunciationTaken(clash)
            entry = Pronunciation(f"{PRONUNCIATION_PREFIX}-{secrets.token_hex(4)}", text, say, voice)
            self._conn.execute("INSERT INTO chorus_pronunciations (id, text, say, voice, created_at) "
                               "VALUES (%s, %s, %s, %s, %s)",
                               (entry.id, entry.text, entry.say, entry.voice, int(time.time())))
        return entry

    def list_pronunciations(self) -> list[Pronunciation]:
        with self._lock:
            return self._pronunciations()

    def _pronunciations(self) -> list[Pronunciation]:
        rows = self._conn.execute("SELECT id, text, say, voice FROM chorus_pronunciations ORDER BY seq")
        return [Pronunciation(*row) for row in rows]

    def delete_pronunciation(self, entry_id: str) -> bool:
        with self._lock:
            return self._conn.execute("DELETE FROM chorus_pronunciations WHERE id = %s", (entry_id,)).rowcount > 0

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
