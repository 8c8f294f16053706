"""A request in flight: a `synthesize` (`Synthesis`), a text stream (`TextStream`) or a
dialogue (`Dialogue`).

Both are async iterators of events that end at `Done` or `Cancelled` (an error raises its
`ChorusError`). After `cancel()` no more audio of the request is yielded, even what was
already on the wire: a barge-in is silent at once, not a step later. A caller waiting on a
request that hears nothing of it, either way, for the connection's `request_idle_timeout`
gets `RequestTimeoutError`, and the request is cancelled on the server.

A request the server refuses `busy` with `retry_after_ms` is sent again after the hint and
some jitter (`BusyRetry`, the client's `busy_retry`), on the same id, as long as none of its
audio, words or segments has reached the caller: the caller reads on and sees one request
(one `Accepted`). A text stream keeps what was appended, flushed and closed until then, and
sends it again, in order, on the new attempt; what is appended during the wait joins it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

from .errors import ChorusError, RequestTimeoutError
from .events import Accepted, AudioChunk, Cancelled, Done, Event, Line, Progress, Segment, Words
from .retry import BusyRetry

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
    lines: list[Line] = field(default_factory=list)  # a dialogue's, in order

    @property
    def samples(self) -> int:
        return sum(c.samples for c in self.chunks)


class _Request:
    def __init__(self, connect: Callable[[], Awaitable[Connection]], request_id: str, frame: dict[str, Any],
                 sample_rate: int | None, busy_retry: BusyRetry | None = None, rng: random.Random | None = None):
        self.id = request_id
        self._connect = connect
        self._frame = frame
        self._sample_rate = sample_rate
        self._conn: Connection | None = None
        self._route: Route | None = None
        self._start_lock = asyncio.Lock()
        self.ended = False
        self.cancel_requested = False
        self._busy_retry = busy_retry
        self._rng = rng or random.Random()
        self.busy_retries = 0  # times it was sent again after `busy` with `retry_after_ms`
        self.busy_waited_s = 0.0  # seconds waited for those retries, in all
        self.sent_at: float | None = None  # perf_counter(): when its latest attempt was sent
        self._retrying = False  # between a `busy` taken and the next attempt sent
        self._wake = asyncio.Event()  # a cancel during a retry's wait ends the wait
        self._settled = False  # audio, words or a segment reached the caller: never retried again
        self._accepted = False  # an `Accepted` reached the caller: a retry's own is not yielded

    @property
    def sample_rate(self) -> int | None:
        """The rate of this request's audio (known once started)."""
        return self._route.sample_rate if self._route else self._sample_rate

    async def start(self) -> None:
        """Send the request (done on first use; call it to send before reading)."""
        async with self._start_lock:
            if self._conn is not None or self.ended:
                return
            await self._send_attempt()

    async def _send_attempt(self) -> None:
        """Register the request on the connection and send it (again, after a `busy`)."""
        conn = await self._connect()
        self._route = conn.register(self.id, self._sample_rate)
        self._conn = conn
        self.sent_at = time.perf_counter()
        try:
            await conn.send(self._frame)
            await self._resend(conn)
        except ChorusError:
            conn.unregister(self.id, self._route)
            self.ended = True
            raise

    async def _resend(self, conn: Connection) -> None:
        """After the request frame of a retry: what the caller sent of it before (a stream's text)."""

    async def cancel(self) -> None:
        """Stop the request: the server ends it at its next step with `cancelled`."""
        if self.ended or self.cancel_requested:
            return
        self.cancel_requested = True
        if self._retrying:  # between attempts: the reader ends it, or cancels the next once sent
            self._wake.set()
            return
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
        while not self.ended and self._route is not None:
            route = self._route
            if not route.has_events():
                await self._wait_for(route)
            item = route.take()
            if isinstance(item, ChorusError):
                retried = await self._retry(item)
                if retried is None:
                    continue
                self._finish()
                if isinstance(retried, Cancelled):
                    return retried
                raise item
            if isinstance(item, (Done, Cancelled)):
                self._finish()
                return item
            if isinstance(item, AudioChunk) and self.cancel_requested:
                continue
            shaped = self._shaped(item)
            if shaped is None:
                continue
            item = shaped
            if isinstance(item, Accepted):
                if self._accepted:
                    continue  # a retry's: the caller has had this request's
                self._accepted = True
            elif not isinstance(item, (Progress, Line)) and not self._settled:
                self._settled = True
                self._forget_sent()
            return item
        raise StopAsyncIteration

    async def _retry(self, err: ChorusError) -> Cancelled | bool | None:
        """After `err` ended the current attempt: None when the request was sent again (after
        the `busy` hint and jitter), a `Cancelled` when the caller cancelled it meanwhile,
        else False (the error is the request's end)."""
        policy = self._busy_retry
        if policy is None or self._settled or self.cancel_requested:
            return False
        wait = policy.wait_s(err, self.busy_retries, self.busy_waited_s, self._rng)
        if wait is None:
            return False
        self._retrying = True
        try:
            if self._conn is not None:
                self._conn.unregister(self.id, self._route)
            try:
                async with asyncio.timeout(wait):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self.busy_retries += 1
            self.busy_waited_s += wait
            if self.cancel_requested:
                return Cancelled(self.id)
            async with self._start_lock:
                try:
                    await self._send_attempt()
                except ChorusError:  # no connection for it: this error is its end
                    self.ended = True
                    raise
        finally:
            self._retrying = False
        if self.cancel_requested:  # cancelled while it was being sent: stop the new attempt
            self.cancel_requested = False
            await self.cancel()
        return None

    def _forget_sent(self) -> None:
        """The request can no longer be retried: what a retry would send again is dropped."""

    def _shaped(self, item: Event) -> Event | None:
        """An event as the caller gets it (None: not at all)."""
        return item

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
            elif isinstance(event, Line):
                result.lines.append(event)
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

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        """A whole request (`synthesize`, `dialogue`) left before its end is cancelled."""
        if not self.ended and self._conn is not None:
            await self.cancel()
        await self._end_on_exit(exc_type is not None)

    async def _end_on_exit(self, failed: bool) -> None:
        if self._conn is None or self.ended:
            return
        if failed:
            await self.cancel()
        await self.drain()


