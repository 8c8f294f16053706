"""The pronunciation lexicon: `/v1/pronunciations` through a real server, stored with the voice
library (SQLite and PostgreSQL), applied to whole words before synthesis and before
normalisation, per voice where an entry names one. What the engine was given is read back
through `keep_voice` (a kept voice's text is the text its first chunk spoke)."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from server.text.lexicon import apply
from server.voices import PronunciationTaken
from server.voices.sqlite import VoiceStore
from tests.support.chorus_client import Outcome, Session, stream_once

FAST = {"num_step": 4, "seed": 31}
CHORUS = "[K AO1 R AH0 S]"


def test_whole_words_case_blind_longest_first_brackets_untouched():
    pairs = (("Chorus", CHORUS), ("New York", "the big apple"), ("York", "Yorkshire"))
    assert apply("Chorus, chorus! CHORUS choruses [Chorus]", pairs) == \
        f"{CHORUS}, {CHORUS}! {CHORUS} choruses [Chorus]"
    assert apply("From New  York to York.", pairs) == "From the big apple to Yorkshire."
    assert apply("语音合成很好", (("合成", "HE2 CHENG2"),)) == "语音HE2 CHENG2很好"  # CJK: no word breaks


def _store_contract(store) -> None:
    a = store.add_pronunciation("Chorus", CHORUS, None)
    b = store.add_pronunciation("Chorus", "Korus", "alloy")  # the same text for one voice: its own entry
    with pytest.raises(PronunciationTaken) as taken:
        store.add_pronunciation("chorus", "again", None)
    assert taken.value.existing == a and a.id in str(taken.value)
    assert store.list_pronunciations() == [a, b]
    assert store.delete_pronunciation(a.id) and not store.delete_pronunciation(a.id)
    assert store.list_pronunciations() == [b]


def test_sqlite_library_keeps_the_lexicon(tmp_path):
    store = VoiceStore(tmp_path)
    try:
        _store_contract(store)
    finally:
        store.close()
    reopened = VoiceStore(tmp_path)  # it survives a restart
    try:
        assert [e.say for e in reopened.list_pronunciations()] == ["Korus"]
    finally:
        reopened.close()


def test_postgres_library_keeps_the_lexicon_for_every_replica(postgres_replicas):
    a, b = postgres_replicas
    _store_contract(a)
    assert b.list_pronunciations() == a.list_pronunciations()


def test_http_api_adds_lists_and_deletes_with_clear_errors(chorus_server):
    url = chorus_server.url + "/v1/pronunciations"
    created = httpx.post(url, json={"text": "  Kubernetes ", "say": "koo-ber-net-eez"})
    assert created.status_code == 201, created.text
    entry = created.json()
    assert entry == {"id": entry["id"], "text": "Kubernetes", "say": "koo-ber-net-eez", "voice": None}
    assert entry in httpx.get(url).json()["pronunciations"]
    cases = [
        (httpx.post(url, json={"text": "kubernetes", "say": "x"}), 409, "name_taken", "text"),
        (httpx.post(url, json={"text": "Chorus", "say": "[K AO R AH0 S]"}), 422, "invalid_request", "say"),
        (httpx.post(url, json={"text": "Chorus", "say": "x", "voice": "nobody"}), 404, "voice_not_found", "voice"),
        (httpx.post(url, json={"text": "[x]", "say": "x"}), 422, "invalid_request", "text"),
        (httpx.post(url, json={"text": "x", "say": ""}), 422, "invalid_request", "say"),
        (httpx.post(url, json={"text": "x", "say": "y", "extra": 1}), 422, "invalid_request", "extra"),
        (httpx.post(url, content=b"{not json"), 400, "bad_message", None),
    ]
    for response, status, code, field in cases:
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["code"] == code and error.get("field") == field, error
    assert httpx.delete(f"{url}/{entry['id']}").status_code == 204
    assert httpx.delete(f"{url}/{entry['id']}").status_code == 404
    assert entry not in httpx.get(url).json()["pronunciations"]


async def _spoken(url: str, rid: str, text: str, **fields) -> Outcome:
    session = await Session.open(url)
    try:
        await session.synthesize(rid, text, **{"progress": False, "options": FAST, "keep_voice": True, **fields})
        return (await session.collect([rid]))[rid]
    finally:
        await session.close()


def _given(server, outcome: Outcome) -> str:
    assert outcome.end["type"] == "done", outcome.end
    return httpx.get(f"{server.url}/v1/voices/{outcome.end['voice_id']}").json()["text"]


@pytest.fixture
def lexicon_server(start_inproc, tmp_path):
    server = start_inproc(tmp_path)
    yield server
    server.stop()


def test_entries_reach_the_engine_per_voice_before_normalisation(lexicon_server):
    server = lexicon_server
    url = server.url + "/v1/pronunciations"
    for body in ({"text": "Chorus", "say": CHORUS}, {"text": "Chorus", "say": "Korus", "voice": "alloy"},
                 {"text": "3M", "say": "three em"}):
        assert httpx.post(url, json=body).status_code == 201
    ws = server.ws_url
    plain = asyncio.run(_spoken(ws, "a", "I sing in a Chorus."))
    assert _given(server, plain) == f"I sing in a {CHORUS}."
    written = asyncio.run(_spoken(ws, "b", f"I sing in a {CHORUS}."))
    assert np.array_equal(plain.samples, written.samples)  # the very request the lexicon made
    assert _given(server, asyncio.run(_spoken(ws, "c", "Chorus!", voice="alloy"))) == "Korus!"  # its voice's
    assert _given(server, asyncio.run(_spoken(ws, "d", "Chorus!", voice="echo"))) == f"{CHORUS}!"
    normalised = asyncio.run(_spoken(ws, "e", "3M sold 12 of them.", options={**FAST, "normalize_text": True}))
    assert _given(server, normalised) == "three em sold twelve of them."  # the entry first, then numbers

    # a stream: each segment once complete; captions as written
    out = asyncio.run(stream_once(ws, ["The Cho", "rus sings. ", "Chorus again."], keep_voice=True, options=FAST))
    assert [seg["text"] for seg in out.of("segment")] == ["The Chorus sings.", "Chorus again."]
    assert _given(server, out) == f"The {CHORUS} sings."
    spoken = httpx.post(server.url + "/v1/audio/speech", timeout=120, json={
        "input": "Chorus.", "response_format": "pcm", "keep_voice": True, **FAST})
    assert httpx.get(f"{server.url}/v1/voices/{spoken.headers['x-chorus-voice-id']}").json()["text"] == f"{CHORUS}."
