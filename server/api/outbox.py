"""One WebSocket's outgoing frames: sent in order by one writer, bounded in bytes and time.

A client that stops reading must not hold the audio made for it, nor a socket, nor the
server's shutdown. Frames wait here until the socket takes them; when more than
`--max-outbox-bytes` wait, the connection is *backed up*: it takes no new requests (`busy`),
and if it is still backed up `--send-timeout` seconds later it is given up (`on_stalled`:
its requests are cancelled and it is closed with 1008). Closing is bounded too: queued
frames get a few seconds, the close frame `--send-timeout` (a peer that takes nothing is
then dropped by `server.net`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from litestar import WebSocket

log = logging.getLogger("chorus.stream")
FLUSH_SECONDS = 5.0  # what queued frames get before a close


class Outbox:
    def __init__(self, socket: WebSocket, max_bytes: int, send_timeout: float, on_stalled: Callable[[], None]):
        self.socket = socket
        self.max_bytes = max_bytes
        self.send_timeout = send_timeout
        self.on_stalled = on_stalled
        self.queued_bytes = 0
        self._queue: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        self._deadline: asyncio.TimerHandle | None = None
        self.broken = False  # the socket failed a send: nothing more goes out

    @property
    def backed_up(self) -> bool:
        return self.queued_bytes > self.max_bytes

    def put(self, frame: str | bytes) -> None:
        if self.broken:
            return
        self.queued_bytes += len(frame)
        self._queue.put_nowait(frame)
        if self.backed_up and self._deadline is None:
            self._deadline = asyncio.get_running_loop().call_later(self.send_timeout, self._check_backed_up)

    def _check_backed_up(self) -> None:
        self._deadline = None
        if self.backed_up and not self.broken:
            self.on_stalled()

    async def run(self) -> None:
        """The writer: send frames until `stop()` or the socket fails."""
        while True:
            frame = await self._queue.get()
            try:
                if frame is None:
                    return
                self.queued_bytes -= len(frame)
                if isinstance(frame, bytes):
                    await self.socket.send_bytes(frame)
                else:
                    await self.socket.send_text(frame)
            except Exception:  # noqa: BLE001 - the peer is gone; the reader will see it
                self.broken = True
                self.discard()
                return
            finally:
                self._queue.task_done()

    def stop(self) -> None:
        self._queue.put_nowait(None)
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def discard(self) -> None:
        while not self._queue.empty():
            frame = self._queue.get_nowait()
            self.queued_bytes -= len(frame) if frame is not None else 0
            self._queue.task_done()

    async def close(self, code: int, reason: str, flush: bool = True) -> None:
        """Send what is queued (up to FLUSH_SECONDS; none when `flush` is false), then the
        close frame (up to the send timeout, after which `server.net` drops the peer)."""
        if flush:
            try:
                await asyncio.wait_for(self._queue.join(), FLUSH_SECONDS)
            except TimeoutError:
                pass
        self.broken = True
        self.discard()
        try:
            await asyncio.wait_for(self.socket.close(code=code, reason=reason), self.send_timeout + FLUSH_SECONDS)
        except Exception:  # noqa: BLE001 - already gone, or never took the close frame
            pass
