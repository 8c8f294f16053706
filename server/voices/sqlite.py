"""The embedded voice library: an SQLite index plus one token file per voice, under
`--voices-dir`. Ids are checked before any path is made, so no id can name a path outside
the folder.

A voice is its row and its file together: `add` puts the file in place inside the row's
transaction and undoes both if either fails, and opening the library sweeps what a crash
between the two could leave (a file without a row, a half-written `.tmp`, a row without a
file). Only indexed files count against `--max-voices-bytes`.
"""

from __future__ import annotations

import logging
import os
import secrets
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from server.voices.sql_library import COLUMNS, SqlVoiceLibrary, Statements, new_voice, visible, well_formed
from server.voices.store import KEPT_ID_BYTES, Owner, VoiceInfo

log = logging.getLogger("chorus.voices")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS voices (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    text TEXT NOT NULL,
    seconds REAL NOT NULL,
    created_at INTEGER NOT NULL,
    kept INTEGER NOT NULL DEFAULT 0,
    expires_at INTEGER
)
"""
# libraries made before kept voices (and their owners): the columns are added in place
_ADDED_COLUMNS = (("kept", "INTEGER NOT NULL DEFAULT 0"), ("expires_at", "INTEGER"), ("owner", "TEXT"))
# Built-in voices (OpenAI's names), made once per model: not library voices (never listed
# with them, never deleted), so they live in their own table.
_BUILTIN_SCHEMA = "CREATE TABLE IF NOT EXISTS builtin_voices (key TEXT PRIMARY KEY, blob BLOB NOT NULL)"
# The pronunciation lexicon (`/v1/pronunciations`), kept with the voices it may name.
_LEXICON_SCHEMA = ("CREATE TABLE IF NOT EXISTS pronunciations (id TEXT PRIMARY KEY, text TEXT NOT NULL, "
                   "say TEXT NOT NULL, voice TEXT, created_at INTEGER NOT NULL)")


@dataclass
class VoiceStore(SqlVoiceLibrary):
    """The embedded `VoiceLibrary` (one process owns the folder)."""

    sql: ClassVar[Statements] = Statements(
        voice=f"SELECT {COLUMNS} FROM voices WHERE id = ?",
        voices=f"SELECT {COLUMNS} FROM voices ORDER BY created_at, id",
        pronunciations="SELECT id, text, say, voice FROM pronunciations ORDER BY rowid",
        add_pronunciation="INSERT INTO pronunciations VALUES (?, ?, ?, ?, ?)",
        delete_pronunciation="DELETE FROM pronunciations WHERE id = ?",
        builtin="SELECT blob FROM builtin_voices WHERE key = ?",
        keep_builtin="INSERT OR IGNORE INTO builtin_voices VALUES (?, ?)",
        kept="SELECT id, owner, expires_at FROM voices WHERE kept = 1 ORDER BY rowid",
    )

    root: Path
    max_voices: int | None = None
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self._tokens = self.root / "tokens"
        self._tokens.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._watchers = []
        self._db = sqlite3.connect(self.root / "index.sqlite3", check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(_SCHEMA)
        have = {row[1] for row in self._db.execute("PRAGMA table_info(voices)")}
        for column, kind in _ADDED_COLUMNS:
            if column not in have:
                self._db.execute(f"ALTER TABLE voices ADD COLUMN {column} {kind}")
        self._db.execute(_BUILTIN_SCHEMA)
        self._db.execute(_LEXICON_SCHEMA)
        self._sweep()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _path(self, voice_id: str) -> Path | None:
        """The token file of a well-formed id, else None (no id can leave the folder)."""
        return self._tokens / f"{voice_id}.npz" if well_formed(voice_id) else None

    def _execute(self, statement: str, params: tuple = ()) -> sqlite3.Cursor:
        return self._db.execute(statement, params)

    def _usage(self) -> tuple[int, int]:
        return self._db.execute("SELECT count(*) FROM voices WHERE kept = 0").fetchone()[0], self._stored_bytes()

    def _sweep(self) -> None:
        """Remove what an interrupted `add` or `delete` left: files without a row (and
        `.tmp` files), rows without a file."""
        ids = {row[0] for row in self._db.execute("SELECT id FROM voices")}
        files = set()
        for entry in self._tokens.iterdir():
            voice_id = entry.name.removesuffix(".npz")
            if entry.suffix == ".npz" and voice_id in ids:
                files.add(voice_id)
            elif entry.is_file():
                log.warning("removing a voice file without an index row", extra={"file": entry.name})
                entry.unlink(missing_ok=True)
        for voice_id in ids - files:
            log.warning("removing a voice whose file is missing", extra={"voice": voice_id})
            self._db.execute("DELETE FROM voices WHERE id = ?", (voice_id,))

    def _remove_kept(self, voice_ids: list[str]) -> None:
        for voice_id in voice_ids:
            self._remove(voice_id)

    def _insert(self, base: str, name: str | None, text: str, seconds: float, blob: bytes,
                expires_at: int | None = None, owner: str | None = None) -> VoiceInfo:
        """Row and file, both or neither (the caller holds the lock)."""
        while True:
            voice_id = f"{base}-{secrets.token_hex(KEPT_ID_BYTES if expires_at is not None else 4)}"
            if self._db.execute("SELECT 1 FROM voices WHERE id = ?", (voice_id,)).fetchone() is None:
                break
        path = self._path(voice_id)
        assert path is not None
        info = new_voice(voice_id, name, text, seconds, expires_at)
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_bytes(blob)
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(f"INSERT INTO voices ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                 (info.id, info.name, info.text, info.seconds, info.created_at,
                                  int(info.kept), info.expires_at, owner))
                os.replace(tmp, path)
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                path.unlink(missing_ok=True)
                raise
        finally:
            tmp.unlink(missing_ok=True)
        return info

    def _stored_bytes(self) -> int:
        """Bytes of the indexed voices' files (a stray file never fills the library)."""
        ids = {row[0] for row in self._db.execute("SELECT id FROM voices")}
        total = 0
        with os.scandir(self._tokens) as entries:
            for entry in entries:
                if entry.is_file() and entry.name.removesuffix(".npz") in ids:
                    total += entry.stat().st_size
        return total

    def load(self, voice_id: str, owner: Owner | None = None) -> bytes | None:
        """The stored encoded voice, or None when there is no such voice `owner` may use."""
        path = self._path(voice_id)
        if path is None or self.get(voice_id, owner) is None:
            return None
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None

    def delete(self, voice_id: str, owner: Owner | None = None) -> bool:
        path = self._path(voice_id)
        if path is None:
            return False
        with self._lock:
            row = self._db.execute(f"SELECT {COLUMNS} FROM voices WHERE id = ?", (voice_id,)).fetchone()
            gone = row is not None and visible(row, owner) and self._remove(voice_id)
        if gone:
            self._removed([voice_id])
        return gone

    def _remove(self, voice_id: str) -> bool:
        """Row, then file (the caller holds the lock)."""
        path = self._path(voice_id)
        assert path is not None
        gone = self._db.execute("DELETE FROM voices WHERE id = ?", (voice_id,)).rowcount > 0
        path.unlink(missing_ok=True)
        return gone
