"""Streaming audio encoders: the model's float samples in, a format's bytes out, chunk by chunk.

Every output format goes through one `StreamEncoder`: `push(samples, last)` as each chunk of
a request arrives returns the bytes that are ready (a client can play them at once); `last`
flushes the tail. No codec is written by hand:
- `mp3`, `aac` (ADTS) and `opus` (Ogg Opus, or bare Opus packets for the WebSocket) go through
  PyAV (FFmpeg's libmp3lame, native AAC and libopus). libsndfile also writes MP3, but it seeks
  back to the file's start on close to patch a header, so it cannot stream to a socket.
- `mulaw` / `alaw` (G.711) go through `audioop` (the standard library's up to Python 3.12, the
  `audioop-lts` package after): CCITT's reference coder, bit-exact with G.711's tables.
  libsndfile's ULAW/ALAW round to the nearer level at 381 of the 65536 inputs, so it is not.
  One byte per sample, no state: each chunk is converted on its own.
- `pcm_s16le`, `f32le` and `wav` are the samples themselves (`audio_io.encode_samples`).
- Another sample rate goes through soxr's streaming resampler (`HQ`), so chunk joins are seamless.

Encoding is request-controlled work (a chunk's length is the request's): `encode` runs codecs
and resampling on a worker thread, off the event loop, and only a cast of plain samples short
enough to cost less than the hop there (`INLINE_SECONDS`) on the loop itself.
"""

from __future__ import annotations

import asyncio
import threading
import warnings
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import soxr

with warnings.catch_warnings():  # the standard library's copy warns that it leaves in 3.13
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

from server.audio.files import encode_samples, to_pcm16, wav_header

TELEPHONY_RATE = 8000
INLINE_SECONDS = 30.0  # plain samples cast on the loop up to this much audio a chunk
_BIT_RATES = {"mp3": 64000, "aac": 64000, "opus": 32000}


# HTTP `response_format` -> content type (flac is written whole; the others stream)
MEDIA_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
               "wav": "audio/wav", "pcm": "audio/pcm"}


@dataclass(frozen=True)
class Encoded:
    """What one `push` made: the bytes, how many samples they decode to, and (bare Opus
    only) the byte length of each packet in `data`, in order."""

    data: bytes
    samples: int
    packets: list[int] | None = None


class StreamEncoder:
    """One request's encoder: `push(samples, last)` per chunk, in order; `last` on the final
    one flushes the resampler and the codec. The audio arrives at `in_rate` and leaves at
    `out_rate` (soxr's streaming resampler between, `HQ`, so chunk joins are seamless)."""

    def __init__(self, in_rate: int, out_rate: int):
        self.out_rate = out_rate
        self._resampler = None if in_rate == out_rate else soxr.ResampleStream(
            in_rate, out_rate, 1, dtype="float32", quality="HQ")
        # a push may run on a worker thread (`encode`) while its request ends on the loop: close
        # then waits for the push, which closes on its way out (`close` never blocks the loop)
        self._using = threading.RLock()
        self._close_after_push = False

    def push(self, samples: np.ndarray, last: bool = False) -> Encoded:
        with self._using:
            try:
                samples = np.ascontiguousarray(samples, dtype=np.float32)
                if self._resampler is not None:
                    samples = self._resampler.resample_chunk(samples, last=last)
                return self._encode(samples, last)
            finally:
                if self._close_after_push:
                    self._release()

    def close(self) -> None:
        """Let go of what the codec holds (a request that ends early never sends `last`); with
        a push in flight on another thread, that push does it as it ends."""
        if self._using.acquire(blocking=False):
            try:
                self._release()
            finally:
                self._using.release()
        else:
            self._close_after_push = True

    def _release(self) -> None:
        """Free the codec (safe to call twice)."""

    def _encode(self, samples: np.ndarray, last: bool) -> Encoded:
        raise NotImplementedError

    def cheap(self, samples: int) -> bool:
        """Whether pushing `samples` is a plain cast, short enough for the event loop."""
        return False


class RawEncoder(StreamEncoder):
    """pcm_s16le / f32le samples; with `wav`, a streamed WAV (the header first, its sizes
    "unknown", as streamed WAV is written)."""

    def __init__(self, encoding: str, in_rate: int, out_rate: int, wav: bool = False):
        super().__init__(in_rate, out_rate)
        self.encoding = encoding
        self._header = wav_header(out_rate, None) if wav else b""

    def _encode(self, samples: np.ndarray, last: bool) -> Encoded:
        head, self._header = self._header, b""
        return Encoded(head + encode_samples(samples, self.encoding), int(samples.size))

    def cheap(self, samples: int) -> bool:
        return self._resampler is None and samples <= INLINE_SECONDS * self.out_rate


