"""Built-in voices (OpenAI's names) are one speaker: made once from a fixed design and seed,
kept in the voice store, shared by concurrent requests, the same tokens after a restart and
on another replica."""

from __future__ import annotations

import sqlite3
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from server.voices.builtin import DESIGNS, model_key, store_key
from tests.support.serverproc import ChorusServer

FAST = {"num_step": 4, "seed": 9}


def speak(server: ChorusServer, voice: str, text: str) -> bytes:
    r = httpx.post(server.url + "/v1/audio/speech", json={"input": text, "voice": voice, "response_format": "pcm",
                                                         **FAST}, timeout=180)
    assert r.status_code == 200, r.text
    return r.content


def stored(server: ChorusServer) -> dict[str, bytes]:
    with sqlite3.connect(server.voices_dir / "index.sqlite3") as db:
        return dict(db.execute("SELECT key, blob FROM builtin_voices").fetchall())


@pytest.fixture(scope="module")
def servers(tiny_checkpoint, tmp_path_factory):
    started = []

    def start(name: str) -> ChorusServer:
        server = ChorusServer(tiny_checkpoint, tmp_path_factory.mktemp(name)).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def test_one_name_one_speaker_across_requests_restarts_and_replicas(servers, tiny_checkpoint):
    first = servers("first")
    with ThreadPoolExecutor(2) as pool:  # two first requests at once: one voice is made
        a, b = pool.map(lambda text: speak(first, "Verse", text), ["One line here.", "Another line there."])
    assert a and b
    assert first.log().count("built-in voice made") == 1
    key = store_key(model_key(str(tiny_checkpoint), "omnivoice-random-demo"), "verse")
    kept = stored(first)
    assert list(kept) == [key]

    again = speak(first, "verse", "One line here.")
    assert again == a  # the same reference, the same seed: the same audio

    first.restart()
    assert speak(first, "verse", "One line here.") == a
    assert stored(first) == kept and "built-in voice made" not in first.log()

    replica = servers("replica")  # its own store: it makes the voice itself, to the same tokens
    assert speak(replica, "verse", "One line here.") == a
    assert stored(replica) == kept

    other = speak(first, "ash", "One line here.")
    assert other != a and len(DESIGNS) == 13


def test_websocket_accepts_builtin_names(chorus_server):
    import asyncio
    import json

    import websockets

    server = chorus_server

    async def run() -> list[dict]:
        async with websockets.connect(server.ws_url) as ws:
            ready = json.loads(await ws.recv())
            assert "mulaw" in ready["encodings"] and 8000 in ready["sample_rates"]
            await ws.send(json.dumps({"type": "synthesize", "id": "r1", "text": "Hello.", "voice": "marin",
                                      "options": {"num_step": 4}}))
            await ws.send(json.dumps({"type": "synthesize", "id": "r2", "text": "Hello.", "voice": "nobody"}))
            seen = []
            while len([m for m in seen if m.get("type") in ("done", "error")]) < 2:
                frame = await ws.recv()
                seen.append({"type": "audio"} if isinstance(frame, bytes) else json.loads(frame))
            return seen

    seen = asyncio.run(run())
    assert {"type": "audio"} in seen
    assert any(m.get("type") == "done" and m["id"] == "r1" for m in seen)
    assert any(m.get("type") == "error" and m["id"] == "r2" and m["code"] == "voice_not_found" for m in seen)
