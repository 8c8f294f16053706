"""One text stream (`stream_open` ... `stream_close`): text in as it is written, audio out in order.

A stream is a sequence of turns sharing a voice (`server.turns.turn`). Each complete segment
(`segmenter.Segmenter`) becomes a turn at once, which prepares its text (the lexicon,
`normalize_text`) while earlier segments play; turns go to the engine in segment order when
there is room (`--stream-max-segments`) and the voice is known, each told when its listener will
need it. Their audio goes out in segment order (`playback.StreamPlayback`). The voice is resolved
once, at `stream_open` (a library voice or a reference); without one, the first segment's tokens
are the voice of every later one (`server.voices.pace.chained_voice`: its speaking rate only from
enough audio). The turns share the stream's audio cap (`server.turns.audio_cap`). Everything
here runs on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from msgspec import Struct

from server.config import StreamLimits
from server.engine.types import ChunkTokens, VoicePrompt
from server.errors import ServiceError
from server.options import BY_NAME
from server.streaming.frames import StreamProgressMsg
from server.streaming.ordered import OrderedFrames
from server.streaming.pieces import Segment
from server.streaming.playback import StreamPlayback
from server.streaming.segmenter import Segmenter
from server.timestamps.clock import segment_words
from server.turns.audio_cap import AudioCap
from server.turns.events import TurnAccepted, TurnAudio, TurnEnd, TurnProgress
from server.turns.request import TurnRequest
from server.turns.service import SynthesisService
from server.turns.turn import Turn
from server.voices.pace import chained_voice
from server.voices.store import Owner
from server.wire import messages as p

log = logging.getLogger("chorus.stream")
ENDPOINT = "stream"
STOPPING = "shutdown: the server is stopping and this stream did not finish within the drain window"
# The stream cuts its text itself: each segment is one engine chunk, whatever chunk_threshold
# says (its largest value; a segment is at most a few hundred characters, far below it); but
# fast start (`first_chunk_seconds`, opt-in) may cut the first segment once more, at a clause.
NO_CHUNKING_S = float(BY_NAME["chunk_threshold"].high)
_U64 = 1 << 64


@dataclass(frozen=True)
class StreamHost:
    """What a stream gets from its connection: the service, the limits, whose it is, the prefix of
    its segments' request ids, and how it talks back."""

    service: SynthesisService
    limits: StreamLimits
    owner: Owner
    prefix: str
    send: Callable[[Struct], None]
    send_bytes: Callable[[bytes, float], None]  # an audio frame, and the seconds of audio it carries
    ended: Callable[[StreamSession], None]  # the stream sent its end; forget it


