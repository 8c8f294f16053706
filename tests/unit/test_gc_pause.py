"""The GC pause around CUDA graph captures is counted across threads: the collector comes
back only when the last capture ends, and only if it was on before the first."""

from __future__ import annotations

import gc
import threading

from server.engine.model.gc_pause import gc_paused


def test_overlapping_pauses_restore_the_collector_once_the_last_ends():
    assert gc.isenabled()
    inner_started, outer_may_end = threading.Event(), threading.Event()
    seen = []

    def other_capture():
        with gc_paused():
            inner_started.set()
            outer_may_end.wait(5)
        seen.append(gc.isenabled())  # the last pause has ended

    with gc_paused():
        thread = threading.Thread(target=other_capture)
        thread.start()
        assert inner_started.wait(5) and not gc.isenabled()
    assert not gc.isenabled()  # the other thread's capture is still running
    outer_may_end.set()
    thread.join(5)
    assert seen == [True] and gc.isenabled()


def test_a_disabled_collector_stays_disabled():
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
