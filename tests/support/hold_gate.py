"""Requests that stay in flight, doing no work, until they are cancelled.

Behind a `HoldGate`, every request whose text contains the marker is checked and accepted by
the real engine as usual, then held here: it emits nothing and never ends by itself; a cancel
(the client's, the drain's `cancel_all`, or the engine stopping) ends it with `cancelled`.
Shutdown tests use it for work that outlasts any drain, whatever the machine's speed, instead
of a time margin (`tests.support.held_server` serves an app built with it). A `ReleaseGate`
lets such a request run but keeps its events until the test releases them: it holds its
place in the server's queue exactly as long as the test needs.
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


class ReleaseGate:
    """The engine API of `inner`; a request with `marker` in its text runs as usual, but its
    events wait here until `release()`, so to the server it stays in flight (holding its place
    in the queue) for as long as a test needs, whatever the machine's speed. `texts` lists the
    text of every request the server submitted, in order."""

    def __init__(self, inner: Any, marker: str):
        self._inner = inner
        self._marker = marker
        self._lock = threading.Lock()
        self._kept: list[tuple[Any, EngineEvent]] = []
        self._released = False
        self.texts: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def submit(self, request: SynthesisRequest, sink) -> Accepted:
        with self._lock:
            self.texts.append(request.text)
        if self._marker not in request.text:
            return self._inner.submit(request, sink)

        def keep(event: EngineEvent) -> None:  # engine thread; the sink only schedules delivery
            with self._lock:
                if self._released:
                    sink(event)
                else:
                    self._kept.append((sink, event))

        return self._inner.submit(request, keep)

    def release(self) -> None:
        """Deliver what was kept, in order; later events pass straight through."""
        with self._lock:  # under the lock: no later event overtakes a kept one
            self._released = True
            for sink, event in self._kept:
                sink(event)
            self._kept.clear()
