"""Upload decoding and the one float -> bytes path every endpoint shares."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import soundfile as sf

from server.audio import files as audio_io
from tests.conftest import make_reference_clip


def file_bytes(samples: np.ndarray, rate: int, fmt: str, subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


@pytest.mark.parametrize("fmt, subtype, exact", [
    ("WAV", "PCM_16", True), ("WAV", "FLOAT", True), ("FLAC", "PCM_16", True),
    ("OGG", "VORBIS", False), ("MP3", "MPEG_LAYER_III", False),
])
def test_decodes_every_upload_format(fmt, subtype, exact):
    clip = make_reference_clip(seconds=1.0, sample_rate=16000)
    decoded = audio_io.decode_audio(file_bytes(clip, 16000, fmt, subtype))
    assert decoded.sample_rate == 16000 and decoded.samples.dtype == np.float32
    assert decoded.samples.ndim == 1
    assert abs(decoded.seconds - 1.0) < 0.1
    if exact:
        assert np.allclose(decoded.samples, clip, atol=1 / 16384)


def test_stereo_stays_channels_first():
    clip = make_reference_clip(seconds=0.5, sample_rate=24000)
    stereo = np.stack([clip, -clip], axis=1)
    decoded = audio_io.decode_audio(file_bytes(stereo, 24000, "WAV", "FLOAT"))
    assert decoded.samples.shape == (2, clip.shape[0])


@pytest.mark.parametrize("data, message, unsupported", [
    (b"", "audio: empty file", False),
    (b"this is not audio at all" * 10, "audio: not a readable wav, flac, ogg or mp3 file", True),
    (file_bytes(np.zeros(100, np.float32), 8000, "AIFF", "PCM_16"), "audio: unsupported format AIFF", True),
    (file_bytes(np.zeros(0, np.float32), 8000, "WAV", "PCM_16"), "audio: the file holds no samples", False),
])
def test_garbage_is_refused_clearly(data, message, unsupported):
    with pytest.raises(audio_io.AudioError) as info:
        audio_io.decode_audio(data)
    assert str(info.value).startswith(message) and info.value.unsupported is unsupported


def test_too_long_is_refused():
    long_clip = np.zeros(int(8000 * (audio_io.MAX_REFERENCE_SECONDS + 1)), np.float32)
    with pytest.raises(audio_io.AudioError, match="longer than"):
        audio_io.decode_audio(file_bytes(long_clip, 8000, "WAV", "PCM_16"))


def test_base64():
    clip = make_reference_clip(seconds=0.5)
    data = file_bytes(clip, 16000, "WAV", "PCM_16")
    assert audio_io.decode_base64_audio(base64.b64encode(data).decode()).sample_rate == 16000
    with pytest.raises(audio_io.AudioError, match=r"^reference.audio: not valid base64"):
        audio_io.decode_base64_audio("@@@not base64@@@")


def test_pcm16_is_what_soundfile_writes():
    x = np.concatenate([np.linspace(-1.2, 1.2, 100_001, dtype=np.float32),
                        np.random.default_rng(0).uniform(-1, 1, 10_000).astype(np.float32)])
    stored, _ = sf.read(io.BytesIO(file_bytes(x, 24000, "WAV", "PCM_16")), dtype="int16")
    assert np.array_equal(audio_io.to_pcm16(x), stored)
    assert audio_io.encode_samples(x, "pcm_s16le") == stored.astype("<i2").tobytes()
    assert np.array_equal(np.frombuffer(audio_io.encode_samples(x, "f32le"), "<f4"), x)


def test_wav_and_flac_files_hold_the_same_samples():
    x = make_reference_clip(seconds=0.7, sample_rate=24000)
    pcm = audio_io.to_pcm16(x)
    exact = audio_io.wav_header(24000, len(x)) + pcm.tobytes()
    assert exact[:44] == file_bytes(x, 24000, "WAV", "PCM_16")[:44]  # byte-identical header
    streamed = audio_io.wav_header(24000, None) + pcm.tobytes()
    for data in (exact, streamed, audio_io.encode_flac(x, 24000)):
        samples, rate = sf.read(io.BytesIO(data), dtype="int16")
        assert rate == 24000 and np.array_equal(samples, pcm)
