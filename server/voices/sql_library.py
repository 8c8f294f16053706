"""What the two SQL voice libraries do alike, whatever their database: a row as a `VoiceInfo`,
lookups by id, the name check of an add, the pronunciation lexicon and the built-in voices.

A library gives its SQL as `Statements` (each database spells placeholders and tables its own
way), runs one statement with `_execute`, and says with `_adding` what an add holds (the lock;
in PostgreSQL also a transaction under an advisory lock shared by every replica). Where the
voice's bytes live (a file, the row) stays with each library.
"""

from __future__ import annotations

import secrets
import threading
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar

from server.text.lexicon import Pronunciation
from server.voices.store import (
    KEPT_PREFIX,
    PRONUNCIATION_PREFIX,
    VOICE_ID,
    LibraryFull,
    NameTaken,
    Owner,
    PronunciationTaken,
    Removed,
    VoiceInfo,
    check_room,
    kept_to_remove,
    live,
    may_use,
    pronunciation_clash,
    same_name,
    slug,
)

# a voice's row, as `voice_info` reads it (and, last, who kept it: `Owner.tag`)
COLUMNS = "id, name, text, seconds, created_at, kept, expires_at, owner"


@dataclass(frozen=True)
class Statements:
    """The SQL a library spells its own way; `{COLUMNS}` rows where a statement returns voices."""

    voice: str  # one voice by id
    voices: str  # every voice, oldest first
    pronunciations: str  # id, text, say, voice of every entry, in order of arrival
    add_pronunciation: str  # id, text, say, voice, created_at
    delete_pronunciation: str  # by id
    builtin: str  # a built-in voice's bytes by key
    keep_builtin: str  # key, bytes; nothing changes when the key is there
    kept: str  # id, owner, expires_at of every kept voice, in order of arrival


def voice_info(row: Any) -> VoiceInfo:
    voice_id, name, text, seconds, created_at, kept, expires_at = row[:7]
    return VoiceInfo(voice_id, name, text, seconds, created_at, kept=bool(kept), expires_at=expires_at)


def visible(row: Any, owner: Owner | None, listing: bool = False) -> bool:
    """Whether `owner` may use (or, `listing`, be shown) the voice in `row`: a kept voice is
    listed only to the key that kept it; used by it alone, or by whoever has its id where
    there are no keys."""
    kept, voice_owner = bool(row[5]), row[7]
    if listing and kept and owner is not None:
        return owner.by_key and voice_owner == owner.tag
    return may_use(owner, kept, voice_owner)


def new_voice(voice_id: str, name: str | None, text: str, seconds: float, expires_at: int | None) -> VoiceInfo:
    """The record of a voice stored now (a kept voice when it expires)."""
    return VoiceInfo(voice_id, name or voice_id, text, round(float(seconds), 3), int(time.time()),
                     kept=expires_at is not None, expires_at=expires_at)


def well_formed(voice_id: object) -> bool:
    """An id `VOICE_ID` accepts: anything else is no voice, before any lookup."""
    return isinstance(voice_id, str) and VOICE_ID.match(voice_id) is not None


