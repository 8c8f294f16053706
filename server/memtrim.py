"""Give freed heap memory back to the system once the server goes idle after work.

glibc keeps what a thread frees in that thread's malloc arena for reuse; after large
requests (audio frames of tens of MB, decoded and encoded in several threads) the process
stays at its peak. Measured on a CPU with the tiny checkpoint: 4 rounds of four
5000-character requests took RSS from 1085 MB to a plateau of ~1430 MB that stayed while
idle; `malloc_trim(0)` brought it back to ~1240 MB. So each time the server has had requests
in flight and has none, it trims (in a thread: it takes the arenas' locks for a few ms).
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