class Synthesis(_Request):
    """One `synthesize` request. `async with` cancels it if the block exits early."""


class Dialogue(_Request):
    """A script of several speakers (`dialogue`), all its lines synthesised at once and heard in
    order: per line a `Line`, then its `Progress` (with `progress=True`; `line` says whose),
    `AudioChunk`s (`line`, -1 for the pause after it, and `offset_samples` in the dialogue's
    audio) and `Words`; then `Done` for the whole dialogue. `async with` cancels every line if
    the block exits early."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.line: int | None = None  # the line whose `Line` came last
        self._lines_seen: set[int] = set()

    def _shaped(self, item: Event) -> Event | None:
        if isinstance(item, Line):
            if item.line in self._lines_seen:
                return None  # a retry's: the caller has had it
            self._lines_seen.add(item.line)
            self.line = item.line
        elif isinstance(item, Progress) and item.line is None and self.line is not None:
            return dataclasses.replace(item, line=self.line)  # a line's steps come after its `Line`
        return item


class TextStream(_Request):
    """Text streamed in (`stream_open`): `append()` text as it is written, `flush()` to
    speak what is buffered now, `close()` when no more text comes, `cancel()` to stop.
    Leaving the `async with` block closes the stream and reads it to its end (an
    exception cancels it instead)."""

    REPLAY_CHARS = 1000  # text per `stream_append` when a retry sends the stream's text again

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.input_closed = False
        # what was sent after `stream_open`, kept until the stream can no longer be retried
        self._sent: list[dict[str, Any]] | None = [] if self._busy_retry is not None else None

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
        if self.ended or self.cancel_requested:
            return
        if self._sent is not None:
            self._sent.append(frame)  # a retry sends it again, with what came before it
        if self._retrying or self._route is None or self._route.ended:
            return  # ended (its end may be unread yet, or be retried): the server has nothing to take it
        assert self._conn is not None
        self._route.touch()
        await self._conn.send(frame)

    async def _resend(self, conn: Connection) -> None:
        """The text appended so far (joined into few frames), its flushes and its close, in
        order; what is appended while this is sent is sent after it."""
        if not self._sent:
            return
        done = 0
        while done < len(self._sent):
            frames, done = self._sent[done:], len(self._sent)
            for frame in _joined(frames, self.REPLAY_CHARS):
                await conn.send(frame)

    def _forget_sent(self) -> None:
        self._sent = None


def _joined(frames: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """Consecutive `stream_append`s as one, up to `limit` characters a frame; the rest as they are."""
    out: list[dict[str, Any]] = []
    for frame in frames:
        last = out[-1] if out else None
        if (last is not None and frame["type"] == last["type"] == "stream_append"
                and len(last["text"]) + len(frame["text"]) <= limit):
            out[-1] = {**last, "text": last["text"] + frame["text"]}
        else:
            out.append(frame)
    return out
