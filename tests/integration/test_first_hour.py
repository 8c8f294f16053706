"""What a new user meets in their first hour, through a real server: errors that say what is
close to the name they got wrong and how to find the right one (the WebSocket and HTTP alike),
and word timestamps that show the word as written where the pronunciation lexicon said it
otherwise."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.support.chorus_client import Session, request_once, stream_once

FAST = {"num_step": 2, "seed": 6}


@pytest.fixture(scope="module")
def server(start_inproc, tmp_path_factory):
    s = start_inproc(tmp_path_factory.mktemp("first-hour"))
    yield s
    s.stop()


def test_an_unknown_name_says_what_is_close_on_both_doors(server):
    async def frames() -> list[dict]:
        session = await Session.open(server.ws_url)
        try:
            await session.send({"type": "synthesise", "id": "t1", "text": "Hi."})
            typo = await session.expect_error("bad_message", "t1")
            await session.send({"type": "synthesize", "id": "t2", "text": "Hi.", "options": {"num_steps": 4}})
            field = await session.expect_error("invalid_request", "t2")
            await session.synthesize("t3", "Hi.", voice="aloy", options=FAST)
            voice = (await session.collect(["t3"]))["t3"].end
            return [typo, field, voice]
        finally:
            await session.close()

    typo, field, voice = asyncio.run(frames())
    assert typo["id"] == "t1" and "did you mean 'synthesize'?" in typo["message"], typo
    assert field["field"] == "options.num_steps" and "did you mean 'num_step'?" in field["message"], field
    assert voice["code"] == "voice_not_found" and "did you mean 'alloy'?" in voice["message"], voice
    assert "GET /v1/voices" in voice["message"]

    url = server.url + "/v1/audio/speech"
    http_voice = httpx.post(url, json={"input": "Hi.", "voice": "aloy", **FAST}, timeout=60)
    assert http_voice.status_code == 404 and "did you mean 'alloy'?" in http_voice.json()["error"]["message"]
    http_field = httpx.post(url, json={"input": "Hi.", "num_steps": 4}, timeout=60)
    error = http_field.json()["error"]
    assert http_field.status_code == 422 and error["field"] == "num_steps", error
    assert "did you mean 'num_step'?" in error["message"]
    wrong_method = httpx.get(url)
    assert wrong_method.status_code == 405 and "takes POST" in wrong_method.json()["error"]["message"], \
        wrong_method.text


def test_word_timestamps_show_the_word_as_written_where_the_lexicon_spoke_it_otherwise(server):
    added = [httpx.post(server.url + "/v1/pronunciations", json=entry).json()["id"] for entry in (
        {"text": "Chorus", "say": "[K AO1 R AH0 S]"}, {"text": "3M", "say": "three em"})]
    try:
        text = "I sing in a Chorus at 3M today."
        out = asyncio.run(request_once(server.ws_url, "w", text, timestamps="char", options=FAST))
        (words,) = out.of("words")
        assert [w["text"] for w in words["words"]] == text.split(), words
        assert "".join(c["text"] for c in words["chars"]) == text.replace(" ", "")
        spoken = httpx.post(server.url + "/v1/audio/speech", timeout=60, json={
            "input": text, "stream_format": "sse", "response_format": "pcm", "timestamps": "word", **FAST})
        events = [line[6:] for line in spoken.text.splitlines() if line.startswith("data: ")]
        shown = [w["text"] for e in map(json.loads, events) if e["type"] == "speech.audio.words" for w in e["words"]]
        assert shown == text.split(), shown
        streamed = asyncio.run(stream_once(server.ws_url, ["I sing in a Cho", "rus at 3M today."], timestamps="word",
                                           options=FAST))
        assert [w["text"] for f in streamed.of("words") for w in f["words"]] == text.split()
    finally:
        for entry in added:
            httpx.delete(f"{server.url}/v1/pronunciations/{entry}")


def test_a_voice_kept_from_a_short_first_sentence_keeps_its_speaker_not_its_pace(server):
    """A kept voice from "Sure!" (about a second) would plan later text about three times too
    long if its rate were taken from so little audio: it gives the speaker only."""
    kept = asyncio.run(stream_once(server.ws_url, ["Sure! "], keep_voice=True, options=FAST)).end
    assert kept["type"] == "done", kept
    text = "You are booked for tomorrow at nine in the morning."

    async def planned(**fields) -> float:
        outcome = await request_once(server.ws_url, "p", text, options=FAST, **fields)
        return sum(outcome.of("accepted")[0]["target_seconds"])

    with_voice, without = asyncio.run(planned(voice=kept["voice_id"])), asyncio.run(planned())
    assert abs(with_voice - without) <= 0.25 * without, (with_voice, without)
