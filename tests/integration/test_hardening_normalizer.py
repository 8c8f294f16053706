"""`normalize_text` under attack, through a real server: texts the grammars take seconds on
(a run of digits) share the workers fairly, stop when their client leaves or cancels, keep a
worker's memory bounded, and a dead worker fails only the request it served. Liveness bounds
are generous (a loaded 2-core machine); before these fixes a short request waited a minute
behind two long ones, a cancel was answered when normalisation ended, and one dead worker
failed every request in flight."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import psutil
import pytest

from server.text import normalize
from server.text.normalize_workers import MAX_WORKER_RSS
from tests.support.chorus_client import Session, metric_value
from tests.support.health_probe import NO_HANG_S, HealthProbe

pytestmark = pytest.mark.skipif(not normalize.available(), reason="WeTextProcessing is not installed")
LIVE_S = 2.0  # /healthz while the grammars run
SHORT_WAIT_S = 15.0  # a short text behind long ones
FAST = {"num_step": 2, "seed": 3}


@pytest.fixture
def server(start_inproc, tmp_path):
    s = start_inproc(tmp_path)
    yield s
    s.stop()


def _workers() -> list[psutil.Process]:
    """This process's normaliser workers: the children of its grammar fork server (a child
    running `multiprocessing.forkserver`)."""
    found = []
    for child in psutil.Process().children():
        try:
            if "multiprocessing.forkserver" in " ".join(child.cmdline()):
                found += child.children()
        except psutil.Error:
            pass
    return found


async def _busiest_worker(window_s: float = 0.5) -> psutil.Process | None:
    """The worker that gained the most CPU time over the window, if any gained some. A share of
    a core would miss one: the workers run niced, and on a loaded machine a busy one may get
    only a small part of a core, while an idle one (waiting on its pipe) gets none."""

    def cpu_s(worker: psutil.Process) -> float:
        try:
            times = worker.cpu_times()
            return times.user + times.system
        except psutil.Error:
            return -1.0

    before = {w: cpu_s(w) for w in _workers()}
    await asyncio.sleep(window_s)
    gained = {w: cpu_s(w) - was for w, was in before.items() if was >= 0 and w.is_running()}
    busiest = max(gained, key=gained.get, default=None)
    return busiest if busiest is not None and gained[busiest] > 0.01 else None


def _busy(server) -> float:
    return metric_value(server.url, "chorus_normalize_workers", state="busy")


def _speak(server, text: str, **extra) -> httpx.Response:
    return httpx.post(server.url + "/v1/audio/speech", timeout=NO_HANG_S,
                      json={"input": text, "response_format": "pcm", **FAST, **extra})


def test_a_short_text_is_not_held_back_by_long_ones(server):
    assert _speak(server, "Warm up 1.").status_code == 200  # the workers' fork server is up
    long = [threading.Thread(target=_speak, args=(server, "1" * 1500)) for _ in range(2)]
    with HealthProbe(server.url) as probe:
        for thread in long:
            thread.start()
        time.sleep(1.0)  # both inside the grammars
        began = time.monotonic()
        short = _speak(server, "Hello there, 3 apples.")
        waited = time.monotonic() - began
        for thread in long:
            thread.join(NO_HANG_S)
    assert short.status_code == 200, short.text
    assert waited < SHORT_WAIT_S, f"the short text waited {waited:.1f} s"
    assert probe.slowest < LIVE_S, f"/healthz took {probe.slowest * 1000:.0f} ms"


def test_work_stops_when_its_client_leaves_or_cancels(server):
    assert _speak(server, "Warm up 2.").status_code == 200
    with pytest.raises(httpx.TimeoutException):  # the client gives up and closes its connection
        httpx.post(server.url + "/v1/audio/speech", timeout=1.0,
                   json={"input": "1" * 4000, "response_format": "pcm", **FAST})
    server.wait_for(lambda: _busy(server) == 0, "the workers to drop a request whose client left", 10)

    async def cancel() -> tuple[dict, float]:
        session = await Session.open(server.ws_url)
        try:
            await session.synthesize("n", "1" * 4000, options={**FAST, "normalize_text": True})
            await asyncio.sleep(1.0)
            sent = time.monotonic()
            await session.send({"type": "cancel", "id": "n"})
            end = (await asyncio.wait_for(session.collect(["n"]), NO_HANG_S))["n"].end
            return end, time.monotonic() - sent
        finally:
            await session.close()

    end, took = asyncio.run(cancel())
    assert end["type"] == "cancelled" and took < 3.0, (end, took)
    server.wait_for(lambda: _busy(server) == 0, "the workers to drop a cancelled request", 10)


def test_a_worker_stays_small(server):
    r = _speak(server, "1" * 3000)
    # done, past its budget, or read in time but too long to speak as one chunk: either way bounded
    assert r.status_code in (200, 413, 422), r.text
    for worker in _workers():
        assert worker.memory_info().rss < MAX_WORKER_RSS, worker.memory_info()


def test_a_dead_worker_fails_only_the_request_it_served(server):
    assert _speak(server, "Warm up 3.").status_code == 200
    text = "On 3/4/2020 I paid $12.50 for 3 apples at 10:30am, said Dr. Smith. " * 40

    async def four() -> list[dict]:
        sessions = [await Session.open(server.ws_url) for _ in range(2)]
        try:
            for i in range(4):
                await sessions[i % 2].synthesize(f"n{i}", text, options={**FAST, "normalize_text": True})
            busy = None
            for _ in range(60):  # the workers start (a fork server first), then take pieces
                busy = await _busiest_worker()
                if busy is not None:
                    break
            assert busy is not None, "no worker was busy"
            busy.kill()
            # each socket's two requests read together, both sockets at once: four long texts on a
            # loaded machine may take more than one hang bound each, so the bound is on them all
            both = await asyncio.wait_for(asyncio.gather(sessions[0].collect(["n0", "n2"]),
                                                         sessions[1].collect(["n1", "n3"])), 3 * NO_HANG_S)
            return [both[i % 2][f"n{i}"].end for i in range(4)]
        finally:
            for session in sessions:
                await session.close()

    ends = asyncio.run(four())
    failed = [end for end in ends if end["type"] == "error"]
    assert len(failed) <= 1 and sum(end["type"] == "done" for end in ends) >= 3, ends
    assert all(end["code"] == "internal" and "worker" in end["message"] for end in failed), failed
    assert _speak(server, "And 4 more.").status_code == 200  # a new worker took its place
