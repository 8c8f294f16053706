"""Audio in and out of the web layer: decode uploads, encode frames and files.

numpy + soundfile only. Every way the service sends samples (WebSocket frames, WAV, FLAC,
raw PCM) goes through `to_pcm16` / `to_f32le`, so the same request's audio is the same bytes
over every endpoint.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import soundfile as sf

UPLOAD_FORMATS = ("WAV", "FLAC", "OGG", "MP3")
MAX_REFERENCE_SECONDS = 60.0
MAX_REFERENCE_BYTES = 16 * 1024 * 1024
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 4000, 192000
MAX_CHANNELS = 8
# decoded samples of one clip, all channels (64 MiB of float32): 60 s of stereo at 96 kHz
MAX_DECODED_SAMPLES = 16 * 1024 * 1024
DECODE_TIMEOUT_S = 10.0
_BLOCK_SECONDS = 2.0
_FORMATS_TEXT = "wav, flac, ogg or mp3"


class AudioError(ValueError):
    """Audio we cannot use; the message is meant for the client. `unsupported`: not a
    format we read at all (HTTP 415), as opposed to a readable file we refuse (422)."""

    def __init__(self, message: str, unsupported: bool = False):
        super().__init__(message)
        self.unsupported = unsupported


@dataclass(frozen=True)
class AudioLimits:
    """How much reference audio one request may bring (`--max-reference-*`)."""

    max_bytes: int = MAX_REFERENCE_BYTES
    max_seconds: float = MAX_REFERENCE_SECONDS
    timeout_s: float = DECODE_TIMEOUT_S


@dataclass(frozen=True)
class DecodedAudio:
    samples: np.ndarray  # float32, (T,) mono or (C, T)
    sample_rate: int

    @property
    def seconds(self) -> float:
        return self.samples.shape[-1] / self.sample_rate


def _size_text(n: int) -> str:
    return f"{n / 1024 / 1024:.0f} MiB" if n >= 1024 * 1024 else f"{n} bytes"


def _unreadable(what: str, exc: BaseException | None = None) -> AudioError:
    """A stable message: libsndfile's own reason, never a Python object's repr."""
    reason = getattr(exc, "error_string", None) if exc is not None else None
    detail = f" ({reason.strip().rstrip('.')})" if isinstance(reason, str) and reason.strip() else ""
    return AudioError(f"{what}: not a readable {_FORMATS_TEXT} file{detail}", True)


def decode_audio(data: bytes, what: str = "audio", limits: AudioLimits = AudioLimits()) -> DecodedAudio:
    """A wav / flac / ogg / mp3 file's bytes -> float32 samples, channels first.

    `what` names the field in error messages (`reference.audio: ...`). Hostile input is
    refused before it costs much: the byte size first, then what the header claims
    (format, rate, channels, length), then the samples are read in blocks, never past the
    length limit, and the whole decode stops at `limits.timeout_s`.
    """
    if not data:
        raise AudioError(f"{what}: empty file")
    if len(data) > limits.max_bytes:
        raise AudioError(f"{what}: {len(data)} bytes, over the limit of {_size_text(limits.max_bytes)}")
    deadline = time.monotonic() + limits.timeout_s
    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            if f.format not in UPLOAD_FORMATS:
                raise AudioError(f"{what}: unsupported format {f.format}; send {_FORMATS_TEXT}", True)
            rate, channels = int(f.samplerate), int(f.channels)
            if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
                raise AudioError(f"{what}: sample rate {rate} Hz is outside {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE}")
            if not 1 <= channels <= MAX_CHANNELS:
                raise AudioError(f"{what}: {channels} channels; at most {MAX_CHANNELS}")
            max_frames = int(limits.max_seconds * rate)
            if f.frames > max_frames + rate // 10:  # the header's claim (estimated for mp3)
                raise AudioError(f"{what}: longer than {limits.max_seconds:g} seconds")
            if (max_frames + 1) * channels > MAX_DECODED_SAMPLES:
                raise AudioError(f"{what}: too many samples ({channels} channels at {rate} Hz); "
                                 "send mono or stereo at 48 kHz or less")
            blocks: list[np.ndarray] = []
            total, block = 0, max(1, int(_BLOCK_SECONDS * rate))
            while total <= max_frames:  # whatever length the header claims
                part = f.read(min(block, max_frames + 1 - total), dtype="float32", always_2d=True)
                if part.shape[0] == 0:
                    break
                blocks.append(part)
                total += part.shape[0]
                if time.monotonic() > deadline:
                    raise AudioError(f"{what}: took too long to decode; send a simpler {_FORMATS_TEXT} file")
    except AudioError:
        raise
    except (sf.LibsndfileError, sf.SoundFileError) as exc:
        raise _unreadable(what, exc) from None
    except (RuntimeError, TypeError, ValueError, OverflowError, MemoryError, EOFError, OSError):
        raise _unreadable(what) from None
    if total == 0:
        raise AudioError(f"{what}: the file holds no samples")
    if total > max_frames:
        raise AudioError(f"{what}: longer than {limits.max_seconds:g} seconds")
    samples = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
    if not np.isfinite(samples).all():
        raise AudioError(f"{what}: the file holds samples that are not finite numbers")
    samples = samples.T  # (C, T)
    if samples.shape[0] == 1:
        samples = samples[0]
    return DecodedAudio(np.ascontiguousarray(samples), rate)


def decode_base64_audio(text: str, what: str = "reference.audio",
                        limits: AudioLimits = AudioLimits()) -> DecodedAudio:
    if len(text) > (limits.max_bytes + 2) // 3 * 4 + 4:  # refuse before decoding
        raise AudioError(f"{what}: over the limit of {_size_text(limits.max_bytes)}")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise AudioError(f"{what}: not valid base64") from None
    return decode_audio(data, what, limits)


# Decoding runs on its own few threads: a file that makes libsndfile hang holds one of
# them, never the event loop nor the default executor the rest of the server uses.
_DECODERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="chorus-decode")


async def decode_in_thread(fn, *args, what: str, limits: AudioLimits) -> DecodedAudio:
    """`fn(*args)` (a decoder above) off the event loop, given up after the decode timeout."""
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(_DECODERS, fn, *args)
    try:
        return await asyncio.wait_for(future, timeout=limits.timeout_s + 1.0)
    except TimeoutError:
        raise AudioError(f"{what}: took too long to decode; send a simpler {_FORMATS_TEXT} file") from None


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
