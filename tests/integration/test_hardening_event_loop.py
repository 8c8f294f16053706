"""One hostile frame must not freeze the server: while the stream segmenter, the size checks
and the instruction mapper handle the worst text a client can send in one frame (stream
appends of end marks, megabytes of sentences, long `instruct` and `instructions`),
`/healthz` keeps answering. Latency bound asked for by the issue, kept generous for a
loaded 2-core machine; each case also checks the client gets its clear answer."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.support.chorus_client import Session
from tests.support.health_probe import NO_HANG_S, HealthProbe

HEALTH_BOUND_S = 0.25  # /healthz while a frame is handled (the bar: 100 ms, here on 2 busy cores)


@pytest.fixture(scope="module")
def server(start_inproc, tmp_path_factory):
    s = start_inproc(tmp_path_factory.mktemp("event-loop"))
    yield s
    s.stop()


def _while_probed(server, frames: list[dict]) -> tuple[float, list[dict]]:
    """Send `frames` on one WebSocket while /healthz is probed; a `ping` last (its `pong`
    means every frame was handled). The slowest /healthz, and the JSON frames received."""

    async def go() -> list[dict]:
        s = await Session.open(server.ws_url)
        for frame in frames:
            await s.send(frame)
        await s.send({"type": "ping"})
        seen: list[dict] = []
        while True:
            frame = await asyncio.wait_for(s.next_frame(), NO_HANG_S)
            if isinstance(frame, dict):
                seen.append(frame)
                if frame["type"] == "pong":
                    await s.close()
                    return seen

    with HealthProbe(server.url) as probe:
        seen = asyncio.run(go())
    return probe.slowest, seen


STREAM = {"type": "stream_open", "id": "s", "options": {"num_step": 2}, "progress": False}


@pytest.mark.parametrize("text", ["." * 4999, "?" * 5000, "a." * 2500, "a. " * 1666, "(" * 4990 + "dr. ",
                                  "中" * 1666])
def test_a_full_stream_buffer_of_hostile_text_is_cut_in_linear_time(server, text):
    slowest, seen = _while_probed(server, [STREAM, {"type": "stream_append", "id": "s", "text": text},
                                           {"type": "cancel", "id": "s"}])
    assert slowest < HEALTH_BOUND_S, f"/healthz took {slowest * 1000:.0f} ms"
    assert not [f for f in seen if f["type"] == "error"], seen


def test_stream_open_text_is_cut_in_linear_time(server):
    slowest, seen = _while_probed(server, [{**STREAM, "text": "?" * 3000}, {"type": "cancel", "id": "s"}])
    assert slowest < HEALTH_BOUND_S, f"/healthz took {slowest * 1000:.0f} ms"
    assert not [f for f in seen if f["type"] == "error"], seen


def test_an_append_past_the_buffer_is_refused_before_it_is_read(server):
    big = "Hello world. " * (4 * 1024 * 1024 // 13)  # 4 MB of sentences in one frame
    slowest, seen = _while_probed(server, [STREAM, {"type": "stream_append", "id": "s", "text": big}])
    assert slowest < HEALTH_BOUND_S, f"/healthz took {slowest * 1000:.0f} ms"
    errors = [f for f in seen if f["type"] == "error"]
    assert [(e["id"], e["code"]) for e in errors] == [("s", "stream_too_long")], errors


def test_a_long_instruct_is_refused_before_it_is_read(server):
    hostile = ("a, " * (8 * 1024 * 1024 // 3))[:8 * 1024 * 1024]
    frame = {"type": "synthesize", "id": "r", "text": "Hi.", "instruct": hostile, "options": {"num_step": 2}}
    slowest, seen = _while_probed(server, [frame])
    assert slowest < HEALTH_BOUND_S, f"/healthz took {slowest * 1000:.0f} ms"
    errors = [f for f in seen if f["type"] == "error"]
    assert [(e["id"], e["code"], e.get("field")) for e in errors] == [("r", "invalid_request", "instruct")], errors


@pytest.mark.parametrize("instructions, status", [
    (("a, " * (8 * 1024 * 1024 // 3))[:8 * 1024 * 1024], 422),  # refused by its size, unread
    ("".join(f"female {i}, " for i in range(1000))[:4096], 200),  # the most the limit lets through
])
def test_long_instructions_do_not_hold_the_event_loop(server, instructions, status):
    body = json.dumps({"input": "Hi.", "instructions": instructions, "num_step": 2, "response_format": "pcm"})
    with HealthProbe(server.url) as probe:
        r = httpx.post(server.url + "/v1/audio/speech", content=body, timeout=NO_HANG_S,
                       headers={"content-type": "application/json"})
    assert r.status_code == status, r.text[:300]
    if status != 200:
        assert r.json()["error"]["field"] == "instructions"
    assert probe.slowest < HEALTH_BOUND_S, f"/healthz took {probe.slowest * 1000:.0f} ms"


def test_normalising_a_long_text_does_not_hold_the_event_loop(server):
    """WeTextProcessing keeps the GIL for its whole call (milliseconds a character, and the
    grammars load at first use): it must run outside the server's process."""
    text = "On 3/4/2020 I paid $12.50 for 3 apples at 10:30am. " * 20
    body = {"input": text, "normalize_text": True, "num_step": 2, "response_format": "pcm"}
    with HealthProbe(server.url) as probe:
        r = httpx.post(server.url + "/v1/audio/speech", json=body, timeout=NO_HANG_S)
    assert r.status_code == 200, r.text[:300]
    assert probe.slowest < HEALTH_BOUND_S, f"/healthz took {probe.slowest * 1000:.0f} ms"