class G711Encoder(StreamEncoder):
    """mu-law or A-law, one byte per sample, from the 16-bit samples the other encodings send."""

    def __init__(self, law: str, in_rate: int, out_rate: int):
        super().__init__(in_rate, out_rate)
        self._convert = {"mulaw": audioop.lin2ulaw, "alaw": audioop.lin2alaw}[law]

    def _encode(self, samples: np.ndarray, last: bool) -> Encoded:
        return Encoded(self._convert(to_pcm16(samples).tobytes(), 2), int(samples.size))


class _Sink:
    """Where PyAV's muxer writes: collects bytes until taken; not seekable, so the muxer
    never goes back to patch what a client already has."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def seekable(self) -> bool:
        return False

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


class _AVBase(StreamEncoder):
    def __init__(self, in_rate: int, out_rate: int):
        import av  # lazy: FFmpeg's libraries load only where a compressed format is asked for

        super().__init__(in_rate, out_rate)
        self._av = av
        self._pts = 0

    def _frame(self, samples: np.ndarray):
        frame = self._av.AudioFrame.from_ndarray(samples[None, :], format="flt", layout="mono")
        frame.sample_rate, frame.pts = self.out_rate, self._pts
        self._pts += samples.size
        return frame

    def _packets(self, encode, samples: np.ndarray, last: bool) -> list:
        packets = list(encode(self._frame(samples))) if samples.size else []
        return packets + list(encode(None)) if last else packets


class AVEncoder(_AVBase):
    """mp3 / aac (ADTS) / opus (Ogg) through PyAV's encoders and muxers, packet by packet."""

    _CODECS: ClassVar[dict[str, tuple[str, str, dict]]] = {"mp3": ("mp3", "libmp3lame", {}),
               "aac": ("adts", "aac", {}),
               # a page every 100 ms at most, so a chunk's audio leaves with the chunk
               "opus": ("ogg", "libopus", {"page_duration": "100000"})}

    def __init__(self, fmt: str, in_rate: int, out_rate: int):
        super().__init__(in_rate, out_rate)
        container, codec, options = self._CODECS[fmt]
        self._sink = _Sink()
        self._out = self._av.open(self._sink, mode="w", format=container, options=options)
        self._stream = self._out.add_stream(codec, rate=out_rate, layout="mono")
        self._stream.bit_rate = _BIT_RATES[fmt]
        self._open = True

    def _encode(self, samples: np.ndarray, last: bool) -> Encoded:
        self._out.mux(self._packets(self._stream.encode, samples, last))
        if last:
            self._release()
        return Encoded(self._sink.take(), int(samples.size))

    def _release(self) -> None:
        """End the container (its trailer goes to the sink); safe to call twice."""
        if self._open:
            self._open = False
            self._out.close()


class OpusPacketEncoder(_AVBase):
    """Bare Opus packets (20 ms each), no container: what WebCodecs' `AudioDecoder` takes
    (`{codec: "opus", sampleRate, numberOfChannels: 1}`), one `EncodedAudioChunk` a packet."""

    def __init__(self, in_rate: int, out_rate: int):
        super().__init__(in_rate, out_rate)
        self._codec = self._av.CodecContext.create("libopus", "w")
        self._codec.sample_rate = out_rate
        self._codec.layout = "mono"
        self._codec.format = "flt"
        self._codec.bit_rate = _BIT_RATES["opus"]

    def _encode(self, samples: np.ndarray, last: bool) -> Encoded:
        packets = [bytes(p) for p in self._packets(self._codec.encode, samples, last)]
        return Encoded(b"".join(packets), int(samples.size), [len(p) for p in packets])


async def encode(encoder: StreamEncoder, samples: np.ndarray, last: bool) -> Encoded:
    """`encoder.push(samples, last)`, off the event loop unless it is a short plain cast. The
    caller pushes one request's chunks in order (an encoder is used by one task at a time)."""
    if encoder.cheap(int(samples.shape[-1])):
        return encoder.push(samples, last)
    return await asyncio.to_thread(encoder.push, samples, last)


def http_encoder(fmt: str, rate: int) -> StreamEncoder:
    """The streaming encoder of an HTTP `response_format` (not flac: written whole)."""
    if fmt in ("mp3", "aac", "opus"):
        return AVEncoder(fmt, rate, rate)
    if fmt in ("wav", "pcm"):
        return RawEncoder("pcm_s16le", rate, rate, wav=fmt == "wav")
    raise ValueError(f"no streaming encoder for {fmt!r}")


def ws_encoder(encoding: str, in_rate: int, out_rate: int) -> StreamEncoder:
    """The encoder of a WebSocket `encoding` at `out_rate` Hz."""
    if encoding in ("mulaw", "alaw"):
        return G711Encoder(encoding, in_rate, out_rate)
    if encoding == "opus":
        return OpusPacketEncoder(in_rate, out_rate)
    return RawEncoder(encoding, in_rate, out_rate)


def default_rate(encoding: str, model_rate: int) -> int:
    """A WebSocket request's rate when it names none: 8 kHz for telephony, else the model's."""
    return TELEPHONY_RATE if encoding in ("mulaw", "alaw") else model_rate
