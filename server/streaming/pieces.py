"""A text stream's segments: each complete piece of text as a turn (`server.turns.turn`), being
prepared, then released to the engine in order, its audio placed in the stream."""

from __future__ import annotations

from dataclasses import dataclass, field

from server.audio.encoders import StreamEncoder
from server.turns.events import TurnAudio, TurnEnd
from server.turns.turn import Turn


@dataclass
class Segment:
    """One segment: where its audio sits in the stream, and what waits."""

    index: int
    text: str  # as written (its `segment` frame says it so)
    turn: Turn
    submitted_at: float = 0.0  # perf_counter when released to the engine
    released: bool = False
    failure: TurnEnd | None = None  # it ended in error before it was released
    offset: int = 0  # where its audio starts in the stream (samples), set when it is the head
    samples: int = 0
    planned_s: float = 0.0  # the engine's estimate of its audio, until the audio is known
    finished: bool = False
    encoder: StreamEncoder | None = None  # one per segment: each ends with its last chunk
    held: list[TurnAudio] = field(default_factory=list)  # audio waiting for earlier segments

    @property
    def request_id(self) -> str:
        return self.turn.request.request_id

    @property
    def spoken(self) -> str:
        """The text as synthesised (lexicon, normalisation): its words' timings."""
        return self.turn.spoken or self.text
