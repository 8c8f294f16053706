"""How the client and both plugins carry the third wave's `words` frames and
`done.voice_id`, which `chorus serve` does not send yet: against the stand-in server of
`third_wave_server` (the frames as docs/PROTOCOL fixes them). When the real server sends
them, `test_word_timestamps_requested` in the framework tests covers the same paths."""

from __future__ import annotations

import asyncio

from chorus_client import ChorusClient

from tests.clients.conftest import require_framework
from tests.clients.third_wave_server import SAMPLES_PER_WORD, third_wave_server

TEXT = "Your table is booked for eight."


def test_client_words_and_kept_voice():
    async def go():
        async with third_wave_server() as url, ChorusClient(url) as client:
            whole = await client.synthesize(TEXT, timestamps="word", keep_voice=True, sample_rate=16000).collect()
            async with client.stream(timestamps="word", sample_rate=16000) as stream:
                for word in TEXT.split():
                    await stream.append(word + " ")
                await stream.close()
                streamed = await stream.collect()
            return whole, streamed

    whole, streamed = asyncio.run(go())
    for result in (whole, streamed):
        (words,) = result.words
        assert [w.text for w in words.words] == TEXT.split()
        assert words.words[1].start_seconds == SAMPLES_PER_WORD / 16000 and words.source == "model"
    assert streamed.words[0].segment == 0
    assert whole.done.voice_id == "kept-r1" and streamed.done.voice_id is None


def test_pipecat_word_timestamps_become_text_frames():
    require_framework("pipecat")
    from pipecat_agent import run_agent  # the framework is there: the example imports it

    async def go():
        async with third_wave_server() as url:
            return await run_agent(url, [TEXT], sample_rate=16000, timestamps="word", keep_voice=True)

    run = asyncio.run(go())
    assert run.errors == []
    (turn,) = run.turns
    assert [w for w, _ in turn.words] == TEXT.split()
    pts = [p for _, p in turn.words]
    assert pts == sorted(pts) and len(set(pts)) == len(pts)


def test_livekit_aligned_transcripts():
    require_framework("livekit.agents")
    from livekit_agent import run_agent  # the framework is there: the example imports it

    async def go():
        async with third_wave_server() as url:
            return await run_agent(url, [TEXT], sample_rate=16000, timestamps="word")

    (turn,) = asyncio.run(go())
    assert [w for w, _, _ in turn.transcript] == TEXT.split()
    assert [round(s, 3) for _, s, _ in turn.transcript] == [
        round(i * SAMPLES_PER_WORD / 16000, 3) for i in range(len(TEXT.split()))]
