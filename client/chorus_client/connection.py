"""One WebSocket to the server, shared by every request and stream of a client.

A reader task routes each frame to its request's queue by id, so any number of requests
and streams run on one connection at once. When the socket closes, every request still
in flight gets a `ConnectionLostError`; the client opens a new connection on its next call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from .errors import ChorusError, ConnectionLostError, error_from
from .events import Event, Ready
from .wire import dumps, parse_audio, parse_event, parse_ready

log = logging.getLogger("chorus_client")

Item = Event | ChorusError


@dataclass
class Route:
    """Where one request's frames go, and the rate its sample positions count at."""

    sample_rate: int
    queue: asyncio.Queue[Item] = field(default_factory=asyncio.Queue)


class Connection:
    def __init__(self, ws: ClientConnection, ready: Ready):
        self.ws = ws
        self.ready = ready
        self.routes: dict[str, Route] = {}
        self.closed = False
        self.close_reason = ""
        self._pongs: list[asyncio.Future[None]] = []
        self._reader = asyncio.create_task(self._read(), name="chorus-client-reader")

    @classmethod
    async def open(cls, url: str, headers: dict[str, str], timeout: float) -> Connection:
        """Connect and read the `ready` greeting (an `unauthorized` error raises at once)."""
        ws = await connect(url, additional_headers=headers, max_size=None, open_timeout=timeout,
                           ping_interval=20, ping_timeout=20)
        try:
            first = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        except (ConnectionClosed, TimeoutError) as exc:
            await ws.close()
            raise ConnectionLostError(f"no ready frame from the server: {exc}") from exc
        if first.get("type") != "ready":
            await ws.close()
            raise error_from(first) if first.get("type") == "error" else ConnectionLostError(f"unexpected {first}")
        return cls(ws, parse_ready(first))

    def register(self, request_id: str, sample_rate: int | None) -> Route:
        route = Route(sample_rate or self.ready.sample_rate)
        self.routes[request_id] = route
        return route

    def unregister(self, request_id: str) -> None:
        self.routes.pop(request_id, None)

    async def send(self, frame: dict[str, Any]) -> None:
        if self.closed:
            raise ConnectionLostError(f"the connection is closed ({self.close_reason})")
        try:
            await self.ws.send(dumps(frame))
        except ConnectionClosed as exc:
            raise ConnectionLostError(f"the connection closed: {exc}") from exc

    async def ping(self) -> None:
        pong = asyncio.get_running_loop().create_future()
        self._pongs.append(pong)
        await self.send({"type": "ping"})
        await pong

    async def close(self) -> None:
        await self.ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader

    def _deliver(self, request_id: str | None, item: Item) -> None:
        route = self.routes.get(request_id) if request_id is not None else None
        if route is not None:
            route.queue.put_nowait(item)
        elif isinstance(item, ChorusError):
            log.warning("chorus server error for no open request: %s", item)

    async def _read(self) -> None:
        try:
            async for frame in self.ws:
                if isinstance(frame, bytes):
                    chunk = parse_audio(frame, received_at=time.perf_counter())
                    self._deliver(chunk.request_id, chunk)
                    continue
                msg = json.loads(frame)
                if msg.get("type") == "pong":
                    if self._pongs:
                        self._pongs.pop(0).set_result(None)
                    continue
                rid = msg.get("id")
                route = self.routes.get(rid) if rid is not None else None
                event = parse_event(msg, route.sample_rate if route else self.ready.sample_rate)
                if event is not None:
                    self._deliver(rid, event)
        except ConnectionClosed:
            pass
        except Exception:  # a frame this client cannot read ends the connection, logged
            log.exception("chorus client: unreadable frame; closing the connection")
            await self.ws.close()
        finally:
            self._lost()

    def _lost(self) -> None:
        self.closed = True
        code = self.ws.close_code
        self.close_reason = f"code {code} {self.ws.close_reason or ''}".strip() if code else "closed"
        for rid, route in list(self.routes.items()):
            route.queue.put_nowait(ConnectionLostError(f"the connection closed ({self.close_reason})",
                                                       request_id=rid))
        for pong in self._pongs:
            if not pong.done():
                pong.set_exception(ConnectionLostError("the connection closed"))
        self._pongs.clear()
