"""The one rule for work whose size a request controls: a cap checked before it starts, a time
budget, off the event loop, and stopped when its request is cancelled.

`WorkBounds` carries a piece of work's cap, deadline and cancel flag to code that runs on a
worker thread and checks them as it goes (`check`), so a cancel or a deadline stops it between
two steps rather than after it ends. `run_bounded` runs such a function on an executor and, when
the awaiting task is cancelled (the request was), sets the flag. Work in another process (the
normaliser's grammars) is stopped by ending the process instead (`server.text.normalize_workers`).
docs/architecture.md ("Request-controlled work") lists every such place.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


class WorkRefused(Exception):
    """Work over its cap or past its budget; `code` and `message` are for the client (`field`
    names what was too large)."""

    def __init__(self, code: str, message: str, field: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field


class WorkCancelled(Exception):
    """The request this work belongs to was cancelled: stop."""


@dataclass
class WorkBounds:
    """A cap on what the work may produce (`max_chars`: the text as spoken), a deadline
    (`time.monotonic()` seconds), a cancel flag, and what to call the work in messages."""

    what: str
    max_chars: int | None
    deadline: float | None
    cancelled: threading.Event = field(default_factory=threading.Event)
    field: str = "text"

    @classmethod
    def unbounded(cls) -> WorkBounds:
        return cls("work", None, None)

    @classmethod
    def within(cls, what: str, max_chars: int | None, seconds: float | None, field: str = "text") -> WorkBounds:
        return cls(what, max_chars, None if seconds is None else time.monotonic() + seconds, field=field)

    def seconds_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def check_size(self, chars: int) -> None:
        if self.max_chars is not None and chars > self.max_chars:
            raise WorkRefused("text_too_long", f"{self.field}: {self.what} makes the text over {self.max_chars} "
                              "characters as spoken (--max-spoken-chars); send less text", self.field)

    def check(self, chars: int = 0) -> None:
        """Raise if cancelled, past the deadline or (given `chars` so far) over the cap."""
        if self.cancelled.is_set():
            raise WorkCancelled(self.what)
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise WorkRefused("text_too_long", f"{self.field}: {self.what} took longer than its time budget; "
                              "send less text", self.field)
        self.check_size(chars)


async def run_bounded(executor: Executor | None, bounds: WorkBounds, function: Callable[..., T], *args) -> T:
    """`function(*args)` on `executor` (None: the loop's default); cancelling the caller sets
    `bounds.cancelled`, so a function that checks its bounds stops at its next check."""
    future = asyncio.get_running_loop().run_in_executor(executor, function, *args)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        bounds.cancelled.set()
        raise
