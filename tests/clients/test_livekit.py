"""`chorus_client.livekit.TTS` through LiveKit Agents' own TTS API (`stream()` with
push_text/end_input, `synthesize()`, `aclose()` for a barge-in) against a real
`chorus serve`: audio complete and in order (byte for byte the plain client's), a closed
stream cancelled on the server and the next one clean, one voice across turns, server
errors raised as LiveKit's `APIStatusError` / `APIConnectionError`."""

from __future__ import annotations

import asyncio

import pytest

from tests.clients.conftest import cancelled_requests, require_framework, stream_audio

require_framework("livekit.agents")

from chorus_client import (  # noqa: E402
    BusyError,
    ChorusClient,
    ConnectionLostError,
    livekit as chorus,
)
from livekit.agents import APIConnectionError, APIStatusError  # noqa: E402 - after the framework check
from livekit_agent import ANSWERS, llm_tokens, run_agent  # noqa: E402

RATE = 16000
SEEDED = {"num_step": 8, "seed": 13}


def expected(url: str, answer: str, **options) -> bytes:
    return stream_audio(url, answer, tokens=llm_tokens, sample_rate=RATE, options=SEEDED, **options)


def test_streaming_capability_declared():
    assert chorus.TTS(url="http://127.0.0.1:9").capabilities.streaming
    assert chorus.TTS(url="http://127.0.0.1:9", timestamps="word").capabilities.aligned_transcript


def test_stream_turns_complete_and_in_order(chorus_url):
    turns = asyncio.run(run_agent(chorus_url, ANSWERS[:2], sample_rate=RATE, options=SEEDED))
    for turn, answer in zip(turns, ANSWERS):
        assert turn.frames > 1
        assert turn.audio == expected(chorus_url, answer)


def test_synthesize_whole_text(chorus_url):
    async def go():
        tts = chorus.TTS(url=chorus_url, sample_rate=RATE, options=SEEDED)
        try:
            frame = await tts.synthesize(ANSWERS[0]).collect()
        finally:
            await tts.aclose()
        async with ChorusClient(chorus_url) as client:
            direct = await client.synthesize(ANSWERS[0], sample_rate=RATE, options=SEEDED).collect()
        return bytes(frame.data), frame.sample_rate, direct.audio

    audio, rate, direct = asyncio.run(go())
    assert rate == RATE and audio == direct


def test_barge_in_cancels_the_stream_and_the_next_starts_clean(chorus_url):
    long_answer = " ".join(ANSWERS * 3)
    before = cancelled_requests(chorus_url)
    interrupted, after = asyncio.run(run_agent(chorus_url, [long_answer, ANSWERS[2]], barge_in=[0],
                                               sample_rate=RATE, options=SEEDED))
    full = expected(chorus_url, long_answer)
    assert 0 < len(interrupted.audio) < len(full) and full.startswith(interrupted.audio)
    assert after.audio == expected(chorus_url, ANSWERS[2])
    assert cancelled_requests(chorus_url) > before


def test_one_library_voice_across_turns(chorus_url, library_voice):
    turns = asyncio.run(run_agent(chorus_url, ANSWERS[:2], sample_rate=RATE, options=SEEDED, voice=library_voice))
    for turn, answer in zip(turns, ANSWERS):
        assert turn.audio == expected(chorus_url, answer, voice=library_voice)


def test_server_errors_are_livekit_errors(chorus_url):
    async def go():
        tts = chorus.TTS(url=chorus_url, sample_rate=RATE, voice="no-such-voice")
        errors = []
        tts.on("error", errors.append)
        try:
            with pytest.raises(APIStatusError) as streamed:
                stream = tts.stream()
                stream.push_text("Hello there.")
                stream.end_input()
                async for _ in stream:
                    pass
            with pytest.raises(APIStatusError) as whole:
                await tts.synthesize("Hello there.").collect()
        finally:
            await tts.aclose()
        return streamed.value, whole.value, errors

    streamed, whole, errors = asyncio.run(go())
    for err in (streamed, whole):
        assert err.status_code == 404 and not err.retryable
        assert err.body["code"] == "voice_not_found"
    assert errors and all(not e.recoverable for e in errors)


def test_error_mapping_keeps_retry_semantics():
    busy = chorus.api_error(BusyError("full", retry_after_ms=200))
    assert isinstance(busy, APIStatusError) and busy.status_code == 503 and busy.retryable
    assert isinstance(chorus.api_error(ConnectionLostError("gone")), APIConnectionError)


def test_word_timestamps_requested(chorus_url):
    """`timestamps="word"` reaches the server: one of the third wave answers with words
    (LiveKit timed transcripts), an earlier one refuses the field by name."""
    try:
        turns = asyncio.run(run_agent(chorus_url, ANSWERS[:1], sample_rate=RATE, options=SEEDED,
                                      timestamps="word"))
    except APIStatusError as err:
        assert err.status_code == 422 and err.body.get("field") == "timestamps"
    else:
        assert [w for w, _, _ in turns[0].transcript] == ANSWERS[0].split()