class StreamSession:
    def __init__(self, msg: p.StreamOpen, host: StreamHost):
        self.id = msg.id
        self.msg = msg
        self.host = host
        service, limits = host.service, host.limits
        self.segmenter = Segmenter()
        asked = p.generation_options(msg.options)
        self.first_chunk_seconds = asked.first_chunk_seconds  # the first segment's fast start
        self.options = replace(asked, chunk_threshold=NO_CHUNKING_S, first_chunk_seconds=None)
        self.chained = msg.voice is None and msg.reference is None
        self.meta = OrderedFrames(host.send, lambda: self.ended)  # words, in order
        self.cap = AudioCap(limits.max_audio_seconds)  # the segments' audio together
        self.voice: VoicePrompt | None = None
        self.voice_ready = False
        self.pending: deque[Segment] = deque()  # complete segments, being prepared or waiting for room
        self.segments: list[Segment] = []  # released to the engine, in order
        self.running = 0  # released and not finished
        self.playback = StreamPlayback(msg.id, msg.encoding, msg.sample_rate, service.sample_rate,
                                       self.meta.send, host.send_bytes, service.metrics.stream_late,
                                       self._segment_words)
        self.closed = False
        self.late_frame: str | None = None  # a frame after stream_close: the stream ends with its error
        self.ended = False
        self.finishing = False  # `done` waits for the frames before it
        self.kept_voice_id: str | None = None
        self.opened_at = time.perf_counter()
        self.queue_ms = 0.0
        self._taken = 0  # segments made so far (their indexes)
        self._first_audio_counted = False
        self._loop = asyncio.get_running_loop()
        self._idle = self._loop.call_later(limits.idle_seconds, self._on_idle)
        self._too_long = self._loop.call_later(limits.max_seconds, self._on_too_long)
        self._task: asyncio.Task | None = None

    # ---- client frames ------------------------------------------------------------------

    def start(self) -> None:
        """Resolve the voice (may wait on an encode), answer `accepted`, take the first text."""
        self._task = asyncio.create_task(self._start())
        if self.msg.text:
            self.append(self.msg.text)

    async def _start(self) -> None:
        ref = self.msg.reference
        try:
            self.voice = await self.host.service.voices.resolve(self.msg.voice, ref.audio if ref else None,
                                                           ref.text if ref else None, self.host.owner)
        except ServiceError as exc:
            self.host.service.reject(ENDPOINT, exc.code)
            self._end(p.ErrorMsg(self.id, exc.code, exc.message))
            return
        except Exception:  # a bug here fails this stream only
            log.exception("starting a stream failed", extra={"request_id": self.id})
            self._end(p.ErrorMsg(self.id, "internal", "the server failed to start this stream"))
            return
        if self.ended:
            return
        self.voice_ready = True
        self.host.send(p.AcceptedMsg(self.id, None, []))
        self._pump()

    def append(self, text: str) -> None:
        if self._refuse_after_close("stream_append"):
            return
        self._rearm_idle()
        if self._over_buffer(len(text)):  # before the segmenter reads any of it
            return
        self._take(self.segmenter.feed(text))
        self._pump()

    def flush(self) -> None:
        if self._refuse_after_close("stream_flush"):
            return
        self._rearm_idle()
        self._take(self.segmenter.flush())
        self._pump()

    def close(self) -> None:
        if self._refuse_after_close("stream_close"):
            return
        self.closed = True
        self._idle.cancel()
        self._take(self.segmenter.flush())
        self._pump()

    def cancel(self, reason: str | None = None) -> None:
        """`cancel`, a disconnect or shutdown: stop every segment, answer `cancelled` (with
        `reason` when the client did not ask for it)."""
        self._end(p.Cancelled(self.id, reason=reason))

    # ---- segments ---------------------------------------------------------------------------

    def _take(self, texts: list[str]) -> None:
        """Complete segments in: each a turn, its text prepared now that it is whole."""
        for text in texts:
            index = self._taken
            self._taken += 1
            options = self.options
            if options.seed is not None:
                options = replace(options, seed=(options.seed + index) % _U64)
            if index == 0 and self.first_chunk_seconds is not None:
                options = replace(options, first_chunk_seconds=self.first_chunk_seconds)
            request = TurnRequest(  # the stream's voice, resolved once, is given at release
                request_id=f"{self.host.prefix}/{self.id}/{index}", client_id=self.id, endpoint=ENDPOINT, text=text,
                owner=self.host.owner, voice=self.msg.voice, voice_at_release=True, instruct=self.msg.instruct,
                language=self.msg.language, options=options, normalize=self.msg.options.normalize_text,
                keep_voice=index == 0 and self.msg.keep_voice, progress=self.msg.progress, segment=index)
            first_tokens = self._first_tokens if index == 0 and self.chained else None
            turn = Turn(self.host.service, request, audio_cap=self.cap, on_first_tokens=first_tokens,
                        on_ready=self._pump)
            seg = Segment(index, text, turn.prepare())
            self.pending.append(seg)
            asyncio.get_running_loop().create_task(self._relay(seg))

    def _pump(self) -> None:
        """Release prepared segments in order while there is room; then see whether the stream is done."""
        while (not self.ended and self.voice_ready and self.pending
               and self.running < self.host.limits.max_segments_inflight):
            if self.chained and self.segments and self.voice is None:
                break  # later segments take the first one's tokens as their voice
            head = self.pending[0]
            if head.failure is not None:  # its text could not be prepared
                self._end(p.ErrorMsg(self.id, head.failure.code or "internal",
                                     f"segment {head.index}: {head.failure.message}", head.failure.field,
                                     head.failure.retry_after_ms))
                return
            if not head.turn.ready.is_set():
                break  # still being prepared: it pumps again when ready
            if self.segments and not self.segments[-1].turn.settled.is_set():
                break  # the one before is being planned: its length says when this one is due
            self.pending.popleft()
            head.released, head.submitted_at = True, time.perf_counter()
            self.segments.append(head)
            self.running += 1
            head.turn.release(self.voice, self._due_at(head))
        self._maybe_done()

    def _due_at(self, seg: Segment) -> float | None:
        """When playback will reach `seg` (the engine's deadline hint): the stream's first audio
        plus the audio before it (heard or planned). Before any audio, a later segment is due no
        sooner than the first segment's release plus that audio: it belongs to a turn already
        taken (the realtime admission checks only a turn's first segment, the one with no due
        time) and is not needed at once. The first segment is due now (None)."""
        if seg.index == 0:
            return None
        before = self.playback.heard_before_next(self.segments[:seg.index])
        due = self.playback.clock.due(before)
        return due if due is not None else self.segments[0].submitted_at + before

    def _first_tokens(self, event: ChunkTokens) -> None:
        """Segment 0's tokens: the voice of the rest (automatic and design modes)."""
        if self.voice is None:
            self.voice = chained_voice(event.tokens, event.text, self.host.service.frame_rate)
            self._pump()

    async def _relay(self, seg: Segment) -> None:
        """One segment's turn's events into the stream."""
        async for event in seg.turn.events():
            if self.ended:
                continue
            if isinstance(event, TurnAccepted):
                seg.planned_s = sum(event.target_seconds)
                self._pump()
            elif isinstance(event, TurnProgress):
                self.host.send(StreamProgressMsg(self.id, event.chunk, event.step, event.num_steps,
                                                   event.fraction, segment=seg.index))
            elif isinstance(event, TurnAudio):
                self.playback.audio(self.segments, seg, event)
                if seg.index == 0 and not self._first_audio_counted:
                    self._first_audio_counted = True
                    first_ms = self._first_audio_ms(time.perf_counter()) or 0.0
                    self.host.service.metrics.first_audio_of("stream_first", first_ms / 1e3)
            elif isinstance(event, TurnEnd):
                self._segment_ended(seg, event)

    def _segment_ended(self, seg: Segment, end: TurnEnd) -> None:
        if end.outcome == "done":
            self.running -= 1
            seg.finished = True
            if seg.index == 0:
                self.queue_ms, self.kept_voice_id = end.queue_ms, end.voice_id
            elif end.first_audio_ms is not None:  # a later segment: from its submission
                self.host.service.metrics.first_audio_of("stream_later", end.first_audio_ms / 1000.0)
            self.playback.advance(self.segments)
            self._pump()
        elif end.outcome == "cancelled" and not end.requested:  # the server is stopping
            self._end(p.Cancelled(self.id, reason=STOPPING))
        elif end.outcome == "error" and not seg.released:  # its text: the stream ends when it is the head
            seg.failure = end
            self._pump()
        elif end.outcome == "error":
            self._end(p.ErrorMsg(self.id, end.code or "internal", f"segment {seg.index}: {end.message}",
                                 end.field, end.retry_after_ms))

    def _over_buffer(self, arriving: int) -> bool:
        """Would `arriving` more characters take the text waiting over its limit? Then end."""
        buffered = self.segmenter.buffered + sum(len(seg.text) for seg in self.pending) + arriving
        if buffered > self.host.limits.max_buffered_chars:
            self._end(p.ErrorMsg(self.id, "stream_too_long",
                                 f"text: {buffered} characters waiting to be spoken, over the limit of "
                                 f"{self.host.limits.max_buffered_chars}; send text no faster than it is spoken",
                                 "text"))
        return buffered > self.host.limits.max_buffered_chars

    def _segment_words(self, seg: Segment, event: TurnAudio, start: int, end: int, rate: int) -> None:
        """A segment's last audio frame is out: its words, before its `segment` frame."""
        if self.msg.timestamps:
            self.meta.send(segment_words(self.host.service.aligner, self.id, self.msg.timestamps, seg.spoken,
                                         event.audio, event.sample_rate, start, end, rate, seg.index,
                                         seg.turn.as_written))

    def _first_audio_ms(self, at: float | None = None) -> float | None:
        """From the first segment's completion to the stream's first audio frame."""
        at = at if at is not None else self.playback.first_audio_at
        if at is None or not self.segments:
            return None
        return round((at - self.segments[0].submitted_at) * 1000.0, 3)

    # ---- ending -------------------------------------------------------------------------

    def _maybe_done(self) -> None:
        if (self.closed and not self.ended and not self.finishing and self.voice_ready and not self.pending
                and self.playback.head == len(self.segments) and self.segmenter.buffered == 0):
            self.finishing = True
            self._task = asyncio.create_task(self._finish())

    async def _finish(self) -> None:
        """`done` (or the late frame's error) once every frame before it is out."""
        await self.playback.drained()
        await self.meta.drained()
        if self.late_frame is not None:  # what came before stream_close was spoken; this was not
            return self._end(p.ErrorMsg(self.id, "invalid_request", f"type: {self.late_frame} after stream_close "
                                        "(the text before stream_close was spoken; this frame was not used)",
                                        "type"))
        if self.msg.keep_voice and not self.segments:
            return self._end(p.ErrorMsg(self.id, "invalid_request", "keep_voice: the stream spoke no text, so it "
                                        "has no voice to keep", "keep_voice"))
        out = self.playback
        total_ms = round((time.perf_counter() - self.opened_at) * 1000.0, 3)
        self._end(p.Done(self.id, out.frames, round(out.offset / out.out_rate, 4),
                         p.Timings(self.queue_ms, self._first_audio_ms(), total_ms), voice_id=self.kept_voice_id))

    def _refuse_after_close(self, what: str) -> bool:
        """A frame after `stream_close` is not used; the stream still speaks what it was given
        before the close, then ends with this mistake (`_finish`)."""
        if self.closed and self.late_frame is None:
            self.late_frame = what
        return self.closed or self.ended

    def _rearm_idle(self) -> None:
        self._idle.cancel()
        self._idle = self._loop.call_later(self.host.limits.idle_seconds, self._on_idle)

    def _on_idle(self) -> None:
        self._end(p.ErrorMsg(self.id, "stream_idle", f"no text for {self.host.limits.idle_seconds:g} s; "
                             "send stream_close when the text is complete"))

    def _on_too_long(self) -> None:
        self._end(p.ErrorMsg(self.id, "stream_too_long",
                             f"the stream lasted over the limit of {self.host.limits.max_seconds:g} s"))

    def _end(self, message: p.ServerMessage) -> None:
        """Exactly one end per stream: stop what still runs, send `message`, be forgotten."""
        if self.ended:
            return
        self.ended = True
        self._idle.cancel()
        self._too_long.cancel()
        for seg in [*self.segments, *self.pending]:
            if not seg.finished:
                seg.turn.cancel()
        self.pending.clear()
        self.playback.stop(self.segments)
        self.host.send(message)
        self.host.ended(self)