class SqlVoiceLibrary:
    """The `VoiceLibrary` methods both SQL libraries share; see the module docstring."""

    sql: ClassVar[Statements]
    max_voices: int | None
    max_bytes: int | None
    _lock: threading.Lock
    _watchers: list[Removed]

    def watch(self, removed: Removed) -> None:
        self._watchers.append(removed)

    def _removed(self, voice_ids: list[str]) -> None:
        """Tell the watchers (after the change is committed)."""
        if voice_ids:
            for removed in list(self._watchers):
                removed(voice_ids)

    def _execute(self, statement: str, params: tuple = ()) -> Any:
        """A cursor over what `statement` returns (the caller holds the lock)."""
        raise NotImplementedError

    def _adding(self) -> AbstractContextManager:
        """What an add holds, so two adds never pass a limit or take a name together."""
        return self._lock

    def _usage(self) -> tuple[int, int]:
        """Uploaded voices (kept ones are not counted) and their stored bytes."""
        raise NotImplementedError

    def _insert(self, base: str, name: str | None, text: str, seconds: float, blob: bytes,
                expires_at: int | None = None, owner: str | None = None) -> VoiceInfo:
        raise NotImplementedError

    def _remove_kept(self, voice_ids: list[str]) -> None:
        """Remove these voices (the caller holds what an add holds)."""
        raise NotImplementedError

    def add_kept(self, text: str, seconds: float, blob: bytes, expires_at: int, owner: Owner, max_kept: int,
                 max_per_owner: int) -> VoiceInfo:
        """Store a voice a request produced for `owner`, removing what `kept_to_remove` says."""
        with self._adding():
            rows = self._execute(self.sql.kept).fetchall()
            doomed = kept_to_remove(rows, owner.tag, time.time(), max_kept, max_per_owner)
            if doomed:
                self._remove_kept(doomed)
            info = self._insert(KEPT_PREFIX, None, text, seconds, blob, expires_at, owner.tag)
        self._removed(doomed)
        return info

    def add(self, name: str | None, text: str, seconds: float, blob: bytes) -> VoiceInfo:
        """Store an encoded voice: its bytes and its row, both or neither."""
        with self._adding():
            count, stored = self._usage()
            check_room(count, stored, len(blob), self.max_voices, self.max_bytes)
            if name is not None:
                for row in self._execute(self.sql.voices):
                    if same_name(row[1], name):
                        raise NameTaken(voice_info(row))
            return self._insert(slug(name or "voice"), name, text, seconds, blob)

    def _row(self, voice_id: str, owner: Owner | None) -> Any | None:
        """A live voice's row that `owner` may use, else None."""
        if not well_formed(voice_id):
            return None
        with self._lock:
            row = self._execute(self.sql.voice, (voice_id,)).fetchone()
        if row is None or not live(voice_info(row), time.time()) or not visible(row, owner):
            return None
        return row

    def get(self, voice_id: str, owner: Owner | None = None) -> VoiceInfo | None:
        row = self._row(voice_id, owner)
        return voice_info(row) if row is not None else None

    def list(self, owner: Owner | None = None) -> list[VoiceInfo]:
        with self._lock:
            rows = self._execute(self.sql.voices).fetchall()
        now = time.time()
        return [info for row in rows if live(info := voice_info(row), now) and visible(row, owner, listing=True)]

    def add_pronunciation(self, text: str, say: str, voice: str | None, max_entries: int | None = None
                          ) -> Pronunciation:
        with self._adding():  # one text, one entry
            entries = self._pronunciations()
            if (clash := pronunciation_clash(entries, text, voice)) is not None:
                raise PronunciationTaken(clash)
            if max_entries is not None and len(entries) >= max_entries:
                raise LibraryFull(f"pronunciations: the lexicon is full ({len(entries)} entries, the limit is "
                                  f"{max_entries}, --max-pronunciations); delete one first")
            entry = Pronunciation(f"{PRONUNCIATION_PREFIX}-{secrets.token_hex(4)}", text, say, voice)
            self._execute(self.sql.add_pronunciation, (entry.id, entry.text, entry.say, entry.voice, int(time.time())))
        return entry

    def list_pronunciations(self) -> list[Pronunciation]:
        with self._lock:
            return self._pronunciations()

    def _pronunciations(self) -> list[Pronunciation]:
        return [Pronunciation(*row) for row in self._execute(self.sql.pronunciations)]

    def delete_pronunciation(self, entry_id: str) -> bool:
        with self._lock:
            return self._execute(self.sql.delete_pronunciation, (entry_id,)).rowcount > 0

    def load_builtin(self, key: str) -> bytes | None:
        with self._lock:
            row = self._execute(self.sql.builtin, (key,)).fetchone()
        return bytes(row[0]) if row else None

    def save_builtin(self, key: str, blob: bytes) -> bytes:
        with self._lock:
            self._execute(self.sql.keep_builtin, (key, blob))
            return bytes(self._execute(self.sql.builtin, (key,)).fetchone()[0])

