"""A server-wide budget of audio: seconds planned by the requests accepted and not yet ended.

Accepted audio is held in memory until it is sent (all of it, with `stream: whole`), so the
sum of what the accepted requests will produce bounds that memory. A request that would
take the sum over the limit is refused with `busy` (try again later) before anything is
queued; a request alone is always admitted (its own size is `--max-audio-seconds`'s job).
"""

from __future__ import annotations

import threading

from server.engine.types import RequestRejected


class AudioBudget:
    def __init__(self, limit_seconds: float | None):
        self.limit_seconds = limit_seconds
        self._lock = threading.Lock()
        self._held: dict[str, float] = {}
        self._total = 0.0

    @property
    def held_seconds(self) -> float:
        return self._total

    def reserve(self, request_id: str, seconds: float) -> None:
        with self._lock:
            if self.limit_seconds is not None and self._held and self._total + seconds > self.limit_seconds:
                raise RequestRejected(
                    f"the server holds {self._total:.0f} s of audio for requests in flight; this one adds "
                    f"{seconds:.0f} s, over its limit of {self.limit_seconds:g} s: try again later", code="busy")
            self._held[request_id] = seconds
            self._total += seconds

    def release(self, request_id: str) -> None:
        with self._lock:
            self._total -= self._held.pop(request_id, 0.0)
            if not self._held:
                self._total = 0.0  # no float drift once nothing is held
