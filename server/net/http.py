"""uvicorn's h11 protocol with connection caps and header and body deadlines.

- At the cap (`--max-connections`, open HTTP and WebSocket connections together), or at
  its peer address's own (`--max-connections-per-client`), a new socket may carry only a
  health request while a health slot is free (`peers.py`); past that it gets `503 busy` and
  is closed at once, before anything is read: its file descriptor is back within a moment,
  so the process never runs out of them.
- A request's headers must all arrive within `--header-timeout` of its first byte (or of the
  connect), its body within `--body-timeout` of its headers; else `408` and close. This ends
  bare idle sockets, partial request lines and 1-byte/s headers or bodies.
- Writes the peer never takes end the connection after `--send-timeout` (`transport.py`).
- Every connection sends at once (`TCP_NODELAY`), whatever socket it was accepted on.
"""

from __future__ import annotations

import asyncio
import json
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from server.net.accept_log import Throttled
from server.net.limits import NetLimits, per_client_cap
from server.net.peers import HEALTH_LINE, MAX_REQUEST_LINE, Admission, PeerSlots, peer_of
from server.net.transport import BoundedCloseTransport, WatchedWrites, no_delay


def raw_error(status: int, reason: str, code: str, message: str, retry_after: bool = False) -> bytes:
    """A whole `Connection: close` response in the API's error shape, written without h11."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    extra = b"retry-after: 1\r\n" if retry_after else b""
    return (f"HTTP/1.1 {status} {reason}\r\n".encode() + b"content-type: application/json\r\n"
            + f"content-length: {len(body)}\r\n".encode() + extra + b"connection: close\r\n\r\n" + body)


_refusals = Throttled("refusing connections: no slot left (%d open in all, at most %d per client address: "
                      "--max-connections, --max-connections-per-client); %d refused since the last report")
_timeouts = Throttled("closing connections whose request did not arrive in time (%s); %d since the last report",
                      level=logging.INFO)


class GuardedH11Protocol(WatchedWrites, H11Protocol):
    limits: NetLimits  # set by `guarded_http_protocol`
    slots: PeerSlots  # shared by every connection of the server

    refused = False
    upgraded = False  # the WebSocket protocol now holds the slot
    peer = "?"
    admission: Admission = "refused"
    _line: bytes | None = None  # a health-only socket's request line, until it is complete
    _header_timer: asyncio.TimerHandle | None = None
    _body_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        no_delay(transport)
        transport = BoundedCloseTransport(transport, self.limits.send_timeout, "connection")  # type: ignore[assignment]
        self.peer = peer_of(transport)
        self.admission = self.slots.admit(self.peer)
        if self.admission == "refused":
            self._refuse(transport)
            return
        if self.admission == "health":
            self._line = b""
        super().connection_made(transport)
        self._arm_header_timer()

    def _refuse(self, transport) -> None:
        self.refused = True
        self.transport = transport
        _refusals(self.slots.open.total(), self.slots.max_per_peer)
        transport.write(raw_error(503, "Service Unavailable", "busy",
                                  "the server has no connection slot for this client (at most "
                                  f"{self.slots.max_per_peer} per client address, {self.slots.max_connections} "
                                  "in all); try again later", retry_after=True))
        transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        if not self.upgraded:
            self.slots.release(self.peer, self.admission)
        if not self.refused:
            super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        if self._line is not None:  # health-only: one health request, nothing else
            self._line += data
            if b"\r\n" not in self._line and len(self._line) <= MAX_REQUEST_LINE:
                return
            if not HEALTH_LINE.match(self._line):
                self.transport.write(raw_error(503, "Service Unavailable", "busy",
                                               "the server has no connection slot for this client; try again "
                                               "later", retry_after=True))
                self.transport.close()
                return
            data, self._line = self._line, None
        super().data_received(data)
        if self.transport.get_protocol() is not self:  # upgraded to a WebSocket: its slot goes with it
            self.upgraded = True
            self.transport.get_protocol().slot = (self.slots, self.peer, self.admission)
            self._cancel_timers()
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            self._arm_header_timer()
        else:
            self._cancel(header=True)
            if state is h11.SEND_BODY:
                if self._body_timer is None:
                    self._body_timer = self.loop.call_later(self.limits.body_timeout, self._body_timed_out)
            else:
                self._cancel(header=False)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.admission == "health":  # one health request per health slot
            self.transport.close()

    # ---- deadlines ------------------------------------------------------------------------

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.limits.header_timeout, self._headers_timed_out)

    def _cancel(self, header: bool) -> None:
        timer = self._header_timer if header else self._body_timer
        if timer is not None:
            timer.cancel()
        if header:
            self._header_timer = None
        else:
            self._body_timer = None

    def _cancel_timers(self) -> None:
        self._cancel(header=True)
        self._cancel(header=False)

    def _headers_timed_out(self) -> None:
        self._header_timer = None
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a response is still being sent; its end re-arms the keep-alive timer
        self._give_up(f"request headers not received within {self.limits.header_timeout:g} s")

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
            self._give_up(f"request body not received within {self.limits.body_timeout:g} s")

    def _give_up(self, message: str) -> None:
        """408 (unless a response has begun), then close; the app sees a disconnect."""
        _timeouts(message)
        cycle = self.cycle
        if cycle is None or not cycle.response_started:
            self.transport.write(raw_error(408, "Request Timeout", "bad_message", message))
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()


def guarded_http_protocol(limits: NetLimits) -> type[GuardedH11Protocol]:
    """The protocol class uvicorn instantiates per connection, bound to `limits` and to one
    count of slots for the whole server."""
    slots = PeerSlots(limits.max_connections, per_client_cap(limits.max_connections,
                                                             limits.max_connections_per_client))
    return type("ChorusH11Protocol", (GuardedH11Protocol,), {"limits": limits, "slots": slots})
