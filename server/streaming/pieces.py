"""A text stream's segments on their way through it: complete and waiting their turn
(`PendingSegment`), then submitted, their audio sent in order (`Segment`)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from server.audio.encoders import StreamEncoder
from server.engine.types import ChunkAudio
from server.errors import ServiceError

log = logging.getLogger("chorus.stream")


@dataclass
class Segment:
    """A segment submitted to the engine: where its audio sits in the stream, and what waits."""

    index: int
    text: str
    request_id: str
    spoken: str = ""  # the text as synthesised (lexicon, normalisation): its words' timings
    submitted_at: float = 0.0
    offset: int = 0  # where its audio starts in the stream (samples), set when it is the head
    samples: int = 0
    planned_s: float = 0.0  # the engine's estimate of its audio, until the audio is known
    received_s: float = 0.0  # audio the engine has made of it so far (seconds)
    finished: bool = False
    encoder: StreamEncoder | None = None  # one per segment: each ends with its last chunk
    held: list[ChunkAudio] = field(default_factory=list)  # audio waiting for earlier segments


@dataclass
class PendingSegment:
    """A complete segment waiting its turn; `spoken`: its text as it will be spoken (lexicon,
    normalisation), being made."""

    text: str
    spoken: asyncio.Future[str] | None = None

    def failure(self) -> ServiceError | None:
        """Why its text could not be prepared (once `spoken` is done): the stream ends with it."""
        if self.spoken is None or self.spoken.cancelled() or (exc := self.spoken.exception()) is None:
            return None
        if isinstance(exc, ServiceError):
            return exc
        log.error("preparing a segment's text failed: %r", exc)
        return ServiceError("internal", "the server failed to prepare this segment's text")

    def spoken_text(self) -> str:
        """Its text as prepared (once `spoken` is done and did not fail)."""
        return self.text if self.spoken is None else self.spoken.result()
