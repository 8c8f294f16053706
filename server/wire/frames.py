"""The server's frames of the Chorus protocol (docs/protocol.md, version 1): what it sends.

`server.wire.messages` (the client's messages and their parsing) re-exports every name here, so
callers keep one import for the whole wire.
"""

from __future__ import annotations

import struct
from typing import Any

import msgspec
from msgspec import Struct, field

from server import options as table

PROTOCOL_VERSION = 1
MAX_NUM_STEP = table.MAX_NUM_STEP
ENCODINGS = ("pcm_s16le", "f32le", "mulaw", "alaw", "opus")
SAMPLE_RATES = (8000, 16000, 22050, 24000, 44100, 48000)


class Limits(Struct):
    max_text_chars: int
    max_inflight: int
    max_num_step: int = MAX_NUM_STEP
    max_audio_seconds: float | None = None  # --max-audio-seconds; null when unlimited
    max_dialogue_lines: int = 100  # --max-dialogue-lines
    max_dialogue_chars: int = 20_000  # --max-dialogue-chars


class Ready(Struct, tag="ready", tag_field="type"):
    model: str
    sample_rate: int
    limits: Limits
    protocol: int = PROTOCOL_VERSION
    encodings: list[str] = field(default_factory=lambda: list(ENCODINGS))
    sample_rates: list[int] = field(default_factory=lambda: list(SAMPLE_RATES))


class AcceptedMsg(Struct, tag="accepted", tag_field="type"):
    id: str
    chunks: int | None  # None for a stream: its text is not known yet
    target_seconds: list[float]


class ProgressMsg(Struct, tag="progress", tag_field="type"):
    id: str
    chunk: int
    step: int
    num_steps: int
    fraction: float


class AudioHeader(Struct, tag="audio", tag_field="type", omit_defaults=True):
    id: str
    chunk: int
    final: bool
    sample_rate: int
    encoding: str
    samples: int
    packets: list[int] | None = None  # opus only: each packet's byte length, in order


class Timings(Struct):
    queue_ms: float
    first_audio_ms: float | None
    total_ms: float


class Done(Struct, tag="done", tag_field="type", omit_defaults=True):
    id: str
    chunks: int
    audio_seconds: float
    timings: Timings
    voice_id: str | None = None  # with `keep_voice`: the kept voice


class Cancelled(Struct, tag="cancelled", tag_field="type", omit_defaults=True):
    id: str
    reason: str | None = None  # when the client did not ask for it (the server cut it short)


class ErrorMsg(Struct, tag="error", tag_field="type", omit_defaults=True):
    id: str | None
    code: str
    message: str
    field: str | None = None  # the one field at fault, when there is one
    retry_after_ms: int | None = None  # `busy`: when trying again may succeed


class Pong(Struct, tag="pong", tag_field="type"):
    pass


class LineMsg(Struct, tag="line", tag_field="type"):
    """Before a dialogue line's audio: which line, who says it, what, and where its audio starts."""

    id: str
    line: int
    voice: str | None
    text: str
    offset_samples: int


class DialogueProgressMsg(ProgressMsg, tag="progress", tag_field="type"):
    """Progress of one dialogue line (`chunk`, `fraction`: within that line)."""

    line: int


class DialogueAudioHeader(AudioHeader, tag="audio", tag_field="type", kw_only=True):
    """A dialogue's audio: which line, and where its first sample sits in the dialogue's audio."""

    line: int
    offset_samples: int


ServerMessage = Ready | AcceptedMsg | ProgressMsg | Done | Cancelled | ErrorMsg | Pong | LineMsg

_encoder = msgspec.json.Encoder()


def encode(message: Struct) -> str:
    """A server message as the JSON text of one frame."""
    return _encoder.encode(message).decode()


def audio_frame(header: AudioHeader, payload: bytes) -> bytes:
    """Binary audio frame: 4-byte big-endian header length, UTF-8 JSON header, samples."""
    head = _encoder.encode(header)
    return struct.pack(">I", len(head)) + head + payload


def split_audio_frame(frame: bytes) -> tuple[dict[str, Any], bytes]:
    """Inverse of `audio_frame`: a client reads a binary frame with it."""
    (n,) = struct.unpack(">I", frame[:4])
    return msgspec.json.decode(frame[4 : 4 + n]), frame[4 + n :]
