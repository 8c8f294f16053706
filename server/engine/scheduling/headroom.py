"""Realtime headroom: the share of the engine that the promises it holds leave free, and the
admission that answers `busy` rather than break them.

Demand: every streamed chunk (not whole-file) in the engine must have its packed tokens x
steps left done by its deadline, and no chunk is given less than `WINDOW_S` for it (a chunk
due now is asked to be done within it): token-steps per second. Capacity: the most token-steps
per second the engine has shown on a step (its speed does not change; small steps only
understate it). Headroom = 1 - demand / capacity; below zero the engine is over-committed.
A new line or stream turn is refused only when the headroom after it would fall below
`REFUSE_BELOW` (the urgent work would need twice what the engine can do: promises are then
broken whatever the order), and never before `MIN_STEPS` steps have measured the engine.
"""

from __future__ import annotations

from server.engine.types import RequestRejected

WINDOW_S = 1.0  # the least time a chunk is given to finish, however overdue
REFUSE_BELOW = -1.0  # refuse when demand would exceed (1 - this) x capacity
MIN_STEPS = 64  # steps measured before the admission may refuse anything
RETRY_MIN_S, RETRY_MAX_S = 0.25, 5.0


def need(packed_len: int, steps_left: int, until_due_s: float) -> float:
    """Token-steps per second one chunk needs to be done by its deadline."""
    return packed_len * steps_left / max(until_due_s, WINDOW_S)


class Headroom:
    def __init__(self, admission: bool):
        self.admission = admission  # refuse new work when over (else only measure)
        self.best_rate = 0.0  # token-steps per second, the fastest step seen
        self.steps = 0
        self.demand = 0.0  # token-steps per second the streamed chunks held need (set each schedule)
        self.refused_total = 0

    def observe_step(self, tokens: int, seconds: float) -> None:
        if tokens > 0 and seconds > 0:
            self.steps += 1
            self.best_rate = max(self.best_rate, tokens / seconds)

    def free(self, extra: float = 0.0) -> float:
        """The share of the engine left free with `extra` more demand (1.0 until measured)."""
        if self.steps < MIN_STEPS or self.best_rate <= 0:
            return 1.0
        return 1.0 - (self.demand + extra) / self.best_rate

    def admit(self, extra: float) -> None:
        """Refuse (`busy`, with a retry hint) work of `extra` demand that would leave the
        headroom below `REFUSE_BELOW`."""
        free = self.free(extra)
        if not self.admission or free >= REFUSE_BELOW:
            return
        self.refused_total += 1
        over = REFUSE_BELOW - free  # the excess, in shares of the engine
        retry_s = min(RETRY_MAX_S, max(RETRY_MIN_S, WINDOW_S * (1.0 + over)))
        raise RequestRejected(f"the engine's realtime work is {1 - free:.1f} times what it can do in time; "
                              "try again later", code="busy", retry_after_ms=round(retry_s * 1000))
