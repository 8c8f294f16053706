"""What a turn tells its door, in order: accepted, progress, audio, words, and one end.

Transport-free: a door (the WebSocket, the HTTP speech endpoint, a text stream) turns these
into its own frames or bytes. Audio is the engine's float32 samples at the engine's rate;
words are already placed on the clock of the audio the client receives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from server.timestamps.frames import WordsMsg


@dataclass(frozen=True)
class TurnAccepted:
    chunks: int
    target_seconds: tuple[float, ...]


@dataclass(frozen=True)
class TurnProgress:
    chunk: int
    step: int
    num_steps: int
    fraction: float


@dataclass(frozen=True)
class TurnAudio:
    chunk: int
    audio: np.ndarray
    sample_rate: int
    final: bool


@dataclass(frozen=True)
class TurnWords:
    """A chunk's words (with `stream: "whole"`, every chunk's), after that chunk's audio."""

    chunk: int
    frame: WordsMsg


@dataclass(frozen=True)
class TurnEnd:
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
