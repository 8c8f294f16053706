"""A text stream's segments on their way through it: complete and waiting their turn
(`PendingSegment`), then submitted, their audio sent in order (`Segment`)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from server.encoders import StreamEncoder
from server.engine.types import ChunkAudio

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
    finished: bool = False
    encoder: StreamEncoder | None = None  # one per segment: each ends with its last chunk
    held: list[ChunkAudio] = field(default_factory=list)  # audio waiting for earlier segments


@dataclass
class PendingSegment:
    """A complete segment waiting its turn; `spoken`: its text as it will be spoken (lexicon,
    normalisation), being made."""

    text: str
    spoken: asyncio.Future[str] | None = None

    def spoken_text(self, stream_id: str) -> str:
        """Its text as prepared (once `spoken` is done), or as written if preparing it failed."""
        if self.spoken is None:
            return self.text
        if (failure := self.spoken.exception()) is not None:  # e.g. the lexicon could not be read
            log.error("preparing a segment's text failed: %r; spoken as written", failure,
                      extra={"request_id": stream_id})
            return self.text
        return self.spoken.result()
