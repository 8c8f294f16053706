"""Audio in and out of the web layer: decode uploads, encode frames and files.

numpy + soundfile only. Every way the service sends samples (WebSocket frames, WAV, FLAC,
raw PCM) goes through `to_pcm16` / `to_f32le`, so the same request's audio is the same bytes
over every endpoint.
"""

from __future__ import annotations

import base64
import binascii
import io
import struct
from dataclasses import dataclass

import numpy as np
import soundfile as sf

UPLOAD_FORMATS = ("WAV", "FLAC", "OGG", "MP3")
MAX_REFERENCE_SECONDS = 60.0


class AudioError(ValueError):
    """Audio we cannot use; the message is meant for the client. `unsupported`: not a
    format we read at all (HTTP 415), as opposed to a readable file we refuse (422)."""

    def __init__(self, message: str, unsupported: bool = False):
        super().__init__(message)
        self.unsupported = unsupported


@dataclass(frozen=True)
class DecodedAudio:
    samples: np.ndarray  # float32, (T,) mono or (C, T)
    sample_rate: int

    @property
    def seconds(self) -> float:
        return self.samples.shape[-1] / self.sample_rate


def decode_audio(data: bytes, what: str = "audio") -> DecodedAudio:
    """A wav / flac / ogg / mp3 file's bytes -> float32 samples, channels first.

    `what` names the field in error messages (`reference.audio: ...`).
    """
    if not data:
        raise AudioError(f"{what}: empty file")
    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            if f.format not in UPLOAD_FORMATS:
                raise AudioError(f"{what}: unsupported format {f.format}; send wav, flac, ogg or mp3", True)
            # read at most a little past the limit, whatever length the header claims
            samples = f.read(int(MAX_REFERENCE_SECONDS * f.samplerate) + 1, dtype="float32", always_2d=True)
            rate = f.samplerate
    except AudioError:
        raise
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise AudioError(f"{what}: not a readable wav, flac, ogg or mp3 file ({exc})", True) from None
    if samples.shape[0] == 0:
        raise AudioError(f"{what}: the file holds no samples")
    if samples.shape[0] / rate > MAX_REFERENCE_SECONDS:
        raise AudioError(f"{what}: longer than {MAX_REFERENCE_SECONDS:.0f} seconds")
    if not np.isfinite(samples).all():
        raise AudioError(f"{what}: the file holds samples that are not finite numbers")
    samples = samples.T  # (C, T)
    if samples.shape[0] == 1:
        samples = samples[0]
    return DecodedAudio(np.ascontiguousarray(samples), int(rate))


def decode_base64_audio(text: str, what: str = "reference.audio") -> DecodedAudio:
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise AudioError(f"{what}: not valid base64") from None
    return decode_audio(data, what)


# ---- output ----------------------------------------------------------------------------


def to_pcm16(audio: np.ndarray) -> np.ndarray:
    """float -> int16 exactly as libsndfile writes PCM_16 (floor of x * 32768, clipped),
    so our frames equal what `soundfile.write(..., subtype="PCM_16")` would store."""
    scaled = np.floor(np.asarray(audio, dtype=np.float32) * np.float32(32768.0))
    return np.clip(scaled, -32768, 32767).astype("<i2")


def encode_samples(audio: np.ndarray, encoding: str) -> bytes:
    """Mono samples as the wire's `pcm_s16le` or `f32le` bytes."""
    if encoding == "pcm_s16le":
        return to_pcm16(audio).tobytes()
    if encoding == "f32le":
        return np.asarray(audio, dtype="<f4").tobytes()
    raise ValueError(f"unknown encoding {encoding!r}")


def wav_header(sample_rate: int, num_samples: int | None) -> bytes:
    """A 44-byte 16-bit mono WAV header; `None` samples = streaming (sizes 0xFFFFFFFF)."""
    data_size = 0xFFFFFFFF if num_samples is None else num_samples * 2
    riff_size = 0xFFFFFFFF if num_samples is None else 36 + data_size
    return (
        b"RIFF" + struct.pack("<I", riff_size) + b"WAVE"
        + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data" + struct.pack("<I", data_size)
    )


def encode_flac(audio: np.ndarray, sample_rate: int) -> bytes:
    """A whole 16-bit FLAC file from mono samples.

    Written once the audio is complete: libsndfile (hence soundfile) cannot read a FLAC
    stream whose header says "length unknown", so we do not stream FLAC.
    """
    buf = io.BytesIO()
    sf.write(buf, to_pcm16(audio), sample_rate, format="FLAC", subtype="PCM_16")
    return buf.getvalue()
