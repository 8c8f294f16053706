"""Word and character timestamps of the `model` source through a real server and client: a
`words` frame per chunk (per stream segment) after its audio and before its `segment` frame,
on the audio's own clock, monotonic, covering every word, ending at the audio's end."""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import pytest

from server.timestamps.model_words import tokens
from tests.support.chorus_client import Audio, request_once, stream_once

TEXT = ("The first sentence is short. The second sentence is a little longer than the first one. "
        "And a third closes it.")
CHUNKED = {"num_step": 4, "seed": 3, "chunk_threshold": 0, "chunk_seconds": 2}


def _check_words(spans: list[dict], start: int, end: int) -> None:
    """Monotonic, inside [start, end], the first at its start and the last at its end."""
    assert spans and spans[0]["start_samples"] == start and spans[-1]["end_samples"] == end
    previous = start
    for span in spans:
        assert previous <= span["start_samples"] <= span["end_samples"] <= end, spans
        previous = span["end_samples"]


@pytest.mark.parametrize("sample_rate", [None, 16000])
def test_each_chunk_is_followed_by_its_words_on_the_audio_clock(chorus_server, sample_rate):
    out = asyncio.run(request_once(chorus_server.ws_url, "w", TEXT, timestamps="word", sample_rate=sample_rate,
                           options=CHUNKED))
    assert out.end["type"] == "done", out.end
    frames = [f for f in out.frames if isinstance(f, Audio) or f["type"] == "words"]
    audio = out.audio
    assert len(audio) >= 2, "the text should be chunked"
    assert [type(f) is Audio for f in frames] == [True, False] * len(audio)  # audio, then its words
    clock, spoken = 0, []
    for chunk, words in zip(audio, frames[1::2]):
        assert words["source"] == "model" and "segment" not in words and "chars" not in words
        start = clock
        clock += chunk.header["samples"]
        _check_words(words["words"], words["words"][0]["start_samples"], words["words"][-1]["end_samples"])
        lag = words["words"][0]["start_samples"] - start
        # the words are on the audio's clock; a resampler holds back its last few ms until the next frame
        assert lag == 0 if sample_rate is None else 0 <= lag <= 0.05 * sample_rate, lag
        spoken += [w["text"] for w in words["words"]]
    assert spoken == TEXT.split()  # every word, in order
    last = frames[-1]["words"][-1]["end_samples"]
    assert last == clock if sample_rate is None else abs(last - clock) <= 2  # the audio's end


def test_char_timestamps_cover_every_character_inside_its_word(chorus_server):
    out = asyncio.run(request_once(chorus_server.ws_url, "c", "Hi there, friend.", timestamps="char",
                           options={"num_step": 4, "seed": 3}))
    (words,) = out.of("words")
    assert [c["text"] for c in words["chars"]] == list("Hithere,friend.")
    for word in words["words"]:
        inside = [c for c in words["chars"] if word["start_samples"] <= c["start_samples"] <= word["end_samples"]]
        assert "".join(c["text"] for c in inside).startswith(word["text"][0])
    ends = [c["end_samples"] for c in words["chars"]]
    assert ends == sorted(ends) and ends[-1] == out.audio[0].header["samples"]


def test_whole_delivery_has_one_words_frame_for_the_whole_text(chorus_server):
    out = asyncio.run(request_once(chorus_server.ws_url, "h", TEXT, timestamps="word", stream="whole", options=CHUNKED))
    kinds = [("audio" if isinstance(f, Audio) else f["type"]) for f in out.frames]
    assert kinds[-3:] == ["audio", "words", "done"] and kinds.count("words") == 1
    (words,) = out.of("words")
    assert [w["text"] for w in words["words"]] == TEXT.split()
    _check_words(words["words"], 0, out.audio[0].header["samples"])


def test_stream_segments_get_words_between_their_audio_and_segment_frames(chorus_server):
    out = asyncio.run(stream_once(chorus_server.ws_url, ["It costs $3.50 today. ", "See you at 5 pm."],
                                  timestamps="word", options={"num_step": 4, "seed": 3, "normalize_text": True}))
    kinds = [("audio" if isinstance(f, Audio) else f["type"]) for f in out.frames]
    segments, words = out.of("segment"), out.of("words")
    assert len(segments) == len(words) == 2
    for seg, said in zip(segments, words):
        assert said["segment"] == seg["segment"]
        _check_words(said["words"], seg["offset_samples"], seg["offset_samples"] + seg["samples"])
        at = out.frames.index(said)
        assert out.frames[at + 1] is seg and isinstance(out.frames[at - 1], Audio)  # audio, words, segment
        assert out.frames[at - 1].header["segment"] == seg["segment"] and out.frames[at - 1].header["final"]
    assert [w["text"] for w in words[0]["words"]][:4] == ["It", "costs", "three", "dollars"]  # as spoken
    assert kinds[-1] == "done"


def test_http_sse_carries_words_events_and_audio_alone_refuses(chorus_server):
    r = httpx.post(chorus_server.url + "/v1/audio/speech", timeout=120, json={
        "input": TEXT, "response_format": "pcm", "stream_format": "sse", "timestamps": "word",
        "normalize_text": False, **CHUNKED})
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "speech.audio.done" and kinds.count("speech.audio.words") >= 2
    samples, spoken = 0, []
    for event in events:
        if event["type"] == "speech.audio.delta":
            samples += len(base64.b64decode(event["audio"])) // 2
        elif event["type"] == "speech.audio.words":
            assert event["source"] == "model"
            _check_words(event["words"], event["words"][0]["start_samples"], samples)  # after its audio
            spoken += [w["text"] for w in event["words"]]
    assert spoken == TEXT.split()
    refused = httpx.post(chorus_server.url + "/v1/audio/speech", json={"input": "Hi.", "timestamps": "word"})
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "timestamps"
    bad = httpx.post(chorus_server.url + "/v1/audio/speech", json={"input": "Hi.", "timestamps": "line",
                                                                    "stream_format": "sse"})
    assert bad.status_code == 422 and "word, char or null" in bad.json()["error"]["message"]


def test_the_model_source_splits_words_as_documented():
    text = "Hello, world! 你好。 “Quoted” — dash"
    assert [text[a:b] for a, b in tokens(text)] == ["Hello,", "world!", "你", "好。", "“Quoted” —", "dash"]
