"""Waiting for an effect that lands a little later (a cancel at the next step, a metric)."""

from __future__ import annotations

import time


def poll_until(predicate, what: str, timeout: float = 60.0) -> None:
    """Poll `predicate()` every 50 ms until true; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not seen within {timeout:.0f}s")
        time.sleep(0.05)
