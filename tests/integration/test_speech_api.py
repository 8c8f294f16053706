"""`POST /v1/audio/speech` against a real server, with the official `openai` client."""

from __future__ import annotations

import io

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf

TEXT = "Speech from the OpenAI compatible endpoint."
KNOBS = {"num_step": 8, "seed": 77}
MULTI = {"chunk_threshold": 0, "chunk_seconds": 1.0}
LONG_TEXT = "One sentence first. A second sentence next. And the third one last."


@pytest.fixture(scope="module")
def client(chorus_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=chorus_server.url + "/v1", api_key="unused", max_retries=0)


def pcm_of(url: str, text: str, **extra) -> bytes:
    body = {"input": text, "response_format": "pcm", **extra}
    r = httpx.post(url + "/v1/audio/speech", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.content


def test_openai_client_wav_pcm_flac(client, chorus_server):
    pcm = pcm_of(chorus_server.url, TEXT, voice="alloy", **KNOBS)
    assert len(pcm) > 0 and len(pcm) % 2 == 0

    wav = client.audio.speech.create(model="omnivoice", voice="alloy", input=TEXT, response_format="wav",
                                     extra_body=KNOBS)
    samples, rate = sf.read(io.BytesIO(wav.content), dtype="int16")
    assert rate == 24000 and samples.tobytes() == pcm
    assert wav.response.headers["content-type"] == "audio/wav"

    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=TEXT, response_format="pcm", extra_body=KNOBS) as response:
        assert response.headers["content-type"] == "audio/pcm"
        assert response.headers["x-sample-rate"] == "24000" and response.headers["x-request-id"].startswith("h")
        streamed = b"".join(response.iter_bytes())
    assert streamed == pcm

    flac = client.audio.speech.create(model="omnivoice", voice="alloy", input=TEXT, response_format="flac",
                                      extra_body=KNOBS)
    samples, rate = sf.read(io.BytesIO(flac.content), dtype="int16")
    assert rate == 24000 and samples.tobytes() == pcm  # one text chunk: the same audio


def test_multi_chunk_wav_is_streamed_and_readable(chorus_server):
    body = {"input": LONG_TEXT, "response_format": "wav", **KNOBS, **MULTI}
    pieces = []
    with httpx.stream("POST", chorus_server.url + "/v1/audio/speech", json=body, timeout=120) as r:
        assert r.status_code == 200 and "content-length" not in r.headers
        pieces = list(r.iter_raw())
    data = b"".join(pieces)
    assert data[4:8] == b"\xff\xff\xff\xff"  # streamed WAV: length unknown up front
    samples, _ = sf.read(io.BytesIO(data), dtype="int16")
    assert samples.tobytes() == pcm_of(chorus_server.url, LONG_TEXT, **KNOBS, **MULTI)


def test_instructions_speed_and_language(client):
    audio = client.audio.speech.create(model="omnivoice", voice="alloy", input="Hi there.", response_format="wav",
                                       instructions="female, whisper", speed=1.5,
                                       extra_body={"num_step": 4, "language": "en", "guidance_scale": 0.0})
    samples, _ = sf.read(io.BytesIO(audio.content))
    assert samples.size > 0 and np.isfinite(samples).all()


def test_errors_in_the_protocol_shape(client, chorus_server):
    url = chorus_server.url + "/v1/audio/speech"
    cases = [
        ({"input": "hi", "num_step": 0}, 422, "invalid_request", "num_step: must be an integer 1..64"),
        ({"input": "hi", "response_format": "ogg"}, 422, "invalid_request", "response_format: must be mp3, opus"),
        ({"input": "hi", "num_steps": 3}, 422, "invalid_request", "num_steps: unknown field"),
        ({"input": ""}, 422, "invalid_request", "input: must not be empty"),
        ({"input": "hi", "voice": "nobody-1234"}, 404, "voice_not_found", "voice: no voice 'nobody-1234'"),
        ({"input": "x" * 5001}, 413, "text_too_long", "input: 5001 characters"),
    ]
    for body, status, code, message in cases:
        r = httpx.post(url, json=body, timeout=60)
        assert r.status_code == status, (body, r.text)
        error = r.json()["error"]
        assert error["code"] == code and error["message"].startswith(message), error
    r = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_message"

    with pytest.raises(openai.UnprocessableEntityError) as info:
        client.audio.speech.create(model="omnivoice", voice="alloy", input="hi", response_format="ogg")
    assert info.value.body["code"] == "invalid_request"
    with pytest.raises(openai.NotFoundError):
        client.audio.speech.create(model="omnivoice", voice="nobody-1234", input="hi", response_format="wav")
    # still serving
    assert len(pcm_of(chorus_server.url, "Still fine.", num_step=3)) > 0


def test_client_leaving_mid_stream_cancels_the_rest(chorus_server):
    from tests.support.chorus_client import metric_value

    url = chorus_server.url
    cancelled = metric_value(url, "chorus_requests_total", endpoint="speech", outcome="cancelled")
    body = {"input": LONG_TEXT + " " + LONG_TEXT, "response_format": "pcm", "num_step": 64, **MULTI}
    with httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=120) as r:
        assert r.status_code == 200
        next(r.iter_raw())  # the first chunk, then hang up
    chorus_server.wait_for(
        lambda: metric_value(url, "chorus_requests_total", endpoint="speech", outcome="cancelled") == cancelled + 1,
        "the request cancelled after the client left")
    assert metric_value(url, "chorus_inflight_requests") == 0
