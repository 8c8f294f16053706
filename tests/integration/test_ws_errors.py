"""Every error code of the protocol, each produced against a real server; after each, the
connection and the requests already in flight carry on. (`internal`, an engine failure,
is in test_service.py and test_voices_api.py.)"""

from __future__ import annotations

import asyncio
import base64
import io

import httpx
import pytest
import soundfile as sf
import websockets

from tests.conftest import make_reference_clip
from tests.support.chorus_client import Session, check_request

HEAVY = {"options": {"num_step": 64, "duration": 20.0}, "progress": True}
KEY = "sekrit-key"


def run(coro):
    return asyncio.run(coro)


def wav_b64(seconds: float = 1.5) -> str:
    buf = io.BytesIO()
    sf.write(buf, make_reference_clip(seconds), 16000, format="WAV", subtype="PCM_16")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def tight_server(start_inproc, tmp_path_factory):
    """A server with an API key and small limits."""
    server = start_inproc(tmp_path_factory.mktemp("tight"), "--api-key", KEY,
                          "--max-queue", "3", "--max-inflight", "2", "--max-text-chars", "200")
    yield server
    server.stop()


BAD_FRAMES = [  # (frame, the id its error carries, message prefix)
    ("not json", None, "not valid JSON"),
    ("[1, 2]", None, "a message must be a JSON object"),
    ('{"id": "x"}', "x", "type: required"),
    ('{"type": "launch"}', None, "type: unknown message type 'launch'"),
    ('{"type": "synthesise", "id": "y"}', "y", "type: unknown message type 'synthesise' (did you mean 'synthesize'?)"),
]

INVALID = [  # (id, fields, message prefix)
    ("e1", {"options": {"num_step": 0}}, "options.num_step: must be an integer 1..64"),
    ("e2", {"options": {"num_steps": 8}}, "options.num_steps: unknown field (did you mean 'num_step'?)"),
    ("e3", {"text": "  "}, "text: must not be empty"),
    ("e4", {"voice": "someone", "reference": {"audio": "AAAA", "text": "hi"}}, "reference: voice and reference"),
    ("e5", {"instruct": "purple dragon voice"}, "instruct: "),
    ("e6", {"reference": {"audio": "%%% not base64 %%%", "text": "hi"}}, "reference.audio: not valid base64"),
    ("e7", {"reference": {"audio": base64.b64encode(b"garbage" * 50).decode(), "text": "hi"}},
     "reference.audio: not a readable wav, flac, ogg or mp3 file"),
    ("e8", {"reference": {"audio": wav_b64()}}, "reference.text: a transcript is required"),
    ("e9", {"encoding": "mp3"}, "encoding: must be one of pcm_s16le, f32le"),
    ("e10", {"options": {"seed": 2**70}}, "options.seed: must be a 64-bit integer"),
]


def test_bad_frames_and_invalid_requests_leave_everything_else_working(chorus_server):
    async def go():
        s = await Session.open(chorus_server.ws_url)
        await s.synthesize("keep", "Keep going while others fail.", options={"num_step": 32, "duration": 8.0})
        await s.wait_for("keep", "accepted")
        # duplicate_id: "keep" is in flight on this connection
        await s.send({"type": "synthesize", "id": "keep", "text": "again"})
        dup = await s.expect_error("duplicate_id", "keep")
        bad = []
        for frame, rid, _ in BAD_FRAMES:
            await s.send(frame)
            bad.append(await s.expect_error("bad_message", rid))
        await s.ws.send(b"\x00\x01binary")
        bad.append(await s.expect_error("bad_message", None))
        invalid = []
        for rid, fields, _ in INVALID:
            await s.send({"type": "synthesize", "id": rid, "text": "Hello.", **fields})
            invalid.append(await s.expect_error("invalid_request", rid))
        await s.send({"type": "synthesize", "id": "v1", "text": "Hello.", "voice": "no-such-voice-1234"})
        missing = await s.expect_error("voice_not_found", "v1")
        await s.send({"type": "synthesize", "id": "t1", "text": "x" * 5001})
        too_long = await s.expect_error("text_too_long", "t1")
        await s.send({"type": "synthesize", "id": "../x", "text": "hi"})
        bad_id = await s.expect_error("invalid_request", "../x")
        # the connection still works: a new request, and the one in flight all along
        await s.synthesize("after", "Still here.", options={"num_step": 4})
        out = await s.collect(["keep", "after"])
        await s.close()
        return dup, bad, invalid, missing, too_long, bad_id, out

    dup, bad, invalid, missing, too_long, bad_id, out = run(go())
    assert dup["message"] == "id: 'keep' is already in flight on this connection"
    for frame, (_, rid, message) in zip(bad, BAD_FRAMES + [(None, None, "binary frames are not accepted")]):
        assert frame["id"] == rid and frame["message"].startswith(message), frame
    for frame, (rid, _, message) in zip(invalid, INVALID):
        assert frame["id"] == rid and frame["message"].startswith(message), frame
    assert missing["message"].startswith("voice: no voice 'no-such-voice-1234'; GET /v1/voices lists"), missing
    assert too_long["message"] == "text: 5001 characters, over the limit of 5000"
    assert bad_id["message"].startswith("id: must be 1-64 characters")
    check_request(out["keep"], num_step=32)
    check_request(out["after"], num_step=4)


