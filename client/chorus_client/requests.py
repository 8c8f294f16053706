"""A request in flight: a `synthesize` (`Synthesis`) or a text stream (`TextStream`).

Both are async iterators of events that end at `Done` or `Cancelled` (an error raises its
`ChorusError`). After `cancel()` no more audio of the request is yielded, even what was
already on the wire: a barge-in is silent at once, not a step later. A caller waiting on a
request that hears nothing of it, either way, for the connection's `request_idle_timeout`
gets `RequestTimeoutError`, and the request is cancelled on the server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import ChorusError, RequestTimeoutError
from .events import AudioChunk, Cancelled, Done, Event, Segment, Words

if TYPE_CHECKING:
    from .connection import Connection, Route


@dataclass
class Result:
    """A request's events gathered: its audio bytes joined, and how it ended."""

    audio: bytes
    chunks: list[AudioChunk]
    words: list[Words] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    done: Done | None = None
    cancelled: bool = False

    @property
    def samples(self) -> int:
        return sum(c.samples for c in self.chunks)


class _Request:
    def __init__(self, connect: Callable[[], Awaitable[Connection]], request_id: str, frame: dict[str, Any],
                 sample_rate: int | None):
        self.id = request_id
        self._connect = connect
        self._frame = frame
        self._sample_rate = sample_rate
        self._conn: Connection | None = None
        self._route: Route | None = None
        self._start_lock = asyncio.Lock()
        self.ended = False
        self.cancel_requested = False

    @property
    def sample_rate(self) -> int | None:
        """The rate of this request's audio (known once started)."""
        return self._route.sample_rate if self._route else self._sample_rate

    async def start(self) -> None:
        """Send the request (done on first use; call it to send before reading)."""
        async with self._start_lock:
            if self._conn is not None or self.ended:
                return
            conn = await self._connect()
            self._route = conn.register(self.id, self._sample_rate)
            self._conn = conn
            try:
                await conn.send(self._frame)
            except ChorusError:
                conn.unregister(self.id)
                self.ended = True
                raise

    async def cancel(self) -> None:
        """Stop the request: the server ends it at its next step with `cancelled`."""
        if self.ended or self.cancel_requested:
            return
        self.cancel_requested = True
        async with self._start_lock:  # a start in progress sends first, then this cancel
            conn, route = self._conn, self._route
            if conn is None or route is None:  # never sent: nothing to stop
                self.ended = True
                return
        if route.ended:  # its end is already here: nothing left to stop
            return
        route.cancelled = True
        route.touch()
        try:
            await conn.send({"type": "cancel", "id": self.id})
        except ChorusError:
            self._finish()

    def __aiter__(self) -> _Request:
        return self

    async def __anext__(self) -> Event:
        await self.start()
        route = self._route
        while not self.ended and route is not None:
            if not route.has_events():
                await self._wait_for(route)
            item = route.take()
            if isinstance(item, ChorusError):
                self._finish()
                raise item
            if isinstance(item, (Done, Cancelled)):
                self._finish()
                return item
            if isinstance(item, AudioChunk) and self.cancel_requested:
                continue
            return item
        raise StopAsyncIteration

    async def _wait_for(self, route: Route) -> None:
        """Wait for the request's next event; when no frame of it went either way for the
        idle timeout, cancel it on the server and raise `RequestTimeoutError`."""
        assert self._conn is not None
        timeout = self._conn.bounds.request_idle_timeout
        while not await route.wait(None if timeout is None else route.last_frame_at + timeout):
            assert timeout is not None
            if time.monotonic() < route.last_frame_at + timeout:
                continue  # a frame of it was sent meanwhile: its timeout started again
            self._finish()
            self._conn.cancel_soon(route)
            raise RequestTimeoutError(f"no frame of request {self.id} for {timeout:g} s (request_idle_timeout); "
                                      "cancelled", request_id=self.id)

    async def drain(self) -> None:
        """Read and drop what is left until the request ends (its error too)."""
        try:
            async for _ in self:
                pass
        except ChorusError:
            pass

    async def collect(self) -> Result:
        """Read every event to the end; the audio joined, words and segments kept."""
        result = Result(b"", [])
        async for event in self:
            if isinstance(event, AudioChunk):
                result.chunks.append(event)
            elif isinstance(event, Words):
                result.words.append(event)
            elif isinstance(event, Segment):
                result.segments.append(event)
            elif isinstance(event, Done):
                result.done = event
            elif isinstance(event, Cancelled):
                result.cancelled = True
        result.audio = b"".join(c.data for c in result.chunks)
        return result

    def _finish(self) -> None:
        self.ended = True
        if self._conn is not None:
            self._conn.unregister(self.id, self._route)

    async def _end_on_exit(self, failed: bool) -> None:
        if self._conn is None or self.ended:
            return
        if failed:
            await self.cancel()
        await self.drain()


class Synthesis(_Request):
    """One `synthesize` request. `async with` cancels it if the block exits early."""

    async def __aenter__(self) -> Synthesis:
        await self.start()
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if not self.ended and self._conn is not None:
            await self.cancel()
        await self._end_on_exit(exc_type is not None)


class TextStream(_Request):
    """Text streamed in (`stream_open`): `append()` text as it is written, `flush()` to
    speak what is buffered now, `close()` when no more text comes, `cancel()` to stop.
    Leaving the `async with` block closes the stream and reads it to its end (an
    exception cancels it instead)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.input_closed = False

    async def __aenter__(self) -> TextStream:
        await self.start()
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if exc_type is None and not self.input_closed and not self.ended:
            await self.close()
        await self._end_on_exit(exc_type is not None)

    async def append(self, text: str) -> None:
        await self._send({"type": "stream_append", "id": self.id, "text": text})

    async def flush(self) -> None:
        await self._send({"type": "stream_flush", "id": self.id})

    async def close(self) -> None:
        """No more text: what is buffered is spoken, then `Done`."""
        if self.input_closed:
            return
        self.input_closed = True
        await self._send({"type": "stream_close", "id": self.id})

    async def _send(self, frame: dict[str, Any]) -> None:
        await self.start()
        if self.ended or self.cancel_requested or self._route is None or self._route.ended:
            return  # ended (its end may be unread yet): the server has nothing to take it
        assert self._conn is not None
        self._route.touch()
        await self._conn.send(frame)
