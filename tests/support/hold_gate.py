"""Requests that stay in flight, doing no work, until they are cancelled.

Behind a `HoldGate`, every request whose text contains the marker is checked and accepted by
the real engine as usual, then held here: it emits nothing and never ends by itself; a cancel
(the client's, the drain's `cancel_all`, or the engine stopping) ends it with `cancelled`.
Shutdown tests use it for work that outlasts any drain, whatever the machine's speed, instead
of a time margin (`tests.support.held_server` serves an app built with it).
"""

from __future__ import annotations

import threading
from typing import Any

from server.engine.types import Accepted, EngineEvent, Finished, SynthesisRequest

HOLD = "held until cancelled"  # the marker `tests.support.held_server` holds


class HoldGate:
    """The engine API of `inner`, except that requests with `marker` in their text are held."""

    def __init__(self, inner: Any, marker: str):
        self._inner = inner
        self._marker = marker
        self._lock = threading.Lock()
        self._held: dict[str, Any] = {}  # request id -> its sink

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def submit(self, request: SynthesisRequest, sink) -> Accepted:
        if self._marker not in request.text:
            return self._inner.submit(request, sink)
        accepted = self._inner.submit(request, _ignore)  # validated and planned for real
        self._inner.cancel(request.request_id)  # then held here instead of run
        with self._lock:
            self._held[request.request_id] = sink
        return accepted

    def cancel(self, request_id: str) -> None:
        with self._lock:
            sink = self._held.pop(request_id, None)
        if sink is None:
            self._inner.cancel(request_id)
        else:
            sink(Finished(request_id, "cancelled"))

    def stop(self, *args: Any, **kwargs: Any) -> None:
        with self._lock:
            held, self._held = self._held, {}
        for request_id, sink in held.items():
            sink(Finished(request_id, "cancelled"))
        self._inner.stop(*args, **kwargs)


def _ignore(event: EngineEvent) -> None:
    """The real engine's events of a held request (its cancellation) go nowhere."""
