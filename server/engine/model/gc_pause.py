"""Python's cyclic GC paused while CUDA graphs are captured.

A collection during a capture that frees some other CUDA graph (say, of a backbone dropped
earlier) destroys it mid-capture, which CUDA forbids: the capture fails ("operation not
permitted when stream is capturing"). Captures run on the engine thread and on the finisher
threads at start (and on a finisher thread later for a decode bucket not captured then),
possibly at the same time, so the pause is counted: the collector comes back on when the
last capture ends, in the state it was in before the first.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
