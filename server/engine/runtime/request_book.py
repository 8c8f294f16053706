"""The engine's book of requests: the ids in flight and the gate that refuses new ones (any
thread, under `lock`), and each request's state and events (the engine thread)."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from server.engine.types import SHUTTING_DOWN, ChunkAudio, EngineEvent, RequestRejected
from server.engine.work import RequestState

log = logging.getLogger("chorus.engine")


class RequestBook:
    def __init__(self, sample_rate: int):
        self.sample_rate = sample_rate
        self.lock = threading.Lock()
        self.live_ids: set[str] = set()  # accepted, not yet ended (under the lock)
        self.states: dict[str, RequestState] = {}  # admitted by the engine thread
        self.closed = False  # the engine thread has exited: queued commands would never run
        self._seq = 0

    def refuse_if_closed_or_live(self, request_id: str, accepting: bool) -> None:
        """Under the lock: refuse when shutting down (`busy`) or when the id is in flight."""
        if self.closed or not accepting:
            raise RequestRejected(SHUTTING_DOWN, code="busy")
        if request_id in self.live_ids:
            raise RequestRejected(f"id: {request_id!r} is already in flight", field="id", code="duplicate_id")

    def wait_until_empty(self, timeout: float, poll_s: float = 0.02) -> bool:
        """Wait up to `timeout` s for no request to be in flight (True if none was)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if not self.live_ids:
                    return True
            time.sleep(poll_s)
        return False

    def next_seq(self) -> int:
        """Under the lock: the arrival order the scheduler queues by."""
        self._seq += 1
        return self._seq - 1

    def emit(self, state: RequestState, event: EngineEvent) -> None:
        try:
            state.sink(event)  # type: ignore[operator]
        except Exception:  # a consumer's bug must not stop the engine
            log.exception("request %s: event sink failed", state.request_id)

    def send_audio(self, state: RequestState, chunk: int, audio: np.ndarray, final: bool) -> None:
        if state.first_audio_at is None:
            state.first_audio_at = time.perf_counter()
        state.audio_samples += int(audio.shape[-1])
        self.emit(state, ChunkAudio(state.request_id, chunk, audio, self.sample_rate, final))

    def end(self, state: RequestState, outcome: str, message: str | None) -> None:
        """The request's one terminal event; its id is free again."""
        self.states.pop(state.request_id, None)
        with self.lock:
            self.live_ids.discard(state.request_id)
        self.emit(state, state.ended(outcome, message, self.sample_rate))
