"""uvicorn's WebSocket protocol, minus the ways a peer that stops reading keeps a socket.

A paused writer (`send` waits for `resume_writing`) and a close whose frames are never
taken both end in an abort after `--send-timeout` without progress (`transport.py`); the
ASGI `send` then raises and the app sees the disconnect, so close and drain are bounded.
The close handshake waits `--send-timeout` for the peer's answer, shutdown included (a live
reader may still be reading what the kernel buffered before the close frame).
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
        # after our close frame, a reader still taking the audio queued before it (in the
        # kernel's buffers) gets --send-timeout to reach it and answer, not uvicorn's 10 s
        self.close_timeout = max(self.close_timeout, self.limits.send_timeout)
        super().connection_made(transport)

    def shutdown(self) -> None:
        """Server shutdown: a connection whose close frame is out stays until the peer answers
        it (or the close timeout): closing the socket sooner would reset it, and the peer would
        lose what the kernel still holds for it."""
        if self.close_sent and self.close_timer is not None:
            return
        super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.slot is not None:
            slots, peer, admission = self.slot
            self.slot = None
            slots.release(peer, admission)


def guarded_ws_protocol(limits: NetLimits) -> type[GuardedWebSocketProtocol]:
    return type("ChorusWebSocketProtocol", (GuardedWebSocketProtocol,), {"limits": limits})
