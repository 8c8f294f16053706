"""`/healthz` probed back to back on a thread while a test attacks the server: the slowest
answer says whether the event loop was held."""

from __future__ import annotations

import threading
import time

import httpx

NO_HANG_S = 120


class HealthProbe:
    """`GET /healthz` back to back on a thread, from start to stop: the slowest answer."""

    def __init__(self, url: str):
        self.url = url
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=NO_HANG_S) as http:
            while not self._stop.is_set():
                began = time.perf_counter()
                assert http.get(self.url + "/healthz").status_code == 200
                self.latencies.append(time.perf_counter() - began)
                time.sleep(0.005)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        while not self.latencies:  # the probe is live before the frame goes out
            time.sleep(0.005)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(NO_HANG_S)

    @property
    def slowest(self) -> float:
        return max(self.latencies)
