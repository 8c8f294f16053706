"""Writes a peer never takes must not keep a socket (or its buffer) forever.

asyncio's `transport.close()` waits until the write buffer is sent; a peer that stops
reading keeps it open indefinitely, and a writer waiting for `resume_writing` waits as
long. `BoundedCloseTransport` aborts a closing transport whose buffer makes no progress for
`send_timeout`; `StallWatch` does the same for an open one whose writes are paused. Both end
in `connection_lost`, which unblocks every waiting `send` in uvicorn's protocols.
"""

from __future__ import annotations

import asyncio
import logging
import socket

log = logging.getLogger("chorus.net")


class StallWatch:
    """While `running`, abort `transport` once its write buffer has not shrunk for `timeout`."""

    def __init__(self, transport: asyncio.BaseTransport, timeout: float, what: str):
        self.transport = transport
        self.timeout = timeout
        self.what = what
        self._timer: asyncio.TimerHandle | None = None
        self._size = 0
        self._still = 0.0

    @property
    def running(self) -> bool:
        return self._timer is not None

    def start(self) -> None:
        if self._timer is None:
            self._size = self.transport.get_write_buffer_size()
            self._still = 0.0
            self._schedule()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(min(1.0, self.timeout), self._check)

    def _check(self) -> None:
        size = self.transport.get_write_buffer_size()
        if size == 0:
            self._timer = None
            return
        if size < self._size:
            self._size, self._still = size, 0.0
        else:
            self._still += min(1.0, self.timeout)
        if self._still >= self.timeout:
            self._timer = None
            log.info("dropping a %s: the peer took nothing we sent for %.0f s", self.what, self.timeout,
                     extra={"unsent_bytes": size})
            self.transport.abort()
            return
        self._schedule()


class BoundedCloseTransport:
    """A transport whose `close()` ends within `send_timeout` of no progress, whatever the
    peer does; everything else is the wrapped transport's."""

    def __init__(self, inner: asyncio.Transport, send_timeout: float, what: str):
        self._inner = inner
        self._watch = StallWatch(inner, send_timeout, what)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def close(self) -> None:
        self._inner.close()
        if self._inner.get_write_buffer_size() > 0:
            self._watch.start()

    def watch_writes(self, paused: bool) -> None:
        """The protocol's `pause_writing`/`resume_writing`: watch a paused transport."""
        if paused:
            self._watch.start()
        elif not self._inner.is_closing():
            self._watch.stop()


class WatchedWrites:
    """Mixin for a uvicorn protocol on a `BoundedCloseTransport`: paused writes are watched."""

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        self.transport.watch_writes(True)  # type: ignore[attr-defined]

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]
        self.transport.watch_writes(False)  # type: ignore[attr-defined]


def no_delay(transport: asyncio.BaseTransport) -> None:
    """Turn Nagle's algorithm off on a TCP connection: a response's (or a frame's) later writes
    go out at once instead of waiting for the peer to acknowledge the first, which a peer
    delaying its acknowledgements holds back for tens of milliseconds."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
