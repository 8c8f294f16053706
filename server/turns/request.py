"""A turn as a door receives it: the request in one spelling, before its voice and text are
resolved. The WebSocket's `synthesize`, the HTTP speech body and each segment of a text stream
all become one of these (`server.api`, `server.streaming`), so every rule about a request is
applied once, by the turn (`server.turns.turn`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from server.engine.types import GenerationOptions, StreamMode, VoicePrompt
from server.timestamps.frames import TimestampKind
from server.voices.store import Owner


@dataclass(frozen=True)
class ReferenceClip:
    """A one-shot reference: a base64 audio file as sent, and its transcript."""

    audio: str
    text: str | None = None


@dataclass(frozen=True)
class TurnRequest:
    request_id: str  # unique in the engine
    client_id: str  # what the client calls it (the WebSocket's id; HTTP's request id)
    endpoint: str  # the door, for /metrics: "stream" or "speech"
    text: str
    owner: Owner  # whose kept voices it may use, and who keeps one it makes
    voice: str | None = None  # a built-in name, a library id or display name
    reference: ReferenceClip | None = None
    prompt: VoicePrompt | None = None  # a voice already resolved, instead of `voice`/`reference`
    voice_at_release: bool = False  # the door gives the voice at `release` (a stream's): `voice` only names it
    instruct: str | None = None
    language: str | None = None
    options: GenerationOptions = field(default_factory=GenerationOptions)
    normalize: bool | str = False  # `normalize_text`: true, "reference" or false
    stream: StreamMode = "chunk"
    keep_voice: bool = False
    timestamps: TimestampKind | None = None
    progress: bool = True
    received_at: float | None = None  # perf_counter when the door received it
    segment: int | None = None  # a text stream's segment index (the stream counts its first audio)
    out_rate: int | None = None  # the rate of the audio the client receives (the words' clock); None: the engine's
    text_field: str = "text"  # how the door spells the text's field in errors (`input` on HTTP)
