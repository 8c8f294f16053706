"""The WebSocket protocol against a real `chorus serve`: a request's frames, cancel,
disconnect, ping, and the frame-size limit."""

from __future__ import annotations

import asyncio
import json
import os
import struct

from tests.support.chorus_client import Outcome, Session, check_request, metric_value
from tests.support.raw_ws import connect_ws, masked_text_frame, read_frame, text_frame_header

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
                           "limits": {"max_text_chars": 5000, "max_inflight": 16, "max_num_step": 64,
                                      "max_audio_seconds": 1800.0, "max_dialogue_lines": 100,
                                      "max_dialogue_chars": 20000}}
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


def test_a_cancel_read_with_its_request_still_ends_it_once(chorus_server):
    """A request and its cancel in one write: the server reads both before the request's turn has
    taken a step, and the request still ends, once, as cancelled (it once never ended)."""
    async def go():
        s = await Session.open(chorus_server.ws_url)
        try:
            for k in range(3):
                rid = f"quick{k}"
                s.outcomes[rid] = Outcome(rid)
                s.ws.protocol.send_text(json.dumps({"type": "synthesize", "id": rid, "text": "Hello there.",
                                                    "options": {"num_step": 4}}).encode())
                s.ws.protocol.send_text(json.dumps({"type": "cancel", "id": rid}).encode())
                s.ws.transport.write(b"".join(s.ws.protocol.data_to_send()))  # both frames in one write
            return await asyncio.wait_for(s.collect(), 60)
        finally:
            await s.close()

    out = run(go())
    for k in range(3):
        frames = out[f"quick{k}"].frames
        ends = [f["type"] for f in frames if isinstance(f, dict) and f["type"] in ("done", "cancelled", "error")]
        assert ends == ["cancelled"], frames


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
    port = int(url.rsplit(":", 1)[1])
    sock = connect_ws(port)
    try:
        sock.sendall(masked_text_frame(json.dumps({"type": "synthesize", "id": "a", "text": "Hello there.",
                                                   **HEAVY})))
        while b'"progress"' not in read_frame(sock)[1]:  # the request is in flight
            pass
        # Only the header of a 17 MiB frame: the server refuses it from its announced length,
        # so the close cannot race a payload still being sent.
        sock.sendall(text_frame_header(17 * 1024 * 1024, os.urandom(4)) + b"x" * 1024)
        opcode, payload = read_frame(sock)
        while opcode != 0x8:  # frames already queued before the close
            opcode, payload = read_frame(sock)
        assert struct.unpack("!H", payload[:2])[0] == 1009
    finally:
        sock.close()

    async def again():  # the client may reconnect
        s = await Session.open(chorus_server.ws_url)
        await s.synthesize("b", "Hello.", options={"num_step": 3})
        out = await s.collect()
        await s.close()
        return out

    check_request(run(again())["b"], num_step=3)
    chorus_server.wait_for(
        lambda: metric_value(url, "chorus_requests_total", endpoint="stream", outcome="cancelled") == cancelled + 1,
        "the in-flight request cancelled after the 1009 close")
