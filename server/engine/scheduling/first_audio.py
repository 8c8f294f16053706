"""First-audio admission: a new line or stream turn is taken only when the engine can give its
first chunk all its steps within the first-audio promise, on the steps it would share.

Why: the headroom (`headroom.py`) weighs rates, and in a burst (a reconnect storm: a hundred
agents' first turns within two seconds) every first chunk is due at once and all of them run
in the same steps, which grow with them; the newest first audio then comes after its steps at
that size. This counts exactly that: a step's cost by its packed tokens (`StepCost`, from the
engine's own measured steps), and the newcomer's steps holding every first chunk taken and not
yet done (reserved when taken, so arrivals between two schedules are not invisible), the
streams' chunks due now, and at least one urgent step's worth of other work. Over the
promise, `busy` with a hint of how late it would have been.
"""

from __future__ import annotations

import threading
import time

from server.engine.scheduling.headroom import MIN_STEPS, RETRY_MAX_S
from server.engine.types import RequestRejected

DECAY = 0.98  # a size class's running mean keeps this much of itself at each step of its size
DELIVERY_S = 0.03  # a first chunk's decode, post-processing and delivery on top of its steps
RETRY_MIN_S = 0.1
RESERVATION_TTL_S = 10.0  # a reservation whose chunk never reported back is dropped after this


class StepCost:
    """Seconds a step takes, by its packed tokens: each power-of-two size class keeps a running
    mean of its steps' tokens and seconds (so quiet spells of small steps do not erase what
    large steps cost); between classes the cost is read off the line through the two measured
    neighbours, outside them off the line through the two nearest (proportional with one).
    Below the smallest class measured it is never more than that line says nor less than
    proportional: a server that has only run large steps must not take small ones for dear,
    or it would refuse every turn and never measure a small step."""

    def __init__(self):
        self.steps = 0
        self._classes: dict[int, list[float]] = {}  # size class -> [mean tokens, mean seconds]

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        self.steps += 1
        mean = self._classes.setdefault(tokens.bit_length(), [float(tokens), seconds])
        mean[0] += (1 - DECAY) * (tokens - mean[0])
        mean[1] += (1 - DECAY) * (seconds - mean[1])

    def seconds(self, tokens: int) -> float | None:
        """The expected seconds of a step of `tokens` (None until measured)."""
        if self.steps < MIN_STEPS:
            return None
        points = sorted(self._classes.values())
        proportional = points[0][1] * tokens / points[0][0]
        if len(points) == 1:
            return proportional
        below = [p for p in points if p[0] <= tokens]
        if not below:  # under every class measured
            (t0, s0), (t1, s1) = points[:2]
        elif len(below) < len(points):
            (t0, s0), (t1, s1) = below[-1], points[len(below)]
        else:
            (t0, s0), (t1, s1) = points[-2:]
        slope = max(0.0, (s1 - s0) / (t1 - t0)) if t1 > t0 else 0.0
        line = s0 + slope * (tokens - t0)
        return max(proportional, line) if not below else max(s0, line)


class FirstAudioAdmission:
    """Reservations of first chunks in flight, and the admission that reads them. `admit` runs
    on a caller's thread; `release` and the cost's `observe` on the engine thread. A request
    refused after its reservation (by the audio budget, or a server closing) is never released
    by the engine: its reservation lapses after `RESERVATION_TTL_S`."""

    def __init__(self, promise_s: float | None, urgent_step_tokens: int):
        self.promise_s = promise_s  # None: never refuses
        self.urgent_step_tokens = urgent_step_tokens
        self.cost = StepCost()
        self.due_tokens = 0  # packed tokens of streams' later chunks due now (set each schedule)
        self.refused_total = 0
        self._lock = threading.Lock()
        self._reserved: dict[str, tuple[int, float]] = {}  # request id -> (first chunk's tokens, when taken)

    def reserved_ids(self) -> frozenset[str]:
        """The requests whose first chunks are reserved (one look for a whole schedule)."""
        with self._lock:
            return frozenset(self._reserved)

    def reserved_tokens(self, now: float) -> int:
        with self._lock:
            stale = [rid for rid, (_, at) in self._reserved.items() if now - at > RESERVATION_TTL_S]
            for rid in stale:
                del self._reserved[rid]
            return sum(tokens for tokens, _ in self._reserved.values())

    def release(self, request_id: str) -> None:
        """Its first chunk is done (or the request dropped): no longer ahead of anyone."""
        with self._lock:
            self._reserved.pop(request_id, None)

    def first_audio_s(self, packed_len: int, num_step: int, ahead: int) -> float | None:
        """When a new first chunk of `packed_len` tokens would be heard, taken now behind `ahead`
        tokens of work due (None until measured)."""
        step = self.cost.seconds(max(self.urgent_step_tokens, ahead + packed_len))
        return None if step is None else num_step * step + DELIVERY_S

    def admit(self, request_id: str, packed_len: int, num_step: int, now: float | None = None) -> None:
        """Reserve the first chunk's place, or refuse `busy` when its first audio would come
        after the promise with work ahead of it; the hint: how late it would have been."""
        if self.promise_s is None:
            return
        now = time.perf_counter() if now is None else now
        ahead = self.reserved_tokens(now) + self.due_tokens
        expected = self.first_audio_s(packed_len, num_step, ahead)
        if ahead and expected is not None and expected > self.promise_s:  # nothing ahead: waiting gains nothing
            self.refused_total += 1
            late = expected - self.promise_s
            retry_s = min(RETRY_MAX_S, max(RETRY_MIN_S, late))
            raise RequestRejected(f"a new turn's first audio would come {expected * 1000:.0f} ms after it, "
                                  f"over the promise of {self.promise_s * 1000:.0f} ms; try again later",
                                  code="busy", retry_after_ms=round(retry_s * 1000))
        with self._lock:
            self._reserved[request_id] = (packed_len, now)