def test_unauthorized(tight_server):
    async def refused(**kwargs):
        async with websockets.connect(tight_server.ws_url, **kwargs) as ws:
            frame = await ws.recv()
            with pytest.raises(websockets.ConnectionClosed) as info:
                await ws.recv()
            return frame, info.value.rcvd.code

    for kwargs in ({}, {"additional_headers": {"Authorization": "Bearer wrong"}}):
        frame, code = run(refused(**kwargs))
        assert code == 1008
        assert '"code":"unauthorized"' in frame and '"id":null' in frame

    async def accepted(url, **kwargs):
        s = await Session.open(url, **kwargs)
        await s.close()
        return s.ready["type"]

    assert run(accepted(tight_server.ws_url, additional_headers={"Authorization": f"Bearer {KEY}"})) == "ready"
    assert run(accepted(tight_server.ws_url + f"?api_key={KEY}")) == "ready"

    r = httpx.get(tight_server.url + "/v1/voices")
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    r = httpx.post(tight_server.url + "/v1/audio/speech", json={"input": "hi"},
                   headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert httpx.get(tight_server.url + "/v1/voices", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert httpx.get(tight_server.url + "/healthz").status_code == 200  # probes need no key


def test_connection_and_server_limits(tight_server):
    auth = {"additional_headers": {"Authorization": f"Bearer {KEY}"}}

    async def go():
        a = await Session.open(tight_server.ws_url, **auth)
        b = await Session.open(tight_server.ws_url, **auth)
        await a.occupy(["a1", "a2"], "Hello there.", **HEAVY)
        await a.send({"type": "synthesize", "id": "a3", "text": "One too many."})
        many = await a.expect_error("too_many_requests", "a3")
        await b.synthesize("b1", "Hello there.", **HEAVY)
        await b.wait_for("b1", "progress")
        await b.send({"type": "synthesize", "id": "b2", "text": "The queue is full."})
        busy = await b.expect_error("busy", "b2")
        await b.send({"type": "synthesize", "id": "b3", "text": "x" * 201})
        long = await b.expect_error("text_too_long", "b3")
        for s, rid in ((a, "a1"), (a, "a2"), (b, "b1")):
            await s.send({"type": "cancel", "id": rid})
        ends = {**await a.collect(["a1", "a2"]), **await b.collect(["b1"])}
        await b.synthesize("b4", "Room again.", options={"num_step": 3})
        after = (await b.collect(["b4"]))["b4"]
        await a.close()
        await b.close()
        return many, busy, long, ends, after

    many, busy, long, ends, after = run(go())
    assert many["message"] == "this connection already has 2 requests in flight (limit 2)"
    assert busy["message"] == "the server has 3 requests queued; try again later"
    assert long["message"] == "text: 201 characters, over the limit of 200"
    assert {rid: o.end["type"] for rid, o in ends.items()} == {"a1": "cancelled", "a2": "cancelled", "b1": "cancelled"}
    check_request(after, num_step=3)
