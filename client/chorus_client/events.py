"""What a request or stream yields, typed: one dataclass per server frame of the protocol.

`AudioChunk.data` is the frame's payload as sent (`pcm_s16le` by default; the client never
decodes audio, so it needs no numpy). Sample positions stay in samples at the request's
`sample_rate`; the `*_seconds` properties convert. `AudioChunk.received_at` is when the
frame came off the socket, so a caller that measures latency times the network, not its own
queue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Ready:
    """The server's greeting on connect: its model, rates, encodings and limits."""

    protocol: int
    model: str
    sample_rate: int
    encodings: list[str]
    sample_rates: list[int]
    limits: dict[str, Any]


@dataclass(frozen=True)
class Accepted:
    request_id: str
    chunks: int | None
    target_seconds: list[float]


@dataclass(frozen=True)
class Progress:
    request_id: str
    chunk: int
    step: int
    num_steps: int
    fraction: float
    segment: int | None = None
    line: int | None = None  # dialogues: the line these steps are of (its `Line` came before)


@dataclass(frozen=True)
class AudioChunk:
    request_id: str
    data: bytes
    sample_rate: int
    encoding: str
    samples: int
    chunk: int = 0
    final: bool = False
    segment: int | None = None  # streams only
    offset_samples: int | None = None  # streams and dialogues: where this frame starts in their audio
    received_at: float = 0.0  # time.perf_counter() when the client read the frame off the socket
    header: dict[str, Any] = field(default_factory=dict, repr=False)
    line: int | None = None  # dialogues only: the line it speaks, -1 for the pause after a line

    @property
    def seconds(self) -> float:
        return self.samples / self.sample_rate


@dataclass(frozen=True)
class Words:
    """Word (and with `timestamps="char"`, character) timings of one chunk or segment."""

    request_id: str
    words: list[WordTiming]
    chars: list[WordTiming] | None = None
    segment: int | None = None
    source: str | None = None  # "model" or "aligned"
    line: int | None = None  # dialogues only (their timings are on the dialogue's clock)


@dataclass(frozen=True)
class Segment:
    """A stream's segment is complete: the text it spoke and where its audio sits."""

    request_id: str
    segment: int
    text: str
    offset_samples: int
    samples: int


@dataclass(frozen=True)
class Line:
    """A dialogue's line `line` begins: who says it, what, and where its audio starts in the
    dialogue's (samples at the request's rate). Its audio follows."""

    request_id: str
    line: int
    voice: str | None
    text: str
    offset_samples: int
    sample_rate: int = 24000

    @property
    def offset_seconds(self) -> float:
        return self.offset_samples / self.sample_rate


@dataclass(frozen=True)
class Done:
    request_id: str
    chunks: int
    audio_seconds: float
    timings: dict[str, float]
    voice_id: str | None = None  # with `keep_voice`: a voice later requests may use


@dataclass(frozen=True)
class Cancelled:
    request_id: str


Event = Accepted | Progress | AudioChunk | Words | Segment | Line | Done | Cancelled


@dataclass(frozen=True)
class WordTiming:
    """One word (or character) of a `Words` event, in samples at the request's rate."""

    text: str
    start_samples: int
    end_samples: int
    sample_rate: int

    @property
    def start_seconds(self) -> float:
        return self.start_samples / self.sample_rate

    @property
    def end_seconds(self) -> float:
        return self.end_samples / self.sample_rate
