"""One text stream (`stream_open` ... `stream_close`): text in as it is written, audio out in order.

Each complete segment (`segmenter.Segmenter`) becomes one engine request when there is room;
its audio goes out in segment order (`playback.StreamPlayback`). A stream keeps one voice: a
library voice or reference, or else the first segment's tokens for every later one. Everything
here runs on the event loop; the engine's events arrive in chunk order per segment.
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
from server.engine.types import (
    ChunkAudio,
    ChunkTokens,
    Finished,
    Progress,
    SynthesisRequest,
    VoicePrompt,
)
from server.options import BY_NAME
from server.streaming.frames import StreamProgressMsg
from server.streaming.ordered import OrderedFrames
from server.streaming.pieces import PendingSegment, Segment
from server.streaming.playback import StreamPlayback
from server.streaming.segmenter import Segmenter
from server.timestamps.clock import segment_words
from server.turns.service import ServiceError, SynthesisService
from server.voices.kept import KeepFailed, KeptVoice
from server.voices.store import Owner
from server.wire import messages as p

log = logging.getLogger("chorus.stream")
ENDPOINT = "stream"
STOPPING = "shutdown: the server is stopping and this stream did not finish within the drain window"
# The stream cuts its text itself: each segment is one engine chunk, whatever chunk_threshold
# says (its largest value; a segment is at most a few hundred characters, far below it); but
# fast start (`first_chunk_seconds`, opt-in) may cut the first segment once more, at a clause.
NO_CHUNKING_S = float(BY_NAME["chunk_threshold"].high)
# A chained stream's first segment gives its voice to the rest; its speaking rate only when it
# has at least this much audio (a "Sure!" says little about how fast the voice speaks).
MIN_PACE_SECONDS = 2.0
_U64 = 1 << 64


@dataclass
class Outlet:
    """How a stream talks to its connection."""

    send: Callable[[Struct], None]
    send_bytes: Callable[[bytes, float], None]  # an audio frame, and the seconds of audio it carries
    ended: Callable[[StreamSession], None]  # the stream sent its end; forget it


class StreamSession:
    def __init__(self, msg: p.StreamOpen, request_prefix: str, service: SynthesisService,
                 limits: StreamLimits, outlet: Outlet, owner: Owner):
        self.id = msg.id
        self.msg = msg
        self.prefix = request_prefix
        self.service = service
        self.limits = limits
        self.outlet = outlet
        self.owner = owner
        self.segmenter = Segmenter()
        asked = p.generation_options(msg.options)
        self.first_chunk_seconds = asked.first_chunk_seconds  # the first segment's fast start
        self.options = replace(asked, chunk_threshold=NO_CHUNKING_S, first_chunk_seconds=None)
        self.chained = msg.voice is None and msg.reference is None
        self.meta = OrderedFrames(outlet.send, lambda: self.ended)  # words, segment frames: in order
        self.kept: KeptVoice | None = service.keeper(owner) if msg.keep_voice else None
        self.normalize = msg.options.normalize_text
        self.finishing = False  # `done` is waiting for the kept voice's id
        self.voice: VoicePrompt | None = None
        self.voice_ready = False
        self.pending: deque[PendingSegment] = deque()  # complete segments not yet submitted
        self.segments: list[Segment] = []
        self.running = 0  # segments submitted and not finished
        self.playback = StreamPlayback(msg.id, msg.encoding, msg.sample_rate, service.sample_rate,
                                       self.meta.send, outlet.send_bytes, service.metrics.stream_late,
                                       self._segment_words)
        self.closed = False
        self.late_frame: str | None = None  # a frame after stream_close: the stream ends with its error
        self.ended = False
        self.opened_at = time.perf_counter()
        self.queue_ms = 0.0
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
            self.voice = await self.service.resolve_voice(self.msg.voice, ref.audio if ref else None,
                                                          ref.text if ref else None, self.owner)
        except ServiceError as exc:
            self._end(p.ErrorMsg(self.id, exc.code, exc.message))
            return
        except Exception:  # a bug here fails this stream only
            log.exception("starting a stream failed", extra={"request_id": self.id})
            self._end(p.ErrorMsg(self.id, "internal", "the server failed to start this stream"))
            return
        if self.ended:
            return
        self.voice_ready = True
        self.outlet.send(p.AcceptedMsg(self.id, None, []))
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

    # ---- segments in ----------------------------------------------------------------------

    def _pump(self) -> None:
        """Submit complete segments while there is room; then see whether the stream is done."""
        while (not self.ended and self.voice_ready and self.pending
               and self.running < self.limits.max_segments_inflight):
            if self.chained and self.segments and self.voice is None:
                break  # later segments take the first one's tokens as their voice
            head = self.pending[0]
            if head.spoken is not None and not head.spoken.done():
                break  # still being normalised: `_take`'s callback pumps again
            if (failure := head.failure()) is not None:
                index = len(self.segments)
                self._end(p.ErrorMsg(self.id, failure.code, f"segment {index}: {failure.message}", failure.field))
                return
            self.pending.popleft()
            self._submit(head.text, head.spoken_text())
        self._maybe_done()

    def _take(self, texts: list[str]) -> None:
        """Complete segments in, each prepared (lexicon, `normalize_text`) now that it is whole
        (segments keep their order: the head waits for its own)."""
        for text in texts:
            spoken = asyncio.ensure_future(self.service.text.prepare(text, self.msg.language, self.normalize,
                                                                     self.msg.voice))
            self.pending.append(PendingSegment(text, spoken))
            spoken.add_done_callback(lambda _: self._pump())

    def _submit(self, text: str, spoken: str) -> None:
        """Segment `text` (as its `segment` frame will say it), synthesised as `spoken`."""
        index = len(self.segments)
        seg = Segment(index, text, f"{self.prefix}/{self.id}/{index}", spoken, submitted_at=time.perf_counter())
        options = self.options
        if options.seed is not None:
            options = replace(options, seed=(options.seed + index) % _U64)
        if index == 0 and self.first_chunk_seconds is not None:
            options = replace(options, first_chunk_seconds=self.first_chunk_seconds)
        request = SynthesisRequest(request_id=seg.request_id, text=spoken, language=self.msg.language,
                                   instruct=self.msg.instruct, voice=self.voice, options=options,
                                   due_at=self._due_at(), progress=self.msg.progress)
        on_tokens = self._first_tokens if index == 0 and (self.chained or self.kept) else None
        try:
            accepted = self.service.submit(request, lambda event: self._on_event(seg, event), ENDPOINT, on_tokens,
                                           segment=index)
        except ServiceError as exc:
            self._end(p.ErrorMsg(self.id, exc.code, f"segment {index}: {exc.message}",
                                 retry_after_ms=exc.retry_after_ms))
            return
        seg.planned_s = sum(accepted.target_seconds)
        if self._over_audio_cap(seg, self.audio_seconds() + seg.planned_s):
            return
        self.segments.append(seg)
        self.running += 1

    def audio_seconds(self) -> float:
        """The stream's audio against `--max-audio-seconds`: each finished segment's as made, a
        running one's planned length or what it has made, whichever is more."""
        return sum(seg.received_s if seg.finished else max(seg.planned_s, seg.received_s) for seg in self.segments)

    def _due_at(self) -> float | None:
        """When playback will reach the next segment (the engine's deadline hint): the stream's
        first audio plus the audio before it (heard or planned); None (now) before any audio."""
        return self.playback.clock.due(self.playback.heard_before_next(self.segments))

    def _first_tokens(self, event: ChunkTokens) -> None:
        """Segment 0's tokens: the voice of the rest (automatic and design modes) and, with
        `keep_voice`, the voice kept: one prompt, so later requests sound like this stream."""
        if self.kept is not None and event.chunk == 0:
            self.kept.keep(event.tokens, event.text)
        if self.chained and event.chunk == 0 and self.voice is None:
            paced = event.tokens.shape[-1] >= MIN_PACE_SECONDS * self.service.engines[0].frame_rate
            self.voice = VoicePrompt(tokens=event.tokens, text=event.text, rms=None,  # the text it speaks
                                     sets_pace=paced)
            self._pump()

    def _over_buffer(self, arriving: int) -> bool:
        """Would `arriving` more characters take the text waiting over its limit? Then end."""
        buffered = self.segmenter.buffered + sum(len(piece.text) for piece in self.pending) + arriving
        if buffered > self.limits.max_buffered_chars:
            self._end(p.ErrorMsg(self.id, "stream_too_long",
                                 f"text: {buffered} characters waiting to be spoken, over the limit of "
                                 f"{self.limits.max_buffered_chars}; send text no faster than it is spoken",
                                 "text"))
        return buffered > self.limits.max_buffered_chars

    def _over_audio_cap(self, seg: Segment, total: float) -> bool:
        """Would the stream's audio (`total` s, with this segment's) pass `--max-audio-seconds`
        (one cap for a stream as for a request)? Then cancel the segment and end the stream:
        checked as a segment is planned and again as each piece of its audio comes."""
        cap = self.limits.max_audio_seconds
        if cap is None or total <= cap:
            return False
        self.service.cancel(seg.request_id)
        self._end(p.ErrorMsg(self.id, "stream_too_long",
                             f"segment {seg.index}: the stream's audio would reach {total:.0f} s, over this "
                             f"server's limit of {cap:g} s for one stream (shorten the text, or raise speed "
                             "or lower duration)"))
        return True

    # ---- audio out ----------------------------------------------------------------------

    def _on_event(self, seg: Segment, event: Progress | ChunkAudio | Finished) -> None:
        if self.ended:
            return
        if isinstance(event, Progress):  # the engine sends them only when the stream asked (`progress`)
            self.outlet.send(StreamProgressMsg(self.id, event.chunk, event.step, event.num_steps,
                                               event.fraction, segment=seg.index))
        elif isinstance(event, ChunkAudio):
            seg.received_s += event.audio.shape[-1] / event.sample_rate
            if self._over_audio_cap(seg, self.audio_seconds()):
                return
            first = self.playback.first_audio_at is None
            self.playback.audio(self.segments, seg, event)
            if first and self.playback.first_audio_at is not None:
                self.service.metrics.first_audio_of("stream_first", self._first_audio_ms() / 1000.0)
        elif event.outcome == "done":
            self.running -= 1
            seg.finished = True
            if seg.index == 0:
                self.queue_ms = event.queue_ms
            elif event.first_audio_ms is not None:  # a later segment: from its submission
                self.service.metrics.first_audio_of("stream_later", event.first_audio_ms / 1000.0)
            self.playback.advance(self.segments)
            self._pump()
        elif event.outcome == "cancelled":  # not asked for by this stream: the server is stopping
            self._end(p.Cancelled(self.id, reason=STOPPING))
        else:
            self._end(p.ErrorMsg(self.id, "internal", f"segment {seg.index}: "
                                 f"{event.message or 'the engine failed on this segment'}"))

    def _segment_words(self, seg: Segment, event: ChunkAudio, start: int, end: int, rate: int) -> None:
        """A segment's last audio frame is out: its words, before its `segment` frame."""
        if self.msg.timestamps:
            self.meta.send(segment_words(self.service.aligner, self.id, self.msg.timestamps, seg.spoken,
                                         event.audio, event.sample_rate, start, end, rate, seg.index))

    def _first_audio_ms(self) -> float | None:
        """From the first segment's completion to the stream's first audio frame."""
        if self.playback.first_audio_at is None:
            return None
        return round((self.playback.first_audio_at - self.segments[0].submitted_at) * 1000.0, 3)

    def _maybe_done(self) -> None:
        if (self.closed and not self.ended and not self.finishing and self.voice_ready and not self.pending
                and self.playback.head == len(self.segments) and self.segmenter.buffered == 0):
            if self.late_frame is not None:  # what came before stream_close was spoken; this was not
                self._end(p.ErrorMsg(self.id, "invalid_request", f"type: {self.late_frame} after stream_close "
                                     "(the text before stream_close was spoken; this frame was not used)", "type"))
                return
            total_ms = round((time.perf_counter() - self.opened_at) * 1000.0, 3)
            out = self.playback
            done = p.Done(self.id, out.frames, round(out.offset / out.out_rate, 4),
                          p.Timings(self.queue_ms, self._first_audio_ms(), total_ms))
            if self.kept is None and not self.meta.waiting:
                self._end(done)
            else:  # after the frames still waiting (aligned words), with the kept voice's id
                self.finishing = True
                self._task = asyncio.create_task(self._end_keeping(done))

    async def _end_keeping(self, done: p.Done) -> None:
        """`done` with the kept voice's id (its write started with segment 0's tokens)."""
        await self.meta.drained()
        if self.kept is None:
            return self._end(done)
        try:
            if not self.kept.started:
                raise KeepFailed("keep_voice: the stream spoke no text, so it has no voice to keep")
            done.voice_id = await self.kept.voice_id()
        except KeepFailed as exc:
            code = "internal" if self.kept.started else "invalid_request"
            self._end(p.ErrorMsg(self.id, code, str(exc), "keep_voice"))
            return
        self._end(done)

    # ---- ending -------------------------------------------------------------------------

    def _refuse_after_close(self, what: str) -> bool:
        """A frame after `stream_close` is not used; the stream still speaks what it was given
        before the close, then ends with this mistake (`_maybe_done`)."""
        if self.closed and self.late_frame is None:
            self.late_frame = what
            self._maybe_done()
        return self.closed or self.ended

    def _rearm_idle(self) -> None:
        self._idle.cancel()
        self._idle = self._loop.call_later(self.limits.idle_seconds, self._on_idle)

    def _on_idle(self) -> None:
        self._end(p.ErrorMsg(self.id, "stream_idle", f"no text for {self.limits.idle_seconds:g} s; "
                             "send stream_close when the text is complete"))

    def _on_too_long(self) -> None:
        self._end(p.ErrorMsg(self.id, "stream_too_long",
                             f"the stream lasted over the limit of {self.limits.max_seconds:g} s"))

    def _end(self, message: p.ServerMessage) -> None:
        """Exactly one end per stream: stop what still runs, send `message`, be forgotten."""
        if self.ended:
            return
        self.ended = True
        self._idle.cancel()
        self._too_long.cancel()
        for seg in self.segments:
            if not seg.finished:
                self.service.cancel(seg.request_id)
                if seg.encoder is not None:
                    seg.encoder.close()
        for piece in self.pending:
            if piece.spoken is not None:
                piece.spoken.cancel()
        self.pending.clear()
        self.outlet.send(message)
        self.outlet.ended(self)
