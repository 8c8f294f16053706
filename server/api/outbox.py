"""One WebSocket's outgoing frames: sent in order by one writer, bounded in bytes and time.

A client that stops reading must not hold the audio made for it, nor a socket, nor the
server's shutdown; a client that reads must never be taken for one that does not. Frames
wait here until the socket takes them. When more than `--max-outbox-bytes` wait, the
connection is *backed up*: it takes no new requests (`busy`). A backed-up connection is
given up (`on_stalled`: its requests are cancelled, close 1008 `not reading`) only when,
over `--send-timeout` seconds, its socket took less audio than that many seconds of it (a
frame still going out counts as read at real time: a socket that takes nothing at all is
dropped by `server.net` after `--send-timeout`). A reader that keeps up with real-time
playback is never dropped, however far ahead of it the engine runs (a 48 kHz `f32le`
request legitimately queues megabytes).

Closing sends what is queued to a reader that keeps taking it, until a deadline (on
shutdown: the end of the drain window; never less than `FLUSH_SECONDS`). What is still
queued then is dropped, and every request whose end frame was among it gets an explicit
`cancelled` with a reason instead, never silence. The close frame gets `--send-timeout`
(a peer that takes nothing is then dropped by `server.net`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from litestar import WebSocket

log = logging.getLogger("chorus.stream")
FLUSH_SECONDS = 5.0  # what queued frames get before a close, at least
REAL_TIME = 1.0  # audio seconds per second a backed-up reader must take to be kept


@dataclass
class _Frame:
    data: str | bytes
    audio_seconds: float = 0.0
    ends: str | None = None  # the request id whose end frame this is


class Outbox:
    def __init__(self, socket: WebSocket, max_bytes: int, send_timeout: float, on_stalled: Callable[[], None]):
        self.socket = socket
        self.max_bytes = max_bytes
        self.send_timeout = send_timeout
        self.on_stalled = on_stalled
        self.queued_bytes = 0
        self.taken_audio_s = 0.0  # audio seconds the socket has taken, in all
        self._queue: asyncio.Queue[_Frame | None] = asyncio.Queue()
        self._deadline: asyncio.TimerHandle | None = None
        self._window: tuple[float, float] = (0.0, 0.0)  # (when, taken_audio_s) the backed-up window began
        self._sending: tuple[float, float] | None = None  # (since, audio seconds) of the frame being sent
        self.broken = False  # the socket failed a send: nothing more goes out

    @property
    def backed_up(self) -> bool:
        return self.queued_bytes > self.max_bytes

    def put(self, frame: str | bytes, audio_seconds: float = 0.0, ends: str | None = None) -> None:
        """Queue a frame; `audio_seconds`: the audio it carries; `ends`: the request it ends."""
        if self.broken:
            return
        self.queued_bytes += len(frame)
        self._queue.put_nowait(_Frame(frame, audio_seconds, ends))
        if self.backed_up and self._deadline is None:
            self._start_window()

    def _start_window(self) -> None:
        loop = asyncio.get_running_loop()
        self._window = (loop.time(), self.taken_audio_s)
        self._deadline = loop.call_later(self.send_timeout, self._check_backed_up)

    def _check_backed_up(self) -> None:
        """Still backed up after a window: keep a reader that took at least real time's worth."""
        self._deadline = None
        if not self.backed_up or self.broken:
            return
        began, taken = self._window
        now = asyncio.get_running_loop().time()
        credit = self.taken_audio_s - taken
        if self._sending is not None:  # a long frame still going out may be read at real time
            since, seconds = self._sending
            credit += min(seconds, REAL_TIME * (now - max(since, began)))
        if credit >= REAL_TIME * (now - began):
            self._start_window()  # reading as fast as it plays: wait on
        else:
            self.on_stalled()

    async def run(self) -> None:
        """The writer: send frames until `stop()` or the socket fails."""
        while True:
            frame = await self._queue.get()
            try:
                if frame is None:
                    return
                self.queued_bytes -= len(frame.data)
                self._sending = (asyncio.get_running_loop().time(), frame.audio_seconds)
                if isinstance(frame.data, bytes):
                    await self.socket.send_bytes(frame.data)
                else:
                    await self.socket.send_text(frame.data)
                self.taken_audio_s += frame.audio_seconds
                self._sending = None
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

    def discard(self) -> list[str]:
        """Drop every queued frame; the ids of the requests whose end frame was dropped."""
        ended: list[str] = []
        while not self._queue.empty():
            frame = self._queue.get_nowait()
            if frame is not None:
                self.queued_bytes -= len(frame.data)
                if frame.ends is not None:
                    ended.append(frame.ends)
            self._queue.task_done()
        return ended

    async def close(self, code: int, reason: str, flush: bool = True, until: float | None = None,
                    cut_short: Callable[[str], str] | None = None) -> None:
        """Send what is queued while the reader takes it, up to `until` (loop time; at least
        FLUSH_SECONDS from now; none when `flush` is false). Frames left then are dropped, and
        each request whose end was among them gets `cut_short(id)` (an explicit end) instead.
        Then the close frame (up to the send timeout, after which `server.net` drops the peer)."""
        if flush:
            loop = asyncio.get_running_loop()
            seconds = max(FLUSH_SECONDS, (until - loop.time()) if until is not None else 0.0)
            try:
                await asyncio.wait_for(self._queue.join(), seconds)
            except TimeoutError:
                ended = self.discard()
                if cut_short is not None and ended and not self.broken:
                    log.info("closing: audio left unsent past the deadline; its requests end with cancelled",
                             extra={"requests": len(ended)})
                    for request_id in ended:
                        self.put(cut_short(request_id))
                    try:
                        await asyncio.wait_for(self._queue.join(), self.send_timeout)
                    except TimeoutError:
                        pass
        self.broken = True
        self.discard()
        try:
            await asyncio.wait_for(self.socket.close(code=code, reason=reason), self.send_timeout + FLUSH_SECONDS)
        except Exception:  # noqa: BLE001 - already gone, or never took the close frame
            pass
