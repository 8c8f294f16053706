"""Rate-limited logging for what an attacker can repeat at will: accept() failures and
refused connections, one line per interval with a count instead of one line per event.

When the process is out of file descriptors asyncio logs `socket.accept() out of system
resource` with a traceback on every attempt; under a flood that is megabytes a second.
"""

from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger("chorus.net")
ACCEPT_FAILED = "socket.accept() out of system resource"


class Throttled:
    """`log.warning(message % (..., n))` at most once per `interval`; n counts every call."""

    def __init__(self, message: str, interval: float = 10.0, level: int = logging.WARNING):
        self.message = message
        self.interval = interval
        self.level = level
        self.count = 0
        self.last = float("-inf")

    def __call__(self, *args) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.last >= self.interval:
            log.log(self.level, self.message, *args, self.count)
            self.last, self.count = now, 0


class AcceptErrorLog:
    """The event loop's exception handler: accept failures throttled, the rest as usual."""

    def __init__(self, interval: float = 10.0):
        self.report = Throttled("cannot accept connections: %s (%d times since the last report; lower "
                                "--max-connections or raise `ulimit -n`)", interval, logging.ERROR)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        if context.get("message") != ACCEPT_FAILED:
            loop.default_exception_handler(context)
            return
        self.report(context.get("exception"))
