"""A stream's audio out: frames in segment order, each placed in the stream, encoded off the
event loop and sent by one task, and the listener's playback clock.

Segments' audio goes out back to back in segment order (a later segment's audio waits for the
head's); each frame says its segment and `offset_samples`. The clock starts with the stream's
first audio frame, as a player does: a frame sent after its offset is due on that clock is an
underrun (the player runs dry), counted with its lateness, and the clock then waits for it (a
player resumes where it stalled), so one late segment counts once, not again for every frame
after it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from msgspec import Struct

from server.audio.encoders import default_rate, encode, ws_encoder
from server.streaming.frames import SegmentMsg, StreamAudioHeader
from server.streaming.pieces import Segment
from server.turns.events import TurnAudio
from server.wire import messages as p

log = logging.getLogger("chorus.stream")


@dataclass
class PlaybackClock:
    """When each sample of the stream is due at the listener: its first frame starts the clock."""

    started_at: float | None = None  # perf_counter() of playback's start, moved on by each stall
    underruns: int = 0
    late_seconds: float = 0.0

    def due(self, offset_s: float) -> float | None:
        return None if self.started_at is None else self.started_at + offset_s

    def sent(self, offset_s: float, now: float) -> float:
        """A frame whose first sample sits `offset_s` into the stream went out at `now`:
        how late it is (0.0 when on time); a late one stalls the clock by that much."""
        if self.started_at is None:
            self.started_at = now - offset_s
            return 0.0
        late = now - (self.started_at + offset_s)
        if late <= 0:
            return 0.0
        self.underruns += 1
        self.late_seconds += late
        self.started_at += late
        return late


class StreamPlayback:
    """Audio frames (encoded off the event loop) and `segment` frames, in stream order, sent by
    one task of the stream's: each segment's audio back to back, its `segment` frame after its
    last audio frame."""

    def __init__(self, stream_id: str, encoding: str, sample_rate: int | None, out_rate: int,
                 send: Callable[[Struct], None], send_bytes: Callable[[bytes, float], None],
                 on_late: Callable[[float], None],
                 on_segment_end: Callable[[Segment, TurnAudio, int, int, int], None] | None = None):
        self.id = stream_id
        self.encoding = encoding
        self.sample_rate = sample_rate  # asked by the client (None: the encoding's default)
        self.out_rate = out_rate  # of the audio sent (the encoder's output rate)
        self._send = send
        self._send_bytes = send_bytes
        self._on_late = on_late
        self._on_segment_end = on_segment_end  # (segment, its last chunk, start, end, rate): its words
        self.clock = PlaybackClock()
        self.head = 0  # the segment whose audio is being sent
        self.offset = 0  # samples sent so far
        self.frames = 0
        self.first_audio_at: float | None = None  # perf_counter() of the stream's first audio frame
        self._out: asyncio.Queue[tuple[Segment, TurnAudio | None]] = asyncio.Queue()
        self._sender = asyncio.get_running_loop().create_task(self._send_in_order())

    def audio(self, segments: list[Segment], seg: Segment, event: TurnAudio) -> None:
        """A chunk of `seg`'s audio: sent next if `seg` is the head, else held."""
        if seg.index == self.head:
            self._out.put_nowait((seg, event))
        else:
            seg.held.append(event)

    def heard_before_next(self, segments: list[Segment]) -> float:
        """Seconds of audio before the next segment: heard, or planned for those still running."""
        return sum(s.samples / self.out_rate if s.finished else s.planned_s for s in segments)

    def advance(self, segments: list[Segment]) -> None:
        """Close finished head segments (their `segment` frame after their audio), release the
        next one's audio."""
        while self.head < len(segments) and segments[self.head].finished:
            self._out.put_nowait((segments[self.head], None))
            self.head += 1
            if self.head < len(segments):
                nxt = segments[self.head]
                for event in nxt.held:
                    self._out.put_nowait((nxt, event))
                nxt.held.clear()

    async def drained(self) -> None:
        """Every frame handed over so far is sent."""
        await self._out.join()

    def stop(self, segments: list[Segment]) -> None:
        """The stream ended: send nothing more; let go of the segments' encoders (one whose push
        is on a worker thread lets go as that push ends)."""
        self._sender.cancel()
        for seg in segments:
            if seg.encoder is not None:
                seg.encoder.close()

    async def _send_in_order(self) -> None:
        while True:
            seg, event = await self._out.get()
            try:
                if event is None:
                    self._send(SegmentMsg(self.id, seg.index, seg.text, self.offset - seg.samples, seg.samples))
                else:
                    await self._send_audio(seg, event)
            except Exception:  # a bug in one frame loses that frame, not the stream's order
                log.exception("a stream frame could not be sent", extra={"request_id": self.id})
            finally:
                self._out.task_done()

    async def _send_audio(self, seg: Segment, event: TurnAudio) -> None:
        if seg.encoder is None:
            rate = self.sample_rate or default_rate(self.encoding, event.sample_rate)
            seg.encoder = ws_encoder(self.encoding, event.sample_rate, rate)
        out = await encode(seg.encoder, event.audio, event.final)
        now = time.perf_counter()
        if self.first_audio_at is None:
            self.first_audio_at = now
        self.out_rate = seg.encoder.out_rate
        samples = out.samples
        header = StreamAudioHeader(self.id, event.chunk, event.final, seg.encoder.out_rate, self.encoding,
                                   samples, packets=out.packets, segment=seg.index, offset_samples=self.offset)
        self._send_bytes(p.audio_frame(header, out.data), samples / seg.encoder.out_rate)
        if samples:
            late = self.clock.sent(self.offset / self.out_rate, now)
            if late > 0:
                self._on_late(late)
        self.offset += samples
        seg.samples += samples
        self.frames += 1
        if event.final and self._on_segment_end is not None:
            self._on_segment_end(seg, event, self.offset - seg.samples, self.offset, self.out_rate)
