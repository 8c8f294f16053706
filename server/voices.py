"""The voice library: an SQLite index plus one token file per voice, under `--voices-dir`.

Voices are stored already encoded (the codec runs once, at upload), as the opaque bytes
the engine's `voice_codec` makes, so this module never touches torch. Ids are made here
and checked on every lookup, so no id can name a path outside the folder. A library holds
at most `max_voices` voices and `max_bytes` of stored voice data (`--max-voices`,
`--max-voices-bytes`); an upload beyond either is refused with `LibraryFull`.
"""

from __future__ import annotations

import os
import re
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

VOICE_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS voices (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    text TEXT NOT NULL,
    seconds REAL NOT NULL,
    created_at INTEGER NOT NULL
)
"""


class LibraryFull(Exception):
    """The library is at its voice count or storage limit; the message is for the client."""


def check_room(count: int, stored_bytes: int, new_bytes: int, max_voices: int | None,
               max_bytes: int | None) -> None:
    """Raise `LibraryFull` when one more voice of `new_bytes` would pass a limit."""
    if max_voices is not None and count >= max_voices:
        raise LibraryFull(f"voices: the library is full ({count} voices, the limit is {max_voices}); "
                          "delete one first")
    if max_bytes is not None and stored_bytes + new_bytes > max_bytes:
        raise LibraryFull(f"voices: the library is full ({stored_bytes} bytes stored, the limit is "
                          f"{max_bytes}); delete a voice first")


class VoiceInfo(msgspec.Struct, frozen=True):
    """What clients see of a voice (`POST/GET /v1/voices`)."""

    id: str
    name: str
    text: str
    seconds: float
    created_at: int  # unix seconds


def slug(name: str) -> str:
    """A readable id prefix from a voice name (`"Ada L."` -> `ada-l`)."""
    text = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return text[:40].rstrip("-") or "voice"


@dataclass
class VoiceStore:
    root: Path
    max_voices: int | None = None
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self._tokens = self.root / "tokens"
        self._tokens.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.root / "index.sqlite3", check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _path(self, voice_id: str) -> Path | None:
        """The token file of a well-formed id, else None (no id can leave the folder)."""
        if not isinstance(voice_id, str) or not VOICE_ID.match(voice_id):
            return None
        return self._tokens / f"{voice_id}.npz"

    def add(self, name: str | None, text: str, seconds: float, blob: bytes) -> VoiceInfo:
        """Store an encoded voice: the token file first (atomically), then its index row."""
        base = slug(name or "voice")
        with self._lock:
            count = self._db.execute("SELECT count(*) FROM voices").fetchone()[0]
            check_room(count, self._stored_bytes(), len(blob), self.max_voices, self.max_bytes)
            while True:
                voice_id = f"{base}-{secrets.token_hex(4)}"
                if self._db.execute("SELECT 1 FROM voices WHERE id = ?", (voice_id,)).fetchone() is None:
                    break
            path = self._path(voice_id)
            assert path is not None
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(blob)
            os.replace(tmp, path)
            info = VoiceInfo(voice_id, name or voice_id, text, round(float(seconds), 3), int(time.time()))
            self._db.execute("INSERT INTO voices VALUES (?, ?, ?, ?, ?)",
                             (info.id, info.name, info.text, info.seconds, info.created_at))
        return info

    def _stored_bytes(self) -> int:
        total = 0
        with os.scandir(self._tokens) as entries:
            for entry in entries:
                if entry.is_file():
                    total += entry.stat().st_size
        return total

    def get(self, voice_id: str) -> VoiceInfo | None:
        if self._path(voice_id) is None:
            return None
        with self._lock:
            row = self._db.execute("SELECT * FROM voices WHERE id = ?", (voice_id,)).fetchone()
        return VoiceInfo(*row) if row else None

    def list(self) -> list[VoiceInfo]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM voices ORDER BY created_at, id").fetchall()
        return [VoiceInfo(*row) for row in rows]

    def load(self, voice_id: str) -> bytes | None:
        """The stored encoded voice, or None when there is no such voice."""
        path = self._path(voice_id)
        if path is None or self.get(voice_id) is None:
            return None
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None

    def delete(self, voice_id: str) -> bool:
        path = self._path(voice_id)
        if path is None:
            return False
        with self._lock:
            gone = self._db.execute("DELETE FROM voices WHERE id = ?", (voice_id,)).rowcount > 0
            path.unlink(missing_ok=True)
        return gone


def open_voice_library(voices_dir: Path, voices_db: str | None = None, *, max_voices: int | None = None,
                       max_bytes: int | None = None):
    """The configured library: PostgreSQL when a DSN is given (shared by replicas), else
    the embedded SQLite + token files in `voices_dir`. Both have the same methods and limits."""
    if voices_db:
        from server.voices_pg import PostgresVoiceStore

        return PostgresVoiceStore(voices_db, max_voices=max_voices, max_bytes=max_bytes)
    return VoiceStore(voices_dir, max_voices=max_voices, max_bytes=max_bytes)
