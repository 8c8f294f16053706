"""How much of the engine's time the decode hold may leave idle: a token bucket.

A hold (`Scheduler.await_decode`) stops chunks with slack from running while a due chunk
decodes, so that sound goes out sooner. Under load every finished first chunk is due, and
unbounded holds would idle the engine until everything is late. Credit accrues at `share` of
the wall time that passes, up to one hold's worth (`cap_s`); a hold starts only with credit and
its actual length is charged when it ends (the balance may go below zero, and then new holds
wait until it is positive again). A lone request finds the bucket full: it holds as before.
"""

from __future__ import annotations

HOLD_SHARE = 0.08  # the decode hold may idle the engine this share of wall time at most


class HoldBudget:
    def __init__(self, cap_s: float, share: float = HOLD_SHARE):
        self.share = share
        self.cap_s = cap_s
        self.credit_s = cap_s  # full at start: the first hold always runs
        self._credit_at: float | None = None
        self._hold_since: float | None = None  # an open hold: since when
        self.held_seconds_total = 0.0  # wall time spent holding, ever
        self.holds_total = 0
        self.holds_refused_total = 0  # holds not started for want of credit

    def _accrue(self, now: float) -> None:
        if self._credit_at is not None and now > self._credit_at:
            self.credit_s = min(self.cap_s, self.credit_s + self.share * (now - self._credit_at))
        self._credit_at = now if self._credit_at is None else max(self._credit_at, now)

    @property
    def holding(self) -> bool:
        return self._hold_since is not None

    def left(self, now: float) -> float:
        """Credit left if the open hold (if any) ended now."""
        self._accrue(now)
        spent = now - self._hold_since if self._hold_since is not None else 0.0
        return self.credit_s - spent

    def start(self, now: float) -> bool:
        """A due chunk wants a hold: True if it may (joining an open hold costs nothing more
        than the hold's own length)."""
        if self.left(now) <= 0:
            self.holds_refused_total += 1
            return False
        if self._hold_since is None:
            self._hold_since = now
            self.holds_total += 1
        return True

    def end(self, now: float) -> None:
        """No chunk is awaited any more: charge the hold's length."""
        if self._hold_since is None:
            return
        self._accrue(now)
        length = max(0.0, now - self._hold_since)
        self.credit_s -= length
        self.held_seconds_total += length
        self._hold_since = None
