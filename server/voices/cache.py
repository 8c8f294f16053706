"""Library voices decoded once and kept for reuse, never past their deletion.

A voice named by many requests is read and decoded once; but a cached voice must stop working
once it is deleted (here or on another replica), expires or is evicted. Two signals make sure:
the library's own (`VoiceLibrary.watch`: this server's deletes and evictions at once, and every
replica's through PostgreSQL's `NOTIFY`), and a timer: a voice last checked against the library
more than `check_seconds` ago is checked again (one indexed read) before it is used, which bounds
the time a lost notification, an expiry or an edit made behind the server's back can go unseen.
Entries are keyed by voice and by who asked (a kept voice is its owner's alone).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

P = TypeVar("P")
Key = tuple[str, str | None]  # (voice id, the owner's tag where kept voices are private to it)


@dataclass
class _Entry(Generic[P]):
    prompt: P
    checked_at: float


class VoiceCache(Generic[P]):
    def __init__(self, size: int, check_seconds: float):
        self.size = size
        self.check_seconds = check_seconds
        self._entries: OrderedDict[Key, _Entry[P]] = OrderedDict()
        self._lock = threading.Lock()  # `forget` comes from the library's threads

    def get(self, key: Key) -> tuple[P, bool] | None:
        """(the voice, whether it was checked recently enough to use as it is), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry.prompt, time.monotonic() - entry.checked_at < self.check_seconds

    def put(self, key: Key, prompt: P) -> None:
        with self._lock:
            self._entries[key] = _Entry(prompt, time.monotonic())
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def checked(self, key: Key) -> None:
        with self._lock:
            if (entry := self._entries.get(key)) is not None:
                entry.checked_at = time.monotonic()

    def forget(self, voice_ids: list[str]) -> None:
        """The library removed these voices: drop them for every owner (any thread)."""
        gone = set(voice_ids)
        with self._lock:
            for key in [key for key in self._entries if key[0] in gone]:
                del self._entries[key]
