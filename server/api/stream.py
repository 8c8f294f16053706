"""`GET /v1/stream`: the WebSocket protocol (docs/protocol.md), one `Connection` per socket.

A connection runs two loops: the reader parses frames and starts each request as a turn
(`server.turns.turn`, relayed to frames by a task of its own), and the writer sends frames
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
from server.api.dialogue import relay_dialogue, ws_dialogue
from server.api.outbox import Outbox
from server.audio.encoders import StreamEncoder, default_rate, encode, ws_encoder
from server.config import ServerConfig
from server.streaming.streams import ConnectionStreams
from server.turns.dialogue import Dialogue
from server.turns.events import TurnAccepted, TurnAudio, TurnEnd, TurnProgress, TurnWords
from server.turns.request import ReferenceClip, TurnRequest
from server.turns.service import SynthesisService
from server.turns.turn import Turn
from server.wire import messages as p

log = logging.getLogger("chorus.stream")
_connection_ids = itertools.count(1)
ENDPOINT = "stream"
CUT_SHORT = "shutdown: the drain window ended before the rest of this request's audio was sent"
STOPPING = "shutdown: the server is stopping and this request did not finish within the drain window"
_ENDS = (p.Done, p.Cancelled, p.ErrorMsg)


@dataclass
class _Request:
    """A client request on this connection: its turn, and how its audio goes out."""

    client_id: str
    turn: Turn | Dialogue  # a `synthesize`'s turn, or a dialogue's lines
    encoding: str
    out_rate: int  # the rate the client receives (asked for, or the encoding's default)
    audio_frames: int = 0
    relay: asyncio.Task | None = None
    encoder: StreamEncoder | None = None  # made at the first audio


class Connection:
    def __init__(self, socket: WebSocket, service: SynthesisService, cfg: ServerConfig):
        self.socket = socket
        self.service = service
        self.cfg = cfg
        self.prefix = f"c{next(_connection_ids)}"
        self.dialogue_limits = p.DialogueLimits(cfg.max_dialogue_lines, cfg.max_dialogue_chars)
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
                            max_audio_seconds=self.cfg.engine.max_audio_seconds,
                            max_dialogue_lines=self.cfg.max_dialogue_lines,
                            max_dialogue_chars=self.cfg.max_dialogue_chars),
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
            message = p.parse_client_message(text, self.cfg.max_text_chars, self.dialogue_limits)
        except p.ProtocolError as exc:
            self._refuse(exc.request_id, exc.code, exc.message, exc.field)
            return
        except Exception:  # a bug in parsing must not end the connection
            log.exception("reading a frame failed", extra={"connection": self.prefix})
            self._refuse(None, "internal", "the server failed to read this frame")
            return
        if isinstance(message, (p.Synthesize, p.StreamOpen, p.Dialogue)):
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

    def _synthesize(self, msg: p.Synthesize | p.StreamOpen | p.Dialogue) -> None:
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
        elif isinstance(msg, p.Dialogue):
            self._start_dialogue(msg)
        else:  # (its text's length was checked as the frame was read)
            self._start(msg)

    def _start(self, msg: p.Synthesize) -> None:
        """The request as a turn (`server.turns.turn`: every rule about a request is there); its
        events relayed as frames, in order, by a task of its own."""
        out_rate = msg.sample_rate or default_rate(msg.encoding, self.service.sample_rate)
        ref = msg.reference
        turn = Turn(self.service, TurnRequest(
            request_id=f"{self.prefix}/{msg.id}", client_id=msg.id, endpoint=ENDPOINT, text=msg.text, owner=self.owner,
            voice=msg.voice, reference=ReferenceClip(ref.audio, ref.text) if ref else None, instruct=msg.instruct,
            language=msg.language, options=p.generation_options(msg.options), normalize=msg.options.normalize_text,
            stream=msg.stream_mode, keep_voice=msg.keep_voice, timestamps=msg.timestamps, progress=msg.progress,
            received_at=self.frame_at, out_rate=out_rate))
        req = _Request(msg.id, turn, msg.encoding, out_rate)
        self.requests[msg.id] = req
        turn.start()
        req.relay = asyncio.create_task(self._relay(req))

    def _start_dialogue(self, msg: p.Dialogue) -> None:
        """A script as a dialogue (`server.turns.dialogue`): its lines' events relayed as frames."""
        work, out_rate = ws_dialogue(self.service, msg, self.prefix, self.owner, self.frame_at,
                                     self.cfg.engine.max_audio_seconds)
        req = _Request(msg.id, work, msg.encoding, out_rate)
        self.requests[msg.id] = req
        req.relay = asyncio.create_task(relay_dialogue(
            work, msg.id, msg.encoding, out_rate, self._send, self._send_bytes, lambda end: self._end(req, end),
            STOPPING))

    def _cancel(self, req: _Request) -> None:
        req.turn.cancel()

    # ---- frames out ---------------------------------------------------------------------

    async def _relay(self, req: _Request) -> None:
        """The turn's events as frames: `accepted`, progress, audio (encoded off the loop), words,
        and its one end."""
        try:
            async for event in req.turn.events():
                if isinstance(event, TurnAccepted):
                    self._send(p.AcceptedMsg(req.client_id, event.chunks, list(event.target_seconds)))
                elif isinstance(event, TurnProgress):
                    self._send(p.ProgressMsg(req.client_id, event.chunk, event.step, event.num_steps, event.fraction))
                elif isinstance(event, TurnAudio):
                    await self._send_audio(req, event)
                elif isinstance(event, TurnWords):
                    self._send(event.frame)
                else:
                    self._end(req, _end_frame(req, event))
        except Exception:  # a bug in relaying fails this request only
            log.exception("relaying a request failed", extra={"request_id": req.turn.request.request_id})
            req.turn.cancel()
            self._end(req, p.ErrorMsg(req.client_id, "internal", "the server failed on this request"))
        finally:
            if req.encoder is not None:
                req.encoder.close()

    async def _send_audio(self, req: _Request, event: TurnAudio) -> None:
        if req.encoder is None:
            req.encoder = ws_encoder(req.encoding, event.sample_rate, req.out_rate)
        out = await encode(req.encoder, event.audio, event.final)
        header = p.AudioHeader(req.client_id, event.chunk, event.final, req.encoder.out_rate, req.encoding,
                               out.samples, packets=out.packets)
        req.audio_frames += 1
        self._send_bytes(p.audio_frame(header, out.data), out.samples / req.encoder.out_rate)

    def _end(self, req: _Request, message: p.ServerMessage) -> None:
        if self.requests.get(req.client_id) is not req:
            return  # ended already
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


def _end_frame(req: _Request, end: TurnEnd) -> p.ServerMessage:
    if end.outcome == "done":
        timings = p.Timings(end.queue_ms, end.first_audio_ms, end.total_ms)
        return p.Done(req.client_id, req.audio_frames, end.audio_seconds, timings, voice_id=end.voice_id)
    if end.outcome == "cancelled":  # not asked for by the client: the server is stopping
        return p.Cancelled(req.client_id, reason=None if end.requested else STOPPING)
    return p.ErrorMsg(req.client_id, end.code or "internal", end.message or "the request failed", end.field,
                      end.retry_after_ms)


@websocket("/stream")
async def stream(socket: WebSocket) -> None:
    state = socket.app.state
    await Connection(socket, state.service, state.config).serve(state.connections)


async def close_all(connections: set[Connection], code: int = 1001, reason: str = "server shutting down",
                    until: float | None = None) -> None:
    """Shutdown: every open connection sends what it has queued to a client that reads it (up
    to `until`, loop time), then closes."""
    await asyncio.gather(*(c.close(code, reason, until) for c in list(connections)), return_exceptions=True)
