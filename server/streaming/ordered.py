"""A stream's frames that may wait on work, in order: a segment's aligned `words` (the aligner
runs on its own thread), then its `segment` frame, then `done`. Audio frames never go through
here, so they never wait for an alignment."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from msgspec import Struct

log = logging.getLogger("chorus.stream")


class OrderedFrames:
    def __init__(self, send: Callable[[Struct], None], ended: Callable[[], bool]):
        self._send = send
        self._ended = ended
        self._tail: asyncio.Task | None = None  # the last frame still waiting its turn

    def send(self, frame: Struct | Awaitable[Struct]) -> None:
        """Send `frame` (or what it resolves to) after every frame given before it."""
        if self._tail is None and isinstance(frame, Struct):
            self._send(frame)  # nothing waits: at once, as without an aligner
            return
        self._tail = asyncio.create_task(self._after(self._tail, frame))

    async def _after(self, previous: asyncio.Task | None, frame: Struct | Awaitable[Struct]) -> None:
        if previous is not None:
            await asyncio.wait([previous])  # its own failure is its own: this frame still goes
        try:
            message = frame if isinstance(frame, Struct) else await frame
        except Exception:  # a bug in making one frame loses that frame, not the stream's order
            log.exception("a stream frame could not be made")
            return
        if not self._ended():  # nothing after the stream's end (an error, a cancel)
            self._send(message)

    async def drained(self) -> None:
        """Every frame given so far is sent (before `done`)."""
        if self._tail is not None:
            await self._tail

    @property
    def waiting(self) -> bool:
        return self._tail is not None and not self._tail.done()
