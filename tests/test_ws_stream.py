"""The WebSocket protocol against a real `chorus serve`: a request's frames, cancel,
disconnect, ping, and the frame-size limit."""

from __future__ import annotations

import asyncio

import pytest
import websockets

from tests.chorus_client import Session, check_request, metric_value

# a request that runs for seconds on the tiny model (64 steps over a 20 s canvas), so it is
# surely still in flight when the test acts on it
HEAVY = {"options": {"num_step": 64, "duration": 20.0}}


def run(coro):
    return asyncio.run(coro)


def test_ready_and_one_request_of_each_kind(chorus_server):
    async def go():
        s = await Session.open(chorus_server.ws_url)
        assert s.ready == {"type": "ready", "protocol": 1, "model": "omnivoice-random-demo", "sample_rate": 24000,
                           "encodings": ["pcm_s16le", "f32le", "mulaw", "alaw", "opus"],
                           "sample_rates": [8000, 16000, 22050, 24000, 44100, 48000],
                           "limits": {"max_text_chars": 5000, "max_inflight": 16, "max_num_step": 64}}
        await s.synthesize("plain", "Hello there. How are you?", options={"num_step": 6})
        await s.synthesize("chunks", "One sentence here. Another one follows. And a third.",
                           encoding="f32le", options={"num_step": 5, "chunk_threshold": 0, "chunk_seconds": 1.0})
        await s.synthesize("whole", "One sentence here. Another one follows.", stream="whole", progress=False,
                           options={"num_step": 4, "chunk_threshold": 0, "chunk_seconds": 1.0})
        await s.synthesize("design", "Hi.", instruct="female, low pitch", language="en",
                           options={"num_step": 3, "guidance_scale": 0, "speed": 1.5})
        out = await s.collect()
        await s.close()
        return out

    out = run(go())
    check_request(out["plain"], num_step=6)
    check_request(out["chunks"], num_step=5, encoding="f32le")
    assert out["chunks"].of("accepted")[0]["chunks"] > 1
    check_request(out["whole"], num_step=4, stream="whole", progress=False)
    assert out["whole"].of("accepted")[0]["chunks"] > 1 and out["whole"].end["chunks"] == 1
    check_request(out["design"], num_step=3)


def test_ping_and_cancel(chorus_server):
    async def go():
        s = await Session.open(chorus_server.ws_url)
        await s.send({"type": "ping"})
        assert await s.next_frame() == {"type": "pong"}
        await s.synthesize("r1", "Hello there.", **HEAVY)
        await s.wait_for("r1", "progress")
        await s.send({"type": "cancel", "id": "r1"})
        await s.send({"type": "cancel", "id": "never-sent"})  # not in flight: ignored
        first = (await s.collect(["r1"]))["r1"]
        # the id is free again once its request ended
        await s.synthesize("r1", "Hello again.", options={"num_step": 4})
        second = (await s.collect(["r1"]))["r1"]
        await s.send({"type": "ping"})
        pong = await s.next_frame()
        await s.close()
        return first, second, pong, s.unmatched

    first, second, pong, unmatched = run(go())
    assert first.frames[0]["type"] == "accepted" and first.end == {"type": "cancelled", "id": "r1"}
    assert not first.of("done") and not first.audio
    check_request(second, num_step=4)
    assert pong == {"type": "pong"} and unmatched == []


def test_disconnect_cancels_the_connections_work(chorus_server):
    url = chorus_server.url
    cancelled = metric_value(url, "chorus_requests_total", endpoint="stream", outcome="cancelled")

    async def go():
        s = await Session.open(chorus_server.ws_url)
        await s.synthesize("a", "Hello there.", **HEAVY)
        await s.synthesize("b", "Goodbye now.", **HEAVY)
        await s.wait_for("a", "progress")
        await s.close()

    run(go())
    chorus_server.wait_for(
        lambda: metric_value(url, "chorus_requests_total", endpoint="stream", outcome="cancelled") == cancelled + 2,
        "both requests cancelled after the disconnect")
    assert metric_value(url, "chorus_inflight_requests") == 0


def test_frame_over_the_size_limit_closes_1009_and_cancels(chorus_server):
    url = chorus_server.url
    cancelled = metric_value(url, "chorus_requests_total", endpoint="stream", outcome="cancelled")

    async def go():
        s = await Session.open(chorus_server.ws_url)
        await s.synthesize("a", "Hello there.", **HEAVY)
        await s.wait_for("a", "progress")
        with pytest.raises(websockets.ConnectionClosed) as info:  # the close may come while it is sent
            await s.send('{"type": "ping", "pad": "' + "x" * (17 * 1024 * 1024) + '"}')
            while True:
                await s.next_frame()
        assert info.value.rcvd is not None and info.value.rcvd.code == 1009
        # the client may reconnect
        again = await Session.open(chorus_server.ws_url)
        await again.synthesize("b", "Hello.", options={"num_step": 3})
        out = await again.collect()
        await again.close()
        return out

    out = run(go())
    check_request(out["b"], num_step=3)
    chorus_server.wait_for(
        lambda: metric_value(url, "chorus_requests_total", endpoint="stream", outcome="cancelled") == cancelled + 1,
        "the in-flight request cancelled after the 1009 close")
