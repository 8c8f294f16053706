"""`GET /v1/stream`: the WebSocket protocol (docs/protocol.md), one `Connection` per socket.

A connection runs two loops: the reader parses frames and starts requests (each in its
own task, since resolving a voice may wait on an encode), and the writer sends frames
from one outbox, so replies and engine events never interleave mid-frame and `accepted`
always precedes a request's first event. A bad frame is answered with an `error` and
nothing else changes; a disconnect cancels the connection's requests. A connection with
nothing in flight that sends no frame for `--idle-timeout` seconds is closed (1000); on
shutdown, once its requests have ended, it is closed with 1001. A client that does not read
what it is sent is given up after `--send-timeout` (`outbox.py`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass

from litestar import WebSocket, websocket

from server.api.auth import HOST_REFUSED, host_allowed, is_authorized, origin_allowed, owner_of
from server.api.outbox import Outbox
from server.audio.encoders import StreamEncoder, default_rate, ws_encoder
from server.config import ServerConfig
from server.engine.types import Accepted, ChunkAudio, Finished, Progress, SynthesisRequest
from server.streaming.streams import ConnectionStreams
from server.timestamps.clock import WordClock
from server.turns.service import ServiceError, SynthesisService
from server.voices.kept import KeepFailed, KeptVoice
from server.wire import messages as p

log = logging.getLogger("chorus.stream")
_connection_ids = itertools.count(1)
ENDPOINT = "stream"
CUT_SHORT = "shutdown: the drain window ended before the rest of this request's audio was sent"
STOPPING = "shutdown: the server is stopping and this request did not finish within the drain window"
_ENDS = (p.Done, p.Cancelled, p.ErrorMsg)


@dataclass
class _Request:
    """A client request on this connection, from its frame to its last reply."""

    client_id: str
    request_id: str  # engine-wide: connection prefix + client id
    encoding: str
    progress: bool
    accepted: Accepted | None = None
    cancel_requested: bool = False
    audio_frames: int = 0
    task: asyncio.Task | None = None
    received_at: float | None = None  # perf_counter when its frame arrived: the engine's clock starts there
    sample_rate: int | None = None  # asked for; None: the encoding's default
    encoder: StreamEncoder | None = None  # made at the first audio (the engine's rate is known then)
    kept: KeptVoice | None = None  # `keep_voice`: its ticket
    words: WordClock | None = None  # `timestamps`: each chunk's words on the audio's clock
    whole: bool = False  # `stream: "whole"`: one audio frame, one words frame
    words_sent: asyncio.Task | None = None  # the aligned words frames, sent in chunk order


class Connection:
    def __init__(self, socket: WebSocket, service: SynthesisService, cfg: ServerConfig):
        self.socket = socket
        self.service = service
        self.cfg = cfg
        self.prefix = f"c{next(_connection_ids)}"
        self.requests: dict[str, _Request] = {}
        self.outbox = Outbox(socket, cfg.max_outbox_bytes, cfg.send_timeout, self._give_up)
        self.open = True
        self.last_activity = time.monotonic()
        self.frame_at = time.perf_counter()  # when the frame being handled arrived
        self.owner = owner_of(socket, cfg.api_keys)  # whose kept voices this connection may use
        self.streams = ConnectionStreams(service, cfg.stream, self.prefix, self.owner, send=self._send,
                                         send_bytes=self._send_bytes, refuse=self._refuse)

    # ---- lifecycle ----------------------------------------------------------------------

    async def serve(self, registry: set[Connection]) -> None:
        await self.socket.accept()
        if not host_allowed(self.socket, self.cfg.served_hosts):
            await self._refuse_connection(HOST_REFUSED)
            return
        if not origin_allowed(self.socket, self.cfg.allowed_origins):
            await self._refuse_connection("this page's origin may not use this server (see --allowed-origins)")
            return
        if not is_authorized(self.socket, self.cfg.api_keys):
            await self._refuse_connection("a valid API key is required")
            return
        log.info("connected", extra={"connection": self.prefix})
        registry.add(self)
        self._send(p.Ready(
            model=self.service.model_name,
            sample_rate=self.service.sample_rate,
            limits=p.Limits(self.cfg.max_text_chars, self.cfg.max_inflight_per_connection,
                            max_audio_seconds=self.cfg.engine.max_audio_seconds),
        ))
        writer = asyncio.create_task(self.outbox.run())
        watchdog = asyncio.create_task(self._watch_idle()) if self.cfg.idle_timeout > 0 else None
        try:
            await self._read()
        finally:
            registry.discard(self)
            self.open = False
            for req in list(self.requests.values()):
                self._cancel(req)
            self.streams.cancel_all()
            self.outbox.stop()
            writer.cancel()
            if watchdog is not None:
                watchdog.cancel()
            log.info("disconnected", extra={"connection": self.prefix, "cancelled": len(self.requests) or None})

    async def _refuse_connection(self, message: str) -> None:
        self.service.reject(ENDPOINT, "unauthorized")
        await self.socket.send_text(p.encode(p.ErrorMsg(None, "unauthorized", message)))
        await self.socket.close(code=1008, reason="unauthorized")

    async def _watch_idle(self) -> None:
        """Close the socket once it has had nothing in flight and sent no frame for the
        idle timeout (a `ping` is a frame: clients keep a quiet connection with it)."""
        timeout = self.cfg.idle_timeout
        while self.open:
            busy = bool(self.requests or self.streams)
            if busy:
                self.last_activity = time.monotonic()
            left = self.last_activity + timeout - time.monotonic()
            if left <= 0 and not busy:
                log.info("closing an idle connection", extra={"connection": self.prefix})
                await self.close(1000, "idle timeout")
                return
            await asyncio.sleep(max(left, 0.05) if not busy else min(timeout, 1.0))

    async def close(self, code: int, reason: str, until: float | None = None) -> None:
        """Send what is queued while the client reads it (up to `until`, loop time; at least a
        few seconds), then close the socket (time-bounded). A request whose end could not be
        sent by then ends with `cancelled` and a reason instead."""
        self.streams.cancel_all(STOPPING if code == 1001 else None)  # a stream ends before the close
        await self.outbox.close(code, reason, until=until, cut_short=self._cut_short)
        self.open = False

    @staticmethod
    def _cut_short(client_id: str) -> str:
        return p.encode(p.Cancelled(client_id, reason=CUT_SHORT))

    def _give_up(self) -> None:
        """The client has not read its frames for `--send-timeout`: cancel its requests, close."""
        log.warning("closing a connection that does not read what it is sent",
                    extra={"connection": self.prefix, "queued_bytes": self.outbox.queued_bytes})
        self.open = False
        for req in list(self.requests.values()):
            self._cancel(req)
        self.streams.cancel_all()
        self._closing = asyncio.get_running_loop().create_task(self.outbox.close(1008, "not reading", flush=False))

    async def _read(self) -> None:
        while True:
            event = await self.socket.receive()
            if event["type"] != "websocket.receive":
                return  # websocket.disconnect (closed, dropped, or a frame over the size limit)
            self.last_activity = time.monotonic()
            self.frame_at = time.perf_counter()
            text = event.get("text")
            if text is None:
                self._error(None, "bad_message", "binary frames are not accepted; send JSON text frames")
                continue
            self._handle(text)

    # ---- frames in ----------------------------------------------------------------------

    def _handle(self, text: str) -> None:
        try:
            message = p.parse_client_message(text, self.cfg.max_text_chars)
        except p.ProtocolError as exc:
            self._refuse(exc.request_id, exc.code, exc.message, exc.field)
            return
        except Exception:  # a bug in parsing must not end the connection
            log.exception("reading a frame failed", extra={"connection": self.prefix})
            self._refuse(None, "internal", "the server failed to read this frame")
            return
        if isinstance(message, (p.Synthesize, p.StreamOpen)):
            self._synthesize(message)
        elif isinstance(message, (p.StreamAppend, p.StreamFlush, p.StreamClose)):
            self.streams.handle(message)
        elif isinstance(message, p.Cancel):
            if (req := self.requests.get(message.id)) is not None:
                self._cancel(req)
            self.streams.cancel(message.id)
            # an id not in flight (unknown, or already ended) is ignored: its end was already sent
        else:
            self._send(p.Pong())

    def _synthesize(self, msg: p.Synthesize | p.StreamOpen) -> None:
        inflight = len(self.requests) + len(self.streams)
        if msg.id in self.requests or msg.id in self.streams:
            self._refuse(msg.id, "duplicate_id", f"id: {msg.id!r} is already in flight on this connection", "id")
        elif inflight >= self.cfg.max_inflight_per_connection:
            self._refuse(msg.id, "too_many_requests",
                         f"this connection already has {inflight} requests in flight "
                         f"(limit {self.cfg.max_inflight_per_connection})")
        elif self.outbox.backed_up:
            self._refuse(msg.id, "busy", f"this connection has {self.outbox.queued_bytes} bytes of frames it has "
                         f"not read (limit {self.cfg.max_outbox_bytes}); read them first")
        elif isinstance(msg, p.StreamOpen):
            self.streams.start(msg)
        else:  # (its text's length was checked as the frame was read)
            req = _Request(msg.id, f"{self.prefix}/{msg.id}", msg.encoding, msg.progress, received_at=self.frame_at,
                           sample_rate=msg.sample_rate)
            self.requests[msg.id] = req
            req.task = asyncio.create_task(self._start(req, msg))

    async def _start(self, req: _Request, msg: p.Synthesize) -> None:
        """Resolve the voice, prepare the text, submit. A `cancel` (or a disconnect) meanwhile
        cancels this task: whatever it waits on stops with it (`server.bounds`)."""
        try:
            ref = msg.reference
            voice = await self.service.resolve_voice(msg.voice, ref.audio if ref else None, ref.text if ref else None,
                                                     self.owner)
            text = await self.service.text.prepare(msg.text, msg.language, msg.options.normalize_text, msg.voice)
            if req.cancel_requested or not self.open:
                self._end(req, p.Cancelled(req.client_id))
                return
            request = SynthesisRequest(
                request_id=req.request_id, text=text, language=msg.language, instruct=msg.instruct,
                voice=voice, stream=msg.stream_mode, received_at=req.received_at,
                options=p.generation_options(msg.options), progress=req.progress,
            )
            req.kept = self.service.keeper(self.owner) if msg.keep_voice else None
            req.words = WordClock(req.client_id, msg.timestamps) if msg.timestamps else None
            req.whole = msg.stream_mode == "whole"
            hooks = [hook.on_tokens for hook in (req.kept, req.words) if hook is not None]
            req.accepted = self.service.submit(request, lambda event: self._deliver(req, event), ENDPOINT,
                                               (lambda event: [hook(event) for hook in hooks]) if hooks else None)
        except ServiceError as exc:
            self._end(req, p.ErrorMsg(req.client_id, exc.code, exc.message, exc.field, exc.retry_after_ms))
            return
        except asyncio.CancelledError:  # `cancel` or a disconnect before the engine had it
            self._end(req, p.Cancelled(req.client_id))
            return
        except Exception:  # a bug here fails this request only
            log.exception("starting a request failed", extra={"request_id": req.request_id})
            self._end(req, p.ErrorMsg(req.client_id, "internal", "the server failed to start this request"))
            return
        self._send(p.AcceptedMsg(req.client_id, req.accepted.chunks, list(req.accepted.target_seconds)))

    def _cancel(self, req: _Request) -> None:
        req.cancel_requested = True
        if req.accepted is not None:
            self.service.cancel(req.request_id)
        elif req.task is not None and not req.task.done():
            req.task.cancel()  # still resolving its voice or preparing its text: stop that now

    # ---- frames out ---------------------------------------------------------------------

    def _deliver(self, req: _Request, event: Progress | ChunkAudio | Finished) -> None:
        """The service's ordered events for `req` -> frames (on the event loop)."""
        if isinstance(event, Progress):  # the engine sends them only when the request asked (`progress`)
            self._send(p.ProgressMsg(req.client_id, event.chunk, event.step, event.num_steps, event.fraction))
        elif isinstance(event, ChunkAudio):
            if req.encoder is None:
                rate = req.sample_rate or default_rate(req.encoding, event.sample_rate)
                req.encoder = ws_encoder(req.encoding, event.sample_rate, rate)
            out = req.encoder.push(event.audio, last=event.final)
            header = p.AudioHeader(req.client_id, event.chunk, event.final, req.encoder.out_rate, req.encoding,
                                   out.samples, packets=out.packets)
            req.audio_frames += 1
            self._send_bytes(p.audio_frame(header, out.data), out.samples / req.encoder.out_rate)
            if req.words is not None:  # after the chunk's audio: its words, on the same clock
                text = req.words.whole_text() if req.whole else req.words.texts.get(event.chunk, "")
                if self.service.aligner is None:
                    self._send(req.words.frame(text, event.audio.shape[-1], event.sample_rate, req.encoder.out_rate))
                else:  # off the step loop and off this one: the next chunk's audio does not wait
                    aligned = req.words.aligned_frame(self.service.aligner, text, event.audio, event.sample_rate,
                                                      req.encoder.out_rate)
                    req.words_sent = asyncio.create_task(self._send_in_turn(req, req.words_sent, aligned))
        elif event.outcome == "done":
            timings = p.Timings(event.queue_ms, event.first_audio_ms, event.total_ms)
            done = p.Done(req.client_id, req.audio_frames, event.audio_seconds, timings)
            if req.kept is None and req.words_sent is None:
                self._end(req, done)
            else:  # after the words still being aligned; with the kept voice's id
                req.task = asyncio.create_task(self._end_keeping(req, done))
        elif event.outcome == "cancelled":
            # not asked for by the client: the server is stopping (or gave up on the connection)
            self._end(req, p.Cancelled(req.client_id, reason=None if req.cancel_requested else STOPPING))
        else:
            self._end(req, p.ErrorMsg(req.client_id, "internal", event.message or "the engine failed on this request"))

    async def _send_in_turn(self, req: _Request, previous: asyncio.Task | None, frame) -> None:
        if previous is not None:
            await previous
        words = await frame
        if self.requests.get(req.client_id) is req:  # not after the request's end
            self._send(words)

    async def _end_keeping(self, req: _Request, done: p.Done) -> None:
        if req.words_sent is not None:
            await req.words_sent
        if req.kept is None:
            self._end(req, done)
            return
        try:
            done.voice_id = await req.kept.voice_id()
        except KeepFailed as exc:
            self._end(req, p.ErrorMsg(req.client_id, "internal", str(exc), "keep_voice"))
            return
        self._end(req, done)

    def _end(self, req: _Request, message: p.ServerMessage) -> None:
        if self.requests.get(req.client_id) is req:
            del self.requests[req.client_id]
        self.last_activity = time.monotonic()
        self._send(message)

    def _refuse(self, request_id: str | None, code: str, message: str, field: str | None = None) -> None:
        self.service.reject(ENDPOINT, code)
        self._error(request_id, code, message, field)

    def _error(self, request_id: str | None, code: str, message: str, field: str | None = None) -> None:
        self._send(p.ErrorMsg(request_id, code, message, field))

    def _send(self, message: p.ServerMessage) -> None:
        if self.open:
            ends = message.id if isinstance(message, _ENDS) else None
            self.outbox.put(p.encode(message), ends=ends)

    def _send_bytes(self, frame: bytes, audio_seconds: float) -> None:
        if self.open:
            self.outbox.put(frame, audio_seconds)


@websocket("/stream")
async def stream(socket: WebSocket) -> None:
    state = socket.app.state
    await Connection(socket, state.service, state.config).serve(state.connections)


async def close_all(connections: set[Connection], code: int = 1001, reason: str = "server shutting down",
                    until: float | None = None) -> None:
    """Shutdown: every open connection sends what it has queued to a client that reads it (up
    to `until`, loop time), then closes."""
    await asyncio.gather(*(c.close(code, reason, until) for c in list(connections)), return_exceptions=True)
