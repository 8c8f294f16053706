"""A job's results as files: an item's audio in its format, all items as one zip written as it
is sent, and the chained voice a job keeps between its items.

Items are made whole (`stream: "whole"`), so each is encoded once, as the speech endpoint's
whole files are (a WAV header with its true length; FLAC by libsndfile; mp3, Ogg Opus and AAC by
the same PyAV encoders). The zip is stored, not deflated (audio does not compress), and written
to an unseekable sink entry by entry, so an archive of an hour of audio never sits in memory
whole: one item at a time does.
"""

from __future__ import annotations

import io
import zipfile

import numpy as np

from server.audio.encoders import http_encoder
from server.audio.files import encode_flac, encode_samples, wav_header
from server.engine.types import VoicePrompt
from server.voices.kept import FORMAT_VERSION, voice_blob
from server.voices.pace import sets_pace


def encode_whole(fmt: str, audio: np.ndarray, rate: int) -> bytes:
    """One item's audio as a whole file of `fmt` (off the event loop: a codec's work)."""
    if fmt == "flac":
        return encode_flac(audio, rate)
    if fmt in ("wav", "pcm"):
        head = wav_header(rate, int(audio.shape[-1])) if fmt == "wav" else b""
        return head + encode_samples(audio, "pcm_s16le")
    encoder = http_encoder(fmt, rate)
    try:
        return encoder.push(audio, last=True).data
    finally:
        encoder.close()


def entry_name(n: int, total: int, fmt: str) -> str:
    """An item's name in the archive: its number, zero-padded so names sort in item order."""
    return f"{n:0{max(4, len(str(max(0, total - 1))))}d}.{fmt}"


class _Sink(io.RawIOBase):
    """An unseekable file that keeps what is written until it is taken (zipfile then writes
    each entry's sizes after its data)."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out, self._parts = b"".join(self._parts), []
        return out


class ZipStream:
    """A zip written entry by entry: `add` returns the bytes that entry made, `close` the
    central directory."""

    def __init__(self) -> None:
        self._sink = _Sink()
        self._zip = zipfile.ZipFile(self._sink, "w", compression=zipfile.ZIP_STORED, allowZip64=True)

    def add(self, name: str, data: bytes) -> bytes:
        self._zip.writestr(zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0)), data)
        return self._sink.take()

    def close(self) -> bytes:
        self._zip.close()
        return self._sink.take()


def chained_blob(tokens: np.ndarray, text: str, frame_rate: float) -> bytes:
    """The voice a chained job's first item made, as stored in the job (a kept voice's layout)."""
    return voice_blob(np.asarray(tokens), text.strip(), sets_pace(int(tokens.shape[-1]), frame_rate))


def chained_prompt(blob: bytes) -> VoicePrompt:
    """The stored voice back as a prompt, in numpy (the engine takes integer arrays as tokens)."""
    with np.load(io.BytesIO(blob), allow_pickle=False) as npz:
        if int(npz["format"]) != FORMAT_VERSION:
            raise ValueError(f"unsupported stored voice format {int(npz['format'])}")
        return VoicePrompt(tokens=npz["tokens"].astype(np.int64), text=str(npz["text"]), rms=None,
                           sets_pace=bool(npz["sets_pace"]))
