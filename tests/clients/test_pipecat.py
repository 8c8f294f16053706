"""`ChorusTTSService` in a real Pipecat pipeline (scripted LLM frames -> the service -> a
capturing sink; `examples/pipecat_agent.py`) against a real `chorus serve`: each turn's
audio is the same, byte for byte, as the plain client's stream of that answer; a barge-in
drops the rest of a turn at once and the server ends that stream cancelled; the next turn
starts clean; one library voice across turns; server errors arrive as `ErrorFrame`s."""

from __future__ import annotations

import asyncio

from tests.clients.conftest import cancelled_requests, require_framework, stream_audio

require_framework("pipecat")

from chorus_client import InvalidRequestError, VoiceNotFoundError  # noqa: E402
from pipecat.utils.errors import ErrorCategory  # noqa: E402 - after the framework check
from pipecat_agent import ANSWERS, llm_tokens, run_agent  # noqa: E402

RATE = 16000
SEEDED = {"num_step": 8, "seed": 11}


def expected(url: str, answer: str, **options) -> bytes:
    return stream_audio(url, answer, tokens=llm_tokens, sample_rate=RATE, options=SEEDED, **options)


def test_turns_arrive_complete_and_in_order(chorus_url):
    run = asyncio.run(run_agent(chorus_url, ANSWERS[:2], sample_rate=RATE, options=SEEDED))
    assert run.errors == []
    assert len(run.turns) == 2 and run.turns[0].context_id != run.turns[1].context_id
    for turn, answer in zip(run.turns, ANSWERS):
        assert turn.stopped
        assert bytes(turn.audio) == expected(chorus_url, answer)


def test_barge_in_drops_the_turn_at_once_and_the_next_turn_starts_clean(chorus_url):
    long_answer = " ".join(ANSWERS * 3)
    cancelled_before = cancelled_requests(chorus_url)
    run = asyncio.run(run_agent(chorus_url, [long_answer, ANSWERS[2]], barge_in=[0], sample_rate=RATE,
                                options=SEEDED))
    assert run.errors == []
    interrupted, after = run.turns
    full = expected(chorus_url, long_answer)
    assert interrupted.audio_after_interruption == 0
    assert 0 < len(interrupted.audio) < len(full) and full.startswith(bytes(interrupted.audio))
    assert bytes(after.audio) == expected(chorus_url, ANSWERS[2])
    # the server stopped the stream's segments in flight (each counts as a cancelled request)
    assert cancelled_requests(chorus_url) > cancelled_before


def test_one_library_voice_across_turns(chorus_url, library_voice):
    run = asyncio.run(run_agent(chorus_url, ANSWERS[:2], sample_rate=RATE, options=SEEDED, voice=library_voice))
    assert run.errors == []
    for turn, answer in zip(run.turns, ANSWERS):
        assert bytes(turn.audio) == expected(chorus_url, answer, voice=library_voice)
    assert bytes(run.turns[0].audio) != expected(chorus_url, ANSWERS[0])  # the voice made a difference


def test_server_errors_arrive_as_error_frames(chorus_url):
    run = asyncio.run(run_agent(chorus_url, ANSWERS[:1], sample_rate=RATE, voice="no-such-voice"))
    assert len(run.errors) == 1 and all(not t.audio for t in run.turns)
    assert isinstance(run.errors[0].exception, VoiceNotFoundError)
    assert run.errors[0].category == ErrorCategory.INVALID_REQUEST

    run = asyncio.run(run_agent(chorus_url, ANSWERS[:1], sample_rate=RATE, options={"num_step": 999}))
    assert isinstance(run.errors[0].exception, InvalidRequestError)
    assert run.errors[0].exception.field == "options.num_step"


def test_word_timestamps_requested(chorus_url):
    """`timestamps="word"` reaches the server: one of the third wave answers with words
    (Pipecat word frames), an earlier one refuses the field by name."""
    run = asyncio.run(run_agent(chorus_url, ANSWERS[:1], sample_rate=RATE, options=SEEDED, timestamps="word"))
    if run.errors:
        assert isinstance(run.errors[0].exception, InvalidRequestError)
        assert run.errors[0].exception.field == "timestamps"
    else:
        assert run.turns[0].words and [w for w, _ in run.turns[0].words] == ANSWERS[0].split()
