"""Text streams at their edges, through a real server: a frame after `stream_close` does not
cost the text that came before it, and the stream's audio cap counts the audio sent, not the
plans (which a segment's finished audio can outgrow)."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.chorus_client import Session
from tests.support.health_probe import NO_HANG_S

FAST = {"num_step": 2, "seed": 4}


def test_a_frame_after_close_costs_nothing_spoken_before_it(chorus_server):
    async def go():
        session = await Session.open(chorus_server.ws_url)
        try:
            await session.stream("s", ["The first sentence is complete. ", "And then a partial one"], options=FAST)
            await session.send({"type": "stream_append", "id": "s", "text": " that came too late."})
            return (await asyncio.wait_for(session.collect(["s"]), NO_HANG_S))["s"]
        finally:
            await session.close()

    out = asyncio.run(go())
    assert [seg["text"] for seg in out.of("segment")] == ["The first sentence is complete.", "And then a partial one"]
    assert {a.header["segment"] for a in out.audio} == {0, 1}
    end = out.end
    assert end["type"] == "error" and end["code"] == "invalid_request" and end["field"] == "type", end
    assert "stream_append after stream_close" in end["message"]


@pytest.fixture
def capped(start_inproc, tmp_path):
    server = start_inproc(tmp_path, "--max-audio-seconds", "8")
    yield server
    server.stop()


def test_the_stream_audio_cap_counts_what_is_sent(capped):
    """Each "Hi" plans 0.8 s and comes out longer (its padding): counting plans would let
    ten of them through, ten seconds against the cap of eight."""

    async def go():
        session = await Session.open(capped.ws_url)
        try:
            await session.stream("s", [], close=False, options=FAST)
            for index in range(30):  # one at a time: each is heard before the next is written
                await session.send({"type": "stream_append", "id": "s", "text": "Hi"})
                await session.send({"type": "stream_flush", "id": "s"})
                while True:
                    frame = await asyncio.wait_for(session.next_frame(), NO_HANG_S)
                    session.outcomes["s"].frames.append(frame)
                    if isinstance(frame, dict) and frame["type"] in ("segment", "error", "done"):
                        break
                if frame["type"] != "segment":
                    return session.outcomes["s"], index
            raise AssertionError("the stream was never capped")
        finally:
            await session.close()

    out, written = asyncio.run(go())
    assert out.end["type"] == "error" and out.end["code"] == "stream_too_long", out.end
    rate = out.audio[0].header["sample_rate"]
    sent = sum(a.header["samples"] for a in out.audio) / rate
    assert 0 < sent <= 8.0, (sent, written)
