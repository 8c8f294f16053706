"""Many clients at once against a real server, and audio identity across endpoints.

20 connections x 3 concurrent requests with mixed knobs and voices must each get
accepted, progress, every chunk in order and done; a seeded request's audio is the same
bytes alone, in the crowd and over `/v1/audio/speech`; with both temperatures 0 it is the
reference `OmniVoice.generate()`'s float32 audio.
"""

from __future__ import annotations

import asyncio
import base64
import io

import httpx
import numpy as np
import pytest
import soundfile as sf
import torch

from tests.conftest import make_reference_clip
from tests.support.chorus_client import Session, check_request, metric_value

REF_TEXT = "This is the reference voice speaking."
SEEDED_TEXT = "The quick brown fox jumps over the lazy dog."
SEEDED = {"options": {"num_step": 12, "seed": 1234}}
LONG_TEXT = "First sentence is here. Then comes the second one! Is there a third? Yes, and a fourth."
MULTI = {"chunk_threshold": 0, "chunk_seconds": 1.0}


def run(coro):
    return asyncio.run(coro)


def wav_bytes(clip: np.ndarray, rate: int = 16000) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, clip, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


@pytest.fixture(scope="module")
def clip_wav() -> bytes:
    return wav_bytes(make_reference_clip(seconds=2.0))


@pytest.fixture(scope="module")
def library_voice(chorus_server, clip_wav) -> str:
    r = httpx.post(chorus_server.url + "/v1/voices", files={"audio": ("ref.wav", clip_wav, "audio/wav")},
                   data={"text": REF_TEXT, "name": "crowd"}, timeout=120)
    assert r.status_code == 201, r.text
    return r.json()["id"]


async def seeded_alone(url: str) -> bytes:
    s = await Session.open(url)
    await s.synthesize("seeded", SEEDED_TEXT, **SEEDED)
    out = (await s.collect())["seeded"]
    await s.close()
    check_request(out, num_step=12)
    return out.payload


def crowd_request(conn: int, k: int, voice: str, clip_wav: bytes) -> tuple[str, dict, dict]:
    """(text, message fields, what check_request expects) for request k of connection conn."""
    idx = 3 * conn + k
    if (conn, k) == (7, 1):
        return SEEDED_TEXT, SEEDED, {"num_step": 12}
    kind = idx % 6
    text = f"Request number {idx} says hello."
    if kind == 0:
        return text, {"options": {"num_step": 6, "guidance_scale": 1.5}}, {"num_step": 6}
    if kind == 1:
        return LONG_TEXT, {"encoding": "f32le", "progress": False, "options": {"num_step": 5, **MULTI}}, \
            {"num_step": 5, "encoding": "f32le", "progress": False}
    if kind == 2:
        return text, {"voice": voice, "options": {"num_step": 8, "seed": idx, "t_shift": 0.5}}, {"num_step": 8}
    if kind == 3:
        return text, {"instruct": "male, high pitch", "stream": "whole", "options": {"num_step": 4}}, \
            {"num_step": 4, "stream": "whole"}
    if kind == 4:
        ref = {"audio": base64.b64encode(clip_wav).decode(), "text": REF_TEXT}
        return text, {"reference": ref, "language": "English", "options": {"num_step": 5, "denoise": False}}, \
            {"num_step": 5}
    return LONG_TEXT, {"voice": voice, "stream": "whole", "encoding": "f32le",
                       "options": {"num_step": 4, "speed": 1.3, **MULTI}}, \
        {"num_step": 4, "stream": "whole", "encoding": "f32le"}


def test_crowd_of_20_connections_x_3_requests(chorus_server, library_voice, clip_wav):
    alone = run(seeded_alone(chorus_server.ws_url))
    plan = {(c, k): crowd_request(c, k, library_voice, clip_wav) for c in range(20) for k in range(3)}

    async def client(conn: int) -> tuple[dict, list]:
        s = await Session.open(chorus_server.ws_url)
        for k in range(3):
            text, fields, _ = plan[conn, k]
            await s.synthesize(f"c{conn}-r{k}", text, **fields)
        out = await s.collect()
        await s.close()
        return out, s.unmatched

    async def crowd():
        return await asyncio.gather(*(client(c) for c in range(20)))

    results = run(crowd())
    multi_chunk = 0
    for conn, (outcomes, unmatched) in enumerate(results):
        assert unmatched == [] and len(outcomes) == 3
        for k in range(3):
            out = outcomes[f"c{conn}-r{k}"]
            check_request(out, **plan[conn, k][2])
            multi_chunk += out.of("accepted")[0]["chunks"] > 1
    assert multi_chunk >= 10
    in_crowd = results[7][0]["c7-r1"].payload
    assert in_crowd == alone
    assert metric_value(chorus_server.url, "chorus_inflight_requests") == 0


def test_seeded_audio_is_the_same_over_websocket_and_http(chorus_server):
    alone = run(seeded_alone(chorus_server.ws_url))
    body = {"model": "omnivoice", "input": SEEDED_TEXT, "voice": None, "response_format": "pcm",
            "num_step": 12, "seed": 1234}
    with httpx.stream("POST", chorus_server.url + "/v1/audio/speech", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "audio/pcm"
        pcm = b"".join(r.iter_bytes())
    assert pcm == alone
    wav = httpx.post(chorus_server.url + "/v1/audio/speech", json={**body, "response_format": "wav"}, timeout=120)
    assert wav.status_code == 200 and wav.content[44:] == alone
    samples, rate = sf.read(io.BytesIO(wav.content), dtype="int16")
    assert rate == 24000 and samples.tobytes() == alone


async def f32_samples(url: str, text: str, **fields) -> np.ndarray:
    s = await Session.open(url)
    await s.synthesize("det", text, encoding="f32le", **fields)
    out = (await s.collect())["det"]
    await s.close()
    assert out.end["type"] == "done", out.end
    return out.samples


DETERMINISTIC = {"num_step": 16, "position_temperature": 0.0, "class_temperature": 0.0}


def test_temperature_zero_equals_reference_generate(chorus_server, reference_model):
    text = "Hello there, this is a parity check."
    ours = run(f32_samples(chorus_server.ws_url, text, options=DETERMINISTIC))
    with torch.inference_mode():
        ref = reference_model.generate(text=text, **DETERMINISTIC)[0]
    assert ours.dtype == np.float32 and np.array_equal(ours, ref.astype(np.float32))

    # several text chunks, cross-faded as the reference joins them (stream: whole)
    ours = run(f32_samples(chorus_server.ws_url, LONG_TEXT, stream="whole",
                           options={**DETERMINISTIC, **MULTI}))
    with torch.inference_mode():
        ref = reference_model.generate(text=LONG_TEXT, audio_chunk_threshold=0.0, audio_chunk_duration=1.0,
                                       **DETERMINISTIC)[0]
    assert np.array_equal(ours, ref.astype(np.float32))


def test_cloned_voice_equals_reference_generate(chorus_server, reference_model, library_voice, clip_wav):
    """The library encoded the upload exactly as `create_voice_clone_prompt` does."""
    text = "Cloned words for the parity check."
    ours = run(f32_samples(chorus_server.ws_url, text, voice=library_voice, options=DETERMINISTIC))
    clip, rate = sf.read(io.BytesIO(clip_wav), dtype="float32")
    with torch.inference_mode():
        ref = reference_model.generate(text=text, ref_audio=(torch.from_numpy(clip), rate), ref_text=REF_TEXT,
                                       **DETERMINISTIC)[0]
    assert np.array_equal(ours, ref.astype(np.float32))
