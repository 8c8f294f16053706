"""Every output format, encoded chunk by chunk as the server does, decoded back by a decoder
that did not write it: libsndfile (mpg123, its own Ogg/Opus reader) for what FFmpeg wrote,
FFmpeg's native decoders (not libopus, not LAME) for Opus packets and AAC, and the G.711
standard written out in numpy for mu-law / A-law."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
import soundfile as sf
import soxr

from server.audio import encoders
from server.audio.files import to_pcm16
from tests.support.g711_reference import linear_to_alaw, linear_to_mulaw

RATE = 24000
MP3_FRAME, AAC_FRAME = 1152, 1024


def speechlike(seconds: float, rate: int = RATE) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    tone = sum(np.sin(2 * np.pi * f * t) / k for k, f in enumerate((180, 360, 720), start=1))
    return (0.25 * tone * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)


def chunks(audio: np.ndarray, n: int = 3) -> list[np.ndarray]:
    return np.array_split(audio, n)


def push_all(encoder: encoders.StreamEncoder, parts: list[np.ndarray]) -> list[encoders.Encoded]:
    return [encoder.push(part, last=i == len(parts) - 1) for i, part in enumerate(parts)]


def correlation(a: np.ndarray, b: np.ndarray, lag_range: int) -> float:
    """Best normalised correlation of a and b over lags up to lag_range (codec delays)."""
    best = 0.0
    for lag in range(lag_range + 1):
        x, y = a[: len(a) - lag] if lag else a, b[lag:]
        n = min(len(x), len(y))
        x, y = x[:n], y[:n]
        best = max(best, float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y) + 1e-12)))
    return best


def ffmpeg_decode(data: bytes, container: str) -> tuple[np.ndarray, int]:
    with av.open(io.BytesIO(data), format=container) as f:
        frames = [frame.to_ndarray().reshape(-1) for frame in f.decode(audio=0)]
        rate = f.streams.audio[0].codec_context.sample_rate
    return np.concatenate(frames).astype(np.float32), rate


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "wav", "pcm"])
def test_http_formats_stream_and_decode_back(fmt):
    audio = speechlike(2.3)
    out = push_all(encoders.http_encoder(fmt, RATE), chunks(audio))
    assert all(o.data for o in out[:-1]), "every chunk leaves with bytes of its own (streamed)"
    data = b"".join(o.data for o in out)
    if fmt == "pcm":
        decoded, rate = np.frombuffer(data, "<i2").astype(np.float32) / 32768, RATE
    elif fmt == "aac":
        decoded, rate = ffmpeg_decode(data, "aac")  # ADTS by FFmpeg's own AAC decoder
    else:
        decoded, rate = sf.read(io.BytesIO(data), dtype="float32")  # libsndfile: wav, mpg123, ogg/opus
    assert rate == RATE
    slack = {"mp3": 2 * MP3_FRAME + 529, "aac": 2 * AAC_FRAME, "opus": 0, "wav": 0, "pcm": 0}[fmt]
    assert len(audio) <= len(decoded) <= len(audio) + slack if slack else len(decoded) == len(audio)
    assert correlation(audio, decoded, 3000 if slack else 0) > 0.9


def test_aac_is_adts_frames_of_the_right_rate():
    """ADTS headers read by hand: sync, 24 kHz (index 6), mono, frame lengths tile the stream."""
    audio = speechlike(1.0)
    data = b"".join(o.data for o in push_all(encoders.http_encoder("aac", RATE), chunks(audio)))
    pos, frames = 0, 0
    while pos < len(data):
        head = data[pos:pos + 7]
        assert head[0] == 0xFF and head[1] & 0xF0 == 0xF0
        assert (head[2] >> 2) & 0xF == 6 and ((head[2] & 1) << 2 | head[3] >> 6) == 1
        pos += (head[3] & 0x3) << 11 | head[4] << 3 | head[5] >> 5
        frames += 1
    assert pos == len(data) and frames * AAC_FRAME >= len(audio)


@pytest.mark.parametrize("law,reference", [("mulaw", linear_to_mulaw), ("alaw", linear_to_alaw)])
@pytest.mark.parametrize("rate", [8000, 16000])
def test_telephony_equals_the_g711_reference(law, reference, rate):
    audio = speechlike(1.7)
    out = push_all(encoders.ws_encoder(law, RATE, rate), chunks(audio))
    data = np.frombuffer(b"".join(o.data for o in out), np.uint8)
    resampled = soxr.resample(audio, RATE, rate, quality="HQ")
    assert len(data) == sum(o.samples for o in out) == len(resampled)
    assert np.array_equal(data, reference(to_pcm16(resampled)))


def test_every_byte_value_of_g711_matches_the_reference():
    every = np.arange(-32768, 32768, dtype=np.int16).astype(np.float32) / 32768
    for law, reference in (("mulaw", linear_to_mulaw), ("alaw", linear_to_alaw)):
        got = np.frombuffer(encoders.ws_encoder(law, 8000, 8000).push(every, last=True).data, np.uint8)
        assert np.array_equal(got, reference(to_pcm16(every))), law


@pytest.mark.parametrize("rate", [16000, 24000, 48000])
def test_opus_packets_decode_with_an_independent_decoder(rate):
    audio = speechlike(2.0)
    out = push_all(encoders.ws_encoder("opus", RATE, rate), chunks(audio))
    decoder = av.CodecContext.create("opus", "r")  # FFmpeg's native Opus decoder, not libopus
    decoder.sample_rate, decoder.layout = 48000, "mono"
    pcm = []
    for o in out:
        assert o.packets is not None and sum(o.packets) == len(o.data)
        offset = 0
        for size in o.packets:
            pcm += [f.to_ndarray().reshape(-1) for f in decoder.decode(av.Packet(o.data[offset:offset + size]))]
            offset += size
    decoded = np.concatenate(pcm)
    packets = sum(len(o.packets) for o in out)
    assert packets == len(decoded) // 960  # 20 ms packets at the decoder's 48 kHz
    assert abs(len(decoded) - len(audio) * 2) <= 2 * 960
    assert sum(o.samples for o in out) == len(soxr.resample(audio, RATE, rate))
    reference = soxr.resample(audio, RATE, 48000)
    assert correlation(reference, decoded.astype(np.float32), 2000) > 0.8


@pytest.mark.parametrize("encoding,rate", [("pcm_s16le", 16000), ("f32le", 44100), ("pcm_s16le", 22050)])
def test_resampled_pcm_is_seamless_across_chunks(encoding, rate):
    audio = speechlike(1.5)
    out = push_all(encoders.ws_encoder(encoding, RATE, rate), chunks(audio, 5))
    dtype = "<i2" if encoding == "pcm_s16le" else "<f4"
    streamed = np.concatenate([np.frombuffer(o.data, dtype) for o in out]).astype(np.float32)
    if encoding == "pcm_s16le":
        streamed /= 32768
    whole = soxr.resample(audio, RATE, rate, quality="HQ")
    assert len(streamed) == len(whole) == sum(o.samples for o in out)
    assert np.max(np.abs(streamed - whole)) < 2e-3


def test_pcm_at_the_model_rate_is_the_samples_unchanged():
    audio = speechlike(0.5)
    out = encoders.ws_encoder("pcm_s16le", RATE, RATE).push(audio, last=True)
    assert out.data == to_pcm16(audio).tobytes() and out.samples == len(audio)
