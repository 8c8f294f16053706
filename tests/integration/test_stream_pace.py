"""A stream's pace and its fast start, through a real server and a real `websockets` client.

(a) In automatic mode the first segment's tokens are the voice of the rest; a first segment
shorter than `MIN_PACE_SECONDS` ("Sure!") gives its voice but not its speaking rate, so a long
later sentence is planned from its own text: about as long as after a long first sentence.
(b) `first_chunk_seconds` on `stream_open` cuts the first segment at a clause: its first chunk
is sent before the rest of the sentence, later segments follow in order; without it the first
segment is one chunk.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.support.chorus_client import Audio, Session

PLAIN = {"num_step": 4, "seed": 3, "postprocess": False}  # audio length = the planned length
LATER = "The weather today will be sunny with a light breeze from the west."
LONG_FIRST = "Good morning, and thank you for calling the weather line on this fine and breezy day."


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 180))


async def speak(url: str, sid: str, sentences: list[str], **options) -> tuple[list[dict], list[Audio]]:
    """One stream of whole sentences; its segment frames and audio frames."""
    s = await Session.open(url)
    await s.send({"type": "stream_open", "id": sid, "options": {**PLAIN, **options}})
    await s.send({"type": "stream_append", "id": sid, "text": " ".join(sentences)})
    await s.send({"type": "stream_close", "id": sid})
    out = (await s.collect([sid]))[sid]
    await s.close()
    assert out.end["type"] == "done", out.end
    return out.of("segment"), out.audio


def test_a_short_first_sentence_does_not_set_the_streams_pace(chorus_server):
    after_sure, _ = run(speak(chorus_server.ws_url, "sure", ["Sure!", LATER]))
    after_long, _ = run(speak(chorus_server.ws_url, "long", [LONG_FIRST, LATER]))
    assert [seg["text"] for seg in after_sure] == ["Sure!", LATER]
    assert [seg["text"] for seg in after_long] == [LONG_FIRST, LATER]
    rate = 24000
    assert after_long[0]["samples"] / rate >= 2.0  # long enough to set the pace
    short, long_ = after_sure[1]["samples"], after_long[1]["samples"]
    assert short == pytest.approx(long_, rel=0.2), (short / rate, long_ / rate)


def test_fast_start_cuts_the_first_segment_only_when_asked(chorus_server):
    segments, audio = run(speak(chorus_server.ws_url, "fast", [LONG_FIRST, LATER], first_chunk_seconds=1.0))
    assert [seg["text"] for seg in segments] == [LONG_FIRST, LATER]
    first = [a.header for a in audio if a.header["segment"] == 0]
    assert [h["chunk"] for h in first] == [0, 1]  # a short first chunk, then the rest of the sentence
    assert not first[0]["final"] and first[1]["final"]
    assert first[0]["samples"] < first[1]["samples"]
    assert [a.header["chunk"] for a in audio if a.header["segment"] == 1] == [0]  # later segments: whole
    _, plain = run(speak(chorus_server.ws_url, "plain", [LONG_FIRST, LATER]))
    assert [a.header["chunk"] for a in plain if a.header["segment"] == 0] == [0]  # off by default
    # the short first chunk is the stream's voice, not its pace: the later sentence keeps its length
    later = sum(a.header["samples"] for a in audio if a.header["segment"] == 1)
    assert later == pytest.approx(sum(a.header["samples"] for a in plain if a.header["segment"] == 1), rel=0.2)
