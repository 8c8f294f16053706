"""What a turn tells its door, in order: accepted, progress, audio, words, and one end.

Transport-free: a door (the WebSocket, the HTTP speech endpoint, a text stream) turns these
into its own frames or bytes. Audio is the engine's float32 samples at the engine's rate;
words are already placed on the clock of the audio the client receives.
"""

from __future__ import annotations

from typing import Any, Literal

from msgspec import Struct

from server.timestamps.frames import WordsMsg


class TurnAccepted(Struct, frozen=True):
    chunks: int
    target_seconds: tuple[float, ...]


class TurnProgress(Struct, frozen=True):
    chunk: int
    step: int
    num_steps: int
    fraction: float


class TurnAudio(Struct, frozen=True):
    chunk: int
    audio: Any  # float32 samples (numpy), at `sample_rate`
    sample_rate: int
    final: bool


class TurnWords(Struct, frozen=True):
    """A chunk's words (with `stream: "whole"`, every chunk's), after that chunk's audio."""

    chunk: int
    frame: WordsMsg


class TurnEnd(Struct, frozen=True):
    """Exactly one per turn. `requested`: a cancel the client (or its door) asked for, rather
    than the server stopping; `code`/`field`/`retry_after_ms`: an error's, as the wire says it."""

    outcome: Literal["done", "cancelled", "error"]
    code: str | None = None
    message: str | None = None
    field: str | None = None
    retry_after_ms: int | None = None
    requested: bool = False
    audio_seconds: float = 0.0
    queue_ms: float = 0.0
    first_audio_ms: float | None = None
    total_ms: float = 0.0
    voice_id: str | None = None  # `keep_voice`: the voice kept


TurnEvent = TurnAccepted | TurnProgress | TurnAudio | TurnWords | TurnEnd
