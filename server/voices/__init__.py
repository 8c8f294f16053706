"""The voice library: `store` (the protocol and shared types), `sql_library` (what both SQL
libraries share), `sqlite` (embedded, the default) and `postgres` (shared by replicas).
`open_voice_library` picks one from the settings."""

from __future__ import annotations

from pathlib import Path

from server.voices.postgres import PostgresVoiceStore
from server.voices.sqlite import VoiceStore
from server.voices.store import (
    VOICE_ID,
    LibraryFull,
    NameTaken,
    PronunciationTaken,
    VoiceInfo,
    VoiceLibrary,
    check_room,
    slug,
)

__all__ = [
    "VOICE_ID",
    "LibraryFull",
    "NameTaken",
    "PostgresVoiceStore",
    "PronunciationTaken",
    "VoiceInfo",
    "VoiceLibrary",
    "VoiceStore",
    "check_room",
    "open_voice_library",
    "slug",
]


def open_voice_library(voices_dir: Path, voices_db: str | None = None, *, max_voices: int | None = None,
                       max_bytes: int | None = None) -> VoiceLibrary:
    """The configured library: PostgreSQL when a DSN is given (shared by replicas), else
    the embedded SQLite + token files in `voices_dir`. Both have the same methods and limits."""
    if voices_db:
        return PostgresVoiceStore(voices_db, max_voices=max_voices, max_bytes=max_bytes)
    return VoiceStore(voices_dir, max_voices=max_voices, max_bytes=max_bytes)
