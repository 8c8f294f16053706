"""One WebSocket to the server, shared by every request and stream of a client.

A reader task routes each frame to its request's route by id, so any number of requests
and streams run on one connection at once. Every frame is checked before it is routed: a
malformed frame ends only the request it names (cancelled on the server), and only a frame
that names no request, so that nobody can tell whose it was, ends the connection. When the
socket closes, every request still in flight gets a `ConnectionLostError`; the client opens
a new connection on its next call.

What a server can make the client hold is bounded (`Bounds`): one frame, and the events of
one request that its caller has not read yet.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode

from .errors import (
    BufferFullError,
    ChorusError,
    ConnectionLostError,
    HandshakeError,
    ProtocolError,
    RequestTimeoutError,
    error_from,
)
from .events import AudioChunk, Cancelled, Done, Event, Ready
from .wire import decode_frame, dumps, parse_audio, parse_event, parse_ready

log = logging.getLogger("chorus_client")

Item = Event | ChorusError

MiB = 1024 * 1024


@dataclass(frozen=True)
class Bounds:
    """How much a server can make this client hold, and how long it can make it wait.

    `max_frame_bytes` holds the largest frame a server with default limits sends (a `stream:
    "whole"` request's one frame: 1800 s of 24 kHz `f32le`); a larger frame closes the
    connection (1009). `max_buffered_bytes` caps the unread events of one request
    (a request over it ends with `BufferFullError`). `request_idle_timeout` is how long a
    request (or a ping) may go without a frame of its own, either way, while its caller
    waits (None: forever). `open_timeout` covers connecting and the `ready` greeting."""

    max_frame_bytes: int = 192 * MiB
    max_buffered_bytes: int = 256 * MiB
    request_idle_timeout: float | None = 60.0
    open_timeout: float = 10.0

    def __post_init__(self) -> None:
        for name in ("max_frame_bytes", "max_buffered_bytes", "open_timeout", "request_idle_timeout"):
            value = getattr(self, name)
            if not (value is None and name == "request_idle_timeout") and not value > 0:
                raise ValueError(f"{name} must be positive, not {value!r}")


class Route:
    """One request's events in arrival order until its caller reads them, counted in the
    bytes of the frames they came in, so that a caller who does not read cannot make the
    client hold more than `limit` (or one frame, when that is larger); and when a frame of
    the request last went either way, for its idle timeout."""

    def __init__(self, request_id: str, sample_rate: int, limit: int):
        self.request_id = request_id
        self.sample_rate = sample_rate
        self.limit = limit
        self.buffered_bytes = 0
        self.ended = False  # its last event (done, cancelled or an error) is queued: nothing more comes
        self.cancelled = False  # a cancel was sent: its audio still on the wire is dropped on arrival
        self.last_frame_at = time.monotonic()
        self._items: collections.deque[tuple[Item, int]] = collections.deque()
        self._arrived = asyncio.Event()

    def touch(self) -> None:
        """A frame of this request went or came now: its idle timeout starts again."""
        self.last_frame_at = time.monotonic()

    def put(self, item: Item, size: int) -> bool:
        """Queue an event; False (nothing queued) when it would pass the limit."""
        if self.ended:
            return True
        self.touch()
        if self.buffered_bytes and self.buffered_bytes + size > self.limit:
            return False
        self._queue(item, size)
        if isinstance(item, (Done, Cancelled, ChorusError)):
            self.ended = True
        return True

    def end(self, error: ChorusError, *, drop_unread: bool = False) -> None:
        """End the request with `error`, after its unread events or instead of them."""
        if self.ended:
            return
        if drop_unread:
            self._items.clear()
            self.buffered_bytes = 0
        self._queue(error, 0)
        self.ended = True

    def has_events(self) -> bool:
        return bool(self._items)

    def take(self) -> Item:
        item, size = self._items.popleft()
        self.buffered_bytes -= size
        return item

    async def wait(self, deadline: float | None) -> bool:
        """Wait for an event until `deadline` (`time.monotonic()`); False if none came."""
        while not self._items:
            self._arrived.clear()
            try:
                if deadline is None:
                    await self._arrived.wait()
                else:
                    async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                        await self._arrived.wait()
            except TimeoutError:
                return bool(self._items)
        return True

    def _queue(self, item: Item, size: int) -> None:
        self._items.append((item, size))
        self.buffered_bytes += size
        self._arrived.set()


class Connection:
    def __init__(self, ws: ClientConnection, ready: Ready, bounds: Bounds):
        self.ws = ws
        self.ready = ready
        self.bounds = bounds
        self.routes: dict[str, Route] = {}
        self.closed = False
        self.close_reason = ""
        self._failure: str | None = None  # why this client closed the connection, when it did
        # one waiter per ping sent, in order; a waiter whose caller gave up stays until its pong
        # comes, so that late pong is matched to it and dropped, not to a later ping
        self._pongs: collections.deque[asyncio.Future[None]] = collections.deque()
        self._chores: set[asyncio.Task[None]] = set()
        self._reader = asyncio.create_task(self._read(), name="chorus-client-reader")

    @classmethod
    async def open(cls, url: str, headers: dict[str, str], bounds: Bounds) -> Connection:
        """Connect and read the `ready` greeting, both within `open_timeout`. An
        `unauthorized` error raises at once; a greeting this client cannot read raises
        `HandshakeError`; the socket is closed on every failure."""
        deadline = asyncio.get_running_loop().time() + bounds.open_timeout
        async with asyncio.timeout_at(deadline):
            ws = await connect(url, additional_headers=headers, max_size=bounds.max_frame_bytes, open_timeout=None,
                               ping_interval=20, ping_timeout=20)
        try:
            try:
                async with asyncio.timeout_at(deadline):
                    frame = await ws.recv()
            except (ConnectionClosed, TimeoutError) as exc:
                why = str(exc) or f"none in {bounds.open_timeout:g} s (open_timeout)"
                raise ConnectionLostError(f"no ready frame from the server: {why}") from exc
            ready = _greeting(frame)
        except BaseException as exc:
            code = CloseCode.PROTOCOL_ERROR if isinstance(exc, ProtocolError) else CloseCode.NORMAL_CLOSURE
            await ws.close(code, _close_reason(str(exc)))
            raise
        return cls(ws, ready, bounds)

    def register(self, request_id: str, sample_rate: int | None) -> Route:
        route = Route(request_id, sample_rate or self.ready.sample_rate, self.bounds.max_buffered_bytes)
        self.routes[request_id] = route
        return route

    def unregister(self, request_id: str, route: Route | None = None) -> None:
        """Forget a request's route (only `route`, when given: its id may be in use again)."""
        if route is None or self.routes.get(request_id) is route:
            self.routes.pop(request_id, None)

    async def send(self, frame: dict[str, Any]) -> None:
        if self.closed:
            raise ConnectionLostError(f"the connection is closed ({self.close_reason})")
        try:
            await self.ws.send(dumps(frame))
        except ConnectionClosed as exc:
            raise ConnectionLostError(f"the connection closed: {exc}") from exc

    async def ping(self) -> None:
        """Send a `ping` and wait for its `pong`, at most `request_idle_timeout`."""
        pong: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pongs.append(pong)
        try:
            await self.send({"type": "ping"})
        except BaseException:
            with contextlib.suppress(ValueError):
                self._pongs.remove(pong)  # the ping never left: no pong will come for it
            raise
        timeout = self.bounds.request_idle_timeout
        try:
            async with asyncio.timeout(timeout):
                await pong  # cancelled with its caller: the waiter stays queued for its pong
        except TimeoutError:
            raise RequestTimeoutError(f"no pong in {timeout:g} s (request_idle_timeout)") from None

    def cancel_soon(self, route: Route) -> None:
        """Tell the server to stop a request this client has ended on its own (a malformed
        frame, a full buffer), without holding up the reader that found out."""
        route.cancelled = True

        async def send_cancel() -> None:
            with contextlib.suppress(ChorusError):
                await self.send({"type": "cancel", "id": route.request_id})

        task = asyncio.create_task(send_cancel(), name=f"chorus-client-cancel-{route.request_id}")
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)

    async def close(self) -> None:
        await self.ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        for task in list(self._chores):
            task.cancel()

    def _end_request(self, route: Route, error: ChorusError, *, drop_unread: bool = False) -> None:
        """End one request with `error` on this side and cancel it on the server's."""
        self.unregister(route.request_id, route)
        route.end(error, drop_unread=drop_unread)
        self.cancel_soon(route)

    def _deliver(self, request_id: str | None, item: Item, size: int) -> None:
        route = self.routes.get(request_id) if request_id is not None else None
        if route is None:
            if isinstance(item, ChorusError):
                log.warning("chorus server error for no open request: %s", item)
            return
        if isinstance(item, AudioChunk) and route.cancelled:
            route.touch()
            return  # the caller cancelled it: nobody will play this audio
        if not route.put(item, size):
            limit = self.bounds.max_buffered_bytes
            self._end_request(route, BufferFullError(
                f"request {request_id} has over max_buffered_bytes ({limit} bytes) of events its caller has "
                "not read; read events as they come, or raise the limit", request_id=request_id), drop_unread=True)
        elif route.ended:
            self.unregister(request_id, route)  # its last frame is queued: later ones are stray

    def _pong(self) -> None:
        if not self._pongs:
            log.debug("chorus client: a pong for no ping, dropped")
            return
        waiter = self._pongs.popleft()
        if not waiter.done():  # else its caller gave up: this late pong was its, and is dropped
            waiter.set_result(None)

    def _route_frame(self, frame: str | bytes, received_at: float) -> None:
        """Check one frame and hand it to its request; `ProtocolError` when it is malformed
        (with the request it names, when it names one)."""
        if isinstance(frame, bytes):
            chunk = parse_audio(frame, received_at=received_at)
            self._deliver(chunk.request_id, chunk, len(frame))
            return
        msg = decode_frame(frame)
        if msg.get("type") == "pong":
            self._pong()
            return
        rid = msg.get("id")
        route = self.routes.get(rid) if isinstance(rid, str) else None
        event = parse_event(msg, route.sample_rate if route else self.ready.sample_rate)
        if event is not None:
            self._deliver(event.request_id, event, len(frame))

    async def _read(self) -> None:
        try:
            async for frame in self.ws:
                received_at = time.perf_counter()
                try:
                    self._route_frame(frame, received_at)
                except ProtocolError as err:
                    route = self.routes.get(err.request_id) if err.request_id is not None else None
                    if route is not None:
                        self._end_request(route, err)
                    elif err.request_id is not None:
                        log.warning("chorus client: a malformed frame for no open request, dropped: %s", err)
                    else:
                        self._failure = f"the server sent a frame this client cannot read: {err.message}"
                        await self.ws.close(CloseCode.PROTOCOL_ERROR, _close_reason(err.message))
                        break
        except ConnectionClosed as exc:
            we_closed = exc.sent is not None and exc.rcvd_then_sent is not True  # not an echo of the server's close
            if we_closed and exc.sent.code == CloseCode.MESSAGE_TOO_BIG:
                self._failure = (f"the server sent a frame over max_frame_bytes ({self.bounds.max_frame_bytes} "
                                 "bytes); close 1009")
        except Exception as exc:  # a fault of this client's own: end the connection, never hang a request
            log.exception("chorus client: the reader failed; closing the connection")
            self._failure = f"the client's reader failed: {exc!r}"
            await self.ws.close(CloseCode.INTERNAL_ERROR, _close_reason(repr(exc)))
        finally:
            self._lost()

    def _lost(self) -> None:
        self.closed = True
        code = self.ws.close_code
        if self._failure is not None:
            self.close_reason = self._failure
        else:
            self.close_reason = f"code {code} {self.ws.close_reason or ''}".strip() if code else "closed"
        for rid, route in list(self.routes.items()):
            route.end(ConnectionLostError(f"the connection closed ({self.close_reason})", request_id=rid))
        self.routes.clear()
        for pong in self._pongs:
            if not pong.done():
                pong.set_exception(ConnectionLostError(f"the connection closed ({self.close_reason})"))
        self._pongs.clear()


def _greeting(frame: str | bytes) -> Ready:
    """The server's first frame as its `ready`; its error (`unauthorized`) raised as such."""
    if isinstance(frame, bytes):
        raise HandshakeError(f"the server's first frame is binary ({len(frame)} bytes), not a ready frame")
    try:
        first = decode_frame(frame)
    except ProtocolError as exc:
        raise HandshakeError(f"the server's first frame is not a ready frame: {exc.message}") from None
    if first.get("type") == "error":
        raise error_from(first)
    return parse_ready(first)


def _close_reason(text: str) -> str:
    """A close frame's reason: at most 123 bytes of UTF-8."""
    data = text.encode()
    return text if len(data) <= 123 else data[:120].decode(errors="ignore") + "..."
