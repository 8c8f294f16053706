"""The WebSocket's `encoding` and `sample_rate` against a real server: telephony mu-law and
A-law equal the G.711 standard's coding of the same audio (taken as f32le from the same
seed), Opus packets decode with FFmpeg's own decoder, and bad rates are refused by field."""

from __future__ import annotations

import asyncio

import av
import numpy as np
import soxr

from server.audio.files import to_pcm16
from tests.support.chorus_client import Session
from tests.support.g711_reference import linear_to_alaw, linear_to_mulaw

TEXT = "First part here. Then a second part. And a last one."
SAME = {"options": {"num_step": 4, "seed": 21, "chunk_threshold": 0, "chunk_seconds": 1.0}}


def run(url: str, requests: dict[str, dict]) -> dict:
    async def go():
        session = await Session.open(url)
        try:
            for rid, fields in requests.items():
                await session.synthesize(rid, TEXT, **SAME, **fields)
            return session.ready, await session.collect(list(requests))
        finally:
            await session.close()

    return asyncio.run(go())


def resampled_like_the_server(chunks: list[np.ndarray], rate: int) -> np.ndarray:
    stream = soxr.ResampleStream(24000, rate, 1, dtype="float32", quality="HQ")
    return np.concatenate([stream.resample_chunk(c, last=i == len(chunks) - 1) for i, c in enumerate(chunks)])


def test_telephony_and_rates_match_the_reference(chorus_server):
    ready, out = run(chorus_server.ws_url, {
        "f32": {"encoding": "f32le"},
        "mu": {"encoding": "mulaw"},
        "a16": {"encoding": "alaw", "sample_rate": 16000},
        "s16": {"encoding": "pcm_s16le", "sample_rate": 16000},
    })
    assert ready["encodings"] == ["pcm_s16le", "f32le", "mulaw", "alaw", "opus"]
    assert ready["sample_rates"] == [8000, 16000, 22050, 24000, 44100, 48000]
    assert all(o.end["type"] == "done" for o in out.values())
    chunks = [np.frombuffer(a.payload, "<f4") for a in out["f32"].audio]
    assert len(chunks) >= 2  # the joins between chunks are part of what is checked

    for rid, law, rate, reference in (("mu", "mulaw", 8000, linear_to_mulaw), ("a16", "alaw", 16000, linear_to_alaw)):
        frames = out[rid].audio
        assert [f.header["chunk"] for f in frames] == list(range(len(chunks)))
        assert all(f.header["encoding"] == law and f.header["sample_rate"] == rate for f in frames)
        assert all(len(f.payload) == f.header["samples"] for f in frames)  # one byte a sample
        expected = reference(to_pcm16(resampled_like_the_server(chunks, rate)))
        assert np.array_equal(np.frombuffer(out[rid].payload, np.uint8), expected), rid

    s16 = out["s16"]
    assert all(f.header["sample_rate"] == 16000 for f in s16.audio)
    expected = to_pcm16(resampled_like_the_server(chunks, 16000))
    assert np.array_equal(np.frombuffer(s16.payload, "<i2"), expected)


def test_opus_packets_play_with_an_independent_decoder(chorus_server):
    _, out = run(chorus_server.ws_url, {"f32": {"encoding": "f32le"}, "op": {"encoding": "opus"}})
    reference = np.concatenate([np.frombuffer(a.payload, "<f4") for a in out["f32"].audio])
    decoder = av.CodecContext.create("opus", "r")  # FFmpeg's native decoder; the server uses libopus
    decoder.sample_rate, decoder.layout = 48000, "mono"
    decoded, carried = [], 0
    for frame in out["op"].audio:
        header = frame.header
        assert header["encoding"] == "opus" and header["sample_rate"] == 24000
        assert sum(header["packets"]) == len(frame.payload)
        carried += header["samples"]
        offset = 0
        for size in header["packets"]:
            packet = av.Packet(frame.payload[offset:offset + size])
            decoded += [f.to_ndarray().reshape(-1) for f in decoder.decode(packet)]
            offset += size
    assert carried == len(reference)
    pcm = np.concatenate(decoded)
    assert abs(len(pcm) - 2 * len(reference)) <= 2 * 960  # 48 kHz out, 20 ms packets


def test_bad_sample_rates_are_refused_by_field(chorus_server):
    async def go():
        session = await Session.open(chorus_server.ws_url)
        try:
            await session.synthesize("x", "Hi.", sample_rate=11025)
            first = await session.expect_error("invalid_request", "x")
            await session.synthesize("y", "Hi.", encoding="opus", sample_rate=44100)
            second = await session.expect_error("invalid_request", "y")
            return first, second
        finally:
            await session.close()

    first, second = asyncio.run(go())
    assert first["field"] == "sample_rate" and "8000, 16000, 22050" in first["message"]
    assert second["field"] == "sample_rate" and first["message"] != second["message"]
