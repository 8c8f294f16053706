"""uvicorn's WebSocket protocol, minus the ways a peer that stops reading keeps a socket.

A paused writer (`send` waits for `resume_writing`) and a close whose frames are never
taken both end in an abort after `--send-timeout` without progress (`transport.py`); the
ASGI `send` then raises and the app sees the disconnect, so close and drain are bounded.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from server.net.limits import NetLimits
from server.net.transport import BoundedCloseTransport, WatchedWrites


class GuardedWebSocketProtocol(WatchedWrites, WebSocketsSansIOProtocol):
    limits: NetLimits  # set by `guarded_ws_protocol`

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not isinstance(transport, BoundedCloseTransport):  # (the HTTP protocol wraps it first)
            transport = BoundedCloseTransport(transport, self.limits.send_timeout, "WebSocket")  # type: ignore
        super().connection_made(transport)


def guarded_ws_protocol(limits: NetLimits) -> type[GuardedWebSocketProtocol]:
    return type("ChorusWebSocketProtocol", (GuardedWebSocketProtocol,), {"limits": limits})
