"""Give freed heap memory back to the system once the server goes idle after work.

glibc keeps what a thread frees in that thread's arena, so after large requests the process
stays at its peak; each time the server has had requests in flight and has none, it calls
`malloc_trim(0)` (in a thread: it takes the arenas' locks).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger("chorus.memory")
POLL_SECONDS = 5.0


def _libc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        return libc.malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None


_malloc_trim = _libc_trim()


def malloc_trim() -> bool:
    """Return free heap pages to the system; False where the C library has no malloc_trim."""
    return bool(_malloc_trim and _malloc_trim(0))


async def trim_when_idle(inflight: Callable[[], int], poll: float = POLL_SECONDS) -> None:
    """Forever: after each busy period (requests in flight), once none are, trim once."""
    if _malloc_trim is None:
        return
    busy = False
    while True:
        await asyncio.sleep(poll)
        if inflight():
            busy = True
        elif busy:
            busy = False
            await asyncio.to_thread(malloc_trim)
            log.debug("idle: returned free heap memory to the system")
