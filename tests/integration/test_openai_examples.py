"""OpenAI's text-to-speech guide, example by example, with the real `openai` client against a
real server: only `base_url` and the key differ from the guide. Every format is decoded back
by a decoder that did not write it; built-in voices are one speaker across requests."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import av
import httpx
import numpy as np
import openai
import pytest
import soundfile as sf

# The guide's own words
GUIDE_TEXT = "Today is a wonderful day to build something people love!"
GUIDE_INSTRUCTIONS = "Speak in a cheerful and positive tone."
FAST = {"num_step": 4, "seed": 5}  # OmniVoice's knobs, through extra_body, to keep CPU runs short


@pytest.fixture(scope="module")
def client(chorus_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=chorus_server.url + "/v1", api_key="unused", max_retries=0)


def reference_pcm(url: str, voice: str, text: str = GUIDE_TEXT, **extra) -> np.ndarray:
    r = httpx.post(url + "/v1/audio/speech", json={"input": text, "voice": voice, "response_format": "pcm",
                                                  **FAST, **extra}, timeout=120)
    assert r.status_code == 200, r.text
    return np.frombuffer(r.content, "<i2")


def test_quickstart_streams_an_mp3_to_a_file(client, tmp_path):
    speech_file_path = tmp_path / "speech.mp3"
    with client.audio.speech.with_streaming_response.create(
        model="gpt-4o-mini-tts",
        voice="coral",
        input=GUIDE_TEXT,
        instructions=GUIDE_INSTRUCTIONS,
    ) as response:
        assert response.headers["content-type"] == "audio/mpeg"
        assert response.headers["x-chorus-ignored-instructions"] == "Speak in a cheerful and positive tone"
        response.stream_to_file(speech_file_path)
    samples, rate = sf.read(speech_file_path)  # libsndfile's mpg123 reads what LAME wrote
    assert rate == 24000 and len(samples) > 24000 * 0.5


def test_every_response_format_decodes_to_the_same_audio(client, chorus_server):
    pcm = reference_pcm(chorus_server.url, "alloy")
    n = len(pcm)
    for fmt, slack in (("mp3", 2 * 1152 + 529), ("opus", 0), ("aac", 2 * 1024), ("flac", 0), ("wav", 0)):
        response = client.audio.speech.create(model="tts-1", voice="alloy", input=GUIDE_TEXT,
                                              response_format=fmt, extra_body=FAST)
        if fmt == "aac":  # FFmpeg's own AAC decoder (libsndfile has none)
            with av.open(io.BytesIO(response.content), format="aac") as f:
                decoded = np.concatenate([fr.to_ndarray().reshape(-1) for fr in f.decode(audio=0)])
                rate = f.streams.audio[0].codec_context.sample_rate
        else:
            decoded, rate = sf.read(io.BytesIO(response.content), dtype="float32")
        assert rate == 24000, fmt
        assert n <= len(decoded) <= n + slack if slack else len(decoded) == n, (fmt, n, len(decoded))
        if fmt in ("flac", "wav"):
            assert np.array_equal((decoded * 32768).astype(np.int16), pcm), fmt
    expected = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
                "wav": "audio/wav", "pcm": "audio/pcm"}
    for fmt, media in expected.items():
        r = client.audio.speech.with_raw_response.create(model="tts-1", voice="alloy", input="Hi.",
                                                         response_format=fmt, extra_body=FAST)
        assert r.headers["content-type"] == media


def test_realtime_pcm_streaming_as_the_guide_plays_it(chorus_server):
    """The guide's async example feeds `LocalAudioPlayer` from the streamed response; here the
    same bytes are read as the player reads them (24 kHz 16-bit mono)."""
    async def main() -> bytes:
        client = openai.AsyncOpenAI(base_url=chorus_server.url + "/v1", api_key="unused", max_retries=0)
        async with client.audio.speech.with_streaming_response.create(
            model="gpt-4o-mini-tts",
            voice="coral",
            input=GUIDE_TEXT,
            instructions=GUIDE_INSTRUCTIONS,
            response_format="pcm",
            extra_body=FAST,
        ) as response:
            return b"".join([chunk async for chunk in response.iter_bytes()])

    pcm = asyncio.run(main())
    assert np.array_equal(np.frombuffer(pcm, "<i2"), reference_pcm(chorus_server.url, "coral"))


def test_sse_stream_format_sends_openai_events(client, chorus_server):
    with client.audio.speech.with_streaming_response.create(
        model="gpt-4o-mini-tts", voice="alloy", input=GUIDE_TEXT, response_format="pcm",
        stream_format="sse", extra_body=FAST,
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        text = "".join(response.iter_text())
    events = [json.loads(block[len("data: "):]) for block in text.strip().split("\n\n")]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1) and len(events) > 1
    done = events[-1]
    assert done["type"] == "speech.audio.done"
    assert set(done["usage"]) == {"input_tokens", "output_tokens", "total_tokens"}
    assert done["usage"]["total_tokens"] == done["usage"]["input_tokens"] + done["usage"]["output_tokens"] > 0
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert np.array_equal(np.frombuffer(audio, "<i2"), reference_pcm(chorus_server.url, "alloy"))


def test_instructions_use_what_omnivoice_knows_and_name_the_rest(client, chorus_server):
    response = client.audio.speech.with_raw_response.create(
        model="gpt-4o-mini-tts", voice="onyx", input="Hello there.", response_format="wav",
        instructions="A female voice with a British accent. Sound calm, like a late night radio host.",
        extra_body=FAST)
    assert response.headers["x-chorus-instructions"] == "female, british accent"
    assert response.headers["x-chorus-ignored-instructions"] == "Sound calm; like a late night radio host"
    assert "instructions ignored: Sound calm; like a late night radio host" in chorus_server.log()
    r = client.audio.speech.with_raw_response.create(model="tts-1", voice="onyx", input="Hi.", response_format="wav",
                                                     instructions="female, low pitch", extra_body=FAST)
    assert "x-chorus-ignored-instructions" not in r.headers


def test_voices_by_id_object_and_display_name(client, chorus_server, reference_clip):
    clip, rate = reference_clip
    buf = io.BytesIO()
    sf.write(buf, clip, rate, format="WAV")
    r = httpx.post(chorus_server.url + "/v1/voices", files={"audio": ("a.wav", buf.getvalue(), "audio/wav")},
                   data={"text": "A reference clip.", "name": "Narrator Nine"}, timeout=120)
    assert r.status_code == 201, r.text
    voice_id = r.json()["id"]
    by_id = reference_pcm(chorus_server.url, voice_id, "Short line.")
    by_object = client.audio.speech.create(model="tts-1", voice={"id": voice_id}, input="Short line.",
                                           response_format="pcm", extra_body=FAST)
    by_name = client.audio.speech.create(model="tts-1", voice="narrator nine", input="Short line.",
                                         response_format="pcm", extra_body=FAST)
    assert np.array_equal(np.frombuffer(by_object.content, "<i2"), by_id)
    assert np.array_equal(np.frombuffer(by_name.content, "<i2"), by_id)
    with pytest.raises(openai.NotFoundError):
        client.audio.speech.create(model="tts-1", voice={"id": "nobody-00000000"}, input="Hi.")


def test_models_list_in_openai_shape(client):
    models = client.models.list()
    # the stable id, whatever the checkpoint (the tiny one has random weights: the demo's name)
    assert [(m.id, m.checkpoint) for m in models.data] == [("omnivoice", "omnivoice-random-demo")]
    assert models.data[0].object == "model" and models.data[0].owned_by == "chorus"


def test_builtin_voices_listed_and_not_deletable(chorus_server):
    voices = httpx.get(chorus_server.url + "/v1/voices").json()["voices"]
    builtin = [v for v in voices if v["builtin"]]
    assert [v["id"] for v in builtin] == ["alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx",
                                          "sage", "shimmer", "verse", "marin", "cedar"]
    assert all(not v["builtin"] for v in voices if v["id"] not in {b["id"] for b in builtin})
    r = httpx.delete(chorus_server.url + "/v1/voices/alloy")
    assert r.status_code == 403 and "built-in" in r.json()["error"]["message"]
    assert httpx.get(chorus_server.url + "/v1/voices/alloy").json()["builtin"] is True


def test_compressed_formats_stream_chunk_by_chunk(chorus_server):
    """A text of several chunks: mp3 bytes arrive in pieces (no Content-Length), and the
    whole is one stream a decoder reads to the length of the pcm of the same request."""
    knobs = {**FAST, "chunk_threshold": 0, "chunk_seconds": 1.0}
    text = "One sentence first. A second sentence next. And the third one last."
    n = len(reference_pcm(chorus_server.url, "ash", text, **{k: v for k, v in knobs.items() if k not in FAST}))
    body = {"input": text, "voice": "ash", "response_format": "mp3", **knobs}
    with httpx.stream("POST", chorus_server.url + "/v1/audio/speech", json=body, timeout=120) as r:
        assert r.status_code == 200 and "content-length" not in r.headers
        data = b"".join(r.iter_raw())
    decoded, rate = sf.read(io.BytesIO(data), dtype="float32")
    assert rate == 24000 and n <= len(decoded) <= n + 2 * 1152 + 529

