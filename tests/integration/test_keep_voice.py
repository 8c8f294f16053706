"""`keep_voice`: a request's (or a stream's) speaker kept as a voice that later requests on
any connection, or another replica, can name; shown with `kept` and `expires_at`, with a
time-to-live and a cap. Real servers, a real `websockets` client and the `openai` client.
(Who may list, use and delete a kept voice: tests/integration/test_kept_voice_owners.py.)"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import numpy as np
import openai

from server.engine.model.voice_codec import voice_from_bytes
from server.voices.kept import voice_blob
from server.voices.sqlite import VoiceStore
from server.voices.store import Owner
from tests.support.chorus_client import Outcome, Session, request_once

FAST = {"num_step": 4, "seed": 11}
OWNER = Owner("addr:127.0.0.1", by_key=False)


def run(coro):
    return asyncio.run(coro)


async def synthesize(url: str, rid: str, text: str, **fields) -> Outcome:
    return await request_once(url, rid, text, **{"options": FAST, **fields})


async def stream(url: str, sid: str, pieces: list[str], seed: int = 11, **fields) -> Outcome:
    session = await Session.open(url)
    try:
        session.outcomes[sid] = Outcome(sid)
        await session.send({"type": "stream_open", "id": sid, "progress": False,
                            "options": {"num_step": 4, "seed": seed}, **fields})
        for piece in pieces:
            await session.send({"type": "stream_append", "id": sid, "text": piece})
        await session.send({"type": "stream_close", "id": sid})
        return (await session.collect([sid]))[sid]
    finally:
        await session.close()


def listed(url: str, voice_id: str) -> dict:
    """A kept voice as its id shows it: on a server without API keys its id is the only way to
    it (`GET /v1/voices` lists it to nobody)."""
    assert voice_id not in [v["id"] for v in httpx.get(url + "/v1/voices").json()["voices"]]
    response = httpx.get(f"{url}/v1/voices/{voice_id}")
    assert response.status_code == 200, response.text
    return response.json()


def test_a_request_keeps_its_speaker_for_later_requests_on_other_connections(chorus_server):
    before = time.time()
    first = run(synthesize(chorus_server.ws_url, "k1", "Keep this speaker for later.", keep_voice=True))
    done = first.end
    assert done["type"] == "done" and done["voice_id"].startswith("kept-"), done
    voice = listed(chorus_server.url, done["voice_id"])
    assert voice["kept"] is True and voice["builtin"] is False
    assert voice["text"] == "Keep this speaker for later."  # the first chunk's text
    assert before + 86400 - 5 <= voice["expires_at"] <= time.time() + 86400 + 1  # --kept-voice-ttl's default
    again = run(synthesize(chorus_server.ws_url, "k2", "Another turn, the same voice.", voice=done["voice_id"]))
    assert again.end["type"] == "done" and "voice_id" not in again.end and len(again.samples) > 0
    plain = run(synthesize(chorus_server.ws_url, "k3", "No voice kept."))
    assert "voice_id" not in plain.end  # only asked for


def test_a_stream_keeps_the_voice_it_gave_its_own_segments(chorus_server):
    """In automatic mode a stream's later segments are spoken with segment 0's tokens as their
    voice; the kept voice is that prompt, so a request naming it with segment 1's text and
    seed speaks exactly as segment 1 did."""
    sentences = ["The first sentence picks a voice.", "The second one keeps it."]
    out = run(stream(chorus_server.ws_url, "s1", [f"{sentences[0]} ", sentences[1]], keep_voice=True))
    done = out.end
    assert done["type"] == "done" and done["voice_id"].startswith("kept-"), done
    assert listed(chorus_server.url, done["voice_id"])["text"] == sentences[0]
    segment1 = np.concatenate([a.samples for a in out.audio if a.header["segment"] == 1])
    same = run(synthesize(chorus_server.ws_url, "r1", sentences[1], voice=done["voice_id"],
                          options={"num_step": 4, "seed": 12}))
    assert np.array_equal(same.samples, segment1)


def test_a_stream_with_no_text_has_no_voice_to_keep(chorus_server):
    out = run(stream(chorus_server.ws_url, "empty", [], keep_voice=True))
    assert out.end["type"] == "error" and out.end["field"] == "keep_voice", out.end
    assert out.end["code"] == "invalid_request"


def test_http_keeps_the_voice_in_a_header_and_the_sse_done_event(chorus_server):
    client = openai.OpenAI(base_url=chorus_server.url + "/v1", api_key="unused", max_retries=0)
    response = client.audio.speech.with_raw_response.create(
        model="tts-1", voice="alloy", input="Kept over HTTP.", response_format="wav",
        extra_body={**FAST, "keep_voice": True})
    voice_id = response.headers["x-chorus-voice-id"]
    assert listed(chorus_server.url, voice_id)["kept"] is True
    r = httpx.post(chorus_server.url + "/v1/audio/speech", timeout=120,
                   json={"input": "Kept over events.", "stream_format": "sse", "response_format": "pcm",
                         "keep_voice": True, **FAST})
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["voice_id"] == r.headers["x-chorus-voice-id"]
    spoken = client.audio.speech.create(model="tts-1", voice=voice_id, input="Using the kept voice.",
                                        response_format="pcm", extra_body=FAST)
    assert len(spoken.content) > 0
    bad = httpx.post(chorus_server.url + "/v1/audio/speech", json={"input": "x", "keep_voice": "yes"})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "keep_voice"


def test_kept_voices_expire_and_are_capped(tmp_path):
    store = VoiceStore(tmp_path)
    try:
        tokens = np.arange(8 * 50, dtype=np.int64).reshape(8, 50) % 1024
        upload = store.add("An upload", "text", 2.0, voice_blob(tokens, "text"))
        now = int(time.time())
        store.add_kept("a", 2.0, voice_blob(tokens, "a"), now + 100, OWNER, max_kept=2, max_per_owner=10)
        b = store.add_kept("b", 2.0, voice_blob(tokens, "b"), now + 200, OWNER, max_kept=2, max_per_owner=10)
        c = store.add_kept("c", 2.0, voice_blob(tokens, "c"), now + 300, OWNER, max_kept=2, max_per_owner=10)
        assert {v.id for v in store.list()} == {upload.id, b.id, c.id}  # a, closest to expiry, made room
        assert len(c.id) == len("kept-") + 32  # 128 random bits: the id is a capability
        gone = store.add_kept("gone", 2.0, voice_blob(tokens, "gone"), now - 1, OWNER, max_kept=10, max_per_owner=10)
        assert store.get(gone.id) is None and store.load(gone.id) is None  # expired: not served
        assert gone.id not in [v.id for v in store.list()]
        prompt = voice_from_bytes(store.load(b.id))
        assert prompt.text == "b" and prompt.rms is None and np.array_equal(prompt.tokens.numpy(), tokens)
    finally:
        store.close()


def test_a_library_made_before_kept_voices_opens_and_keeps_its_voices(tmp_path):
    import sqlite3

    (tmp_path / "tokens").mkdir()
    db = sqlite3.connect(tmp_path / "index.sqlite3")
    db.execute("CREATE TABLE voices (id TEXT PRIMARY KEY, name TEXT NOT NULL, text TEXT NOT NULL, "
               "seconds REAL NOT NULL, created_at INTEGER NOT NULL)")
    db.execute("INSERT INTO voices VALUES ('old-00000000', 'Old', 'text', 1.0, 1)")
    db.commit()
    db.close()
    (tmp_path / "tokens" / "old-00000000.npz").write_bytes(b"stored")
    store = VoiceStore(tmp_path)
    try:
        old = store.get("old-00000000")
        assert old is not None and old.kept is False and old.expires_at is None
        assert store.add_kept("new", 1.0, b"blob", int(time.time()) + 60, OWNER, 5, 5).kept is True
    finally:
        store.close()


def test_a_voice_kept_on_one_replica_is_used_on_another(start_inproc, tmp_path, postgres_dsn):
    a = start_inproc(tmp_path / "a", "--voices-db", postgres_dsn, "--max-kept-voices", "2")
    b = start_inproc(tmp_path / "b", "--voices-db", postgres_dsn)
    try:
        kept = run(synthesize(a.ws_url, "k", "Kept on replica a.", keep_voice=True)).end["voice_id"]
        assert listed(b.url, kept)["kept"] is True
        used = run(synthesize(b.ws_url, "u", "Spoken on replica b.", voice=kept))
        assert used.end["type"] == "done" and len(used.samples) > 0
        for i in range(2):  # a's cap of 2: the oldest kept voice makes room
            run(synthesize(a.ws_url, f"m{i}", "One more kept voice.", keep_voice=True))
        assert httpx.get(f"{b.url}/v1/voices/{kept}").status_code == 404
        evicted = run(synthesize(b.ws_url, "e", "Spoken with an evicted voice.", voice=kept))  # b used it just now
        assert evicted.end["type"] == "error" and evicted.end["code"] == "voice_not_found", evicted.end
    finally:
        a.stop()
        b.stop()


