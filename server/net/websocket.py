"""uvicorn's WebSocket protocol, minus the ways a peer that stops reading keeps a socket.

A paused writer (`send` waits for `resume_writing`) and a close whose frames are never
taken both end in an abort after `--send-timeout` without progress (`transport.py`); the
ASGI `send` then raises and the app sees the disconnect, so close and drain are bounded.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from server.net.limits import NetLimits
from server.net.peers import Admission, PeerSlots
from server.net.transport import BoundedCloseTransport, WatchedWrites


class GuardedWebSocketProtocol(WatchedWrites, WebSocketsSansIOProtocol):
    limits: NetLimits  # set by `guarded_ws_protocol`
    slot: tuple[PeerSlots, str, Admission] | None = None  # the connection slot the HTTP protocol took

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not isinstance(transport, BoundedCloseTransport):  # (the HTTP protocol wraps it first)
            transport = BoundedCloseTransport(transport, self.limits.send_timeout, "WebSocket")  # type: ignore
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.slot is not None:
            slots, peer, admission = self.slot
            self.slot = None
            slots.release(peer, admission)


def guarded_ws_protocol(limits: NetLimits) -> type[GuardedWebSocketProtocol]:
    return type("ChorusWebSocketProtocol", (GuardedWebSocketProtocol,), {"limits": limits})
