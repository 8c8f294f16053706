"""`BusyRetry`: how the client tries again a request the server refused `busy` with a
`retry_after_ms` hint (the engine could not serve it in time now, and says when to come back).

Each wait honours the hint and adds jitter on top of it (never less than the hint, so that
clients refused together come back spread out instead of all at once); the waits of one
request together stay within `max_wait_s`, after which the last `BusyError` is raised. A
`busy` without a hint (a full queue, a draining server) is raised at once: the server gave
no time to come back at.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .errors import BusyError, ChorusError


@dataclass(frozen=True)
class BusyRetry:
    """`max_wait_s`: seconds one request may wait in all, over its retries; a wait that would
    pass it is not taken, and the `BusyError` is raised instead. `jitter`: each wait is the
    hint times 1 + uniform(0, `jitter`). `max_retries`: retries of one request at most.
    `min_wait_s`: the least wait, whatever the hint (a hint of 0 does not spin)."""

    max_wait_s: float = 10.0
    jitter: float = 0.5
    max_retries: int = 16
    min_wait_s: float = 0.05

    def __post_init__(self) -> None:
        if not self.max_wait_s >= 0 or not self.jitter >= 0 or not self.min_wait_s >= 0 or self.max_retries < 0:
            raise ValueError(f"BusyRetry fields must be non-negative: {self!r}")

    def wait_s(self, err: ChorusError, retries: int, waited_s: float, rng: random.Random) -> float | None:
        """Seconds to wait before trying again after `err` (the `retries`-th retry, `waited_s`
        waited so far), or None: raise it."""
        if not isinstance(err, BusyError) or err.retry_after_ms is None or retries >= self.max_retries:
            return None
        hint = max(self.min_wait_s, err.retry_after_ms / 1000.0)
        wait = hint * (1.0 + rng.uniform(0.0, self.jitter))
        return wait if waited_s + wait <= self.max_wait_s else None


DEFAULT_BUSY_RETRY = BusyRetry()  # a client's, unless it is given another (or None)
