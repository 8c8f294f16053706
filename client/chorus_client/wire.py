"""The protocol's frames, both ways: request dicts out, typed events in.

Fields the caller leaves at None are not sent, so options of a newer protocol wave
(`timestamps`, `keep_voice`, `first_chunk_seconds`) reach a server that knows them and
bother none that does not.
"""

from __future__ import annotations

import base64
import json
import struct
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import ChorusError, error_from
from .events import (
    Accepted,
    AudioChunk,
    Cancelled,
    Done,
    Event,
    Progress,
    Ready,
    Segment,
    Words,
    WordTiming,
)


@dataclass
class Reference:
    """One-shot cloning without saving a voice: an audio file's bytes and its transcript."""

    audio: bytes
    text: str | None = None

    @classmethod
    def from_file(cls, path: str | Path, text: str | None = None) -> Reference:
        return cls(Path(path).read_bytes(), text)

    def to_wire(self) -> dict[str, Any]:
        return {"audio": base64.b64encode(self.audio).decode("ascii"), "text": self.text}


@dataclass
class SynthesisOptions:
    """The `options` object; every field optional (the server's defaults apply). `extra`
    passes fields this client does not name yet."""

    num_step: int | None = None
    guidance_scale: float | None = None
    t_shift: float | None = None
    layer_penalty_factor: float | None = None
    position_temperature: float | None = None
    class_temperature: float | None = None
    denoise: bool | None = None
    speed: float | None = None
    duration: float | None = None
    seed: int | None = None
    postprocess: bool | None = None
    chunk_seconds: float | None = None
    chunk_threshold: float | None = None
    first_chunk_seconds: float | None = None
    normalize_text: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "extra" and v is not None}
        out.update(self.extra)
        return out


Options = SynthesisOptions | dict[str, Any] | None


def options_to_wire(options: Options) -> dict[str, Any] | None:
    if options is None:
        return None
    wire = options.to_wire() if isinstance(options, SynthesisOptions) else dict(options)
    return wire or None


def request_frame(kind: str, request_id: str, *, text: str | None = None, voice: str | None = None,
                  reference: Reference | dict[str, Any] | None = None, instruct: str | None = None,
                  language: str | None = None, encoding: str | None = None, sample_rate: int | None = None,
                  stream: str | None = None, progress: bool | None = None, options: Options = None,
                  timestamps: str | None = None, keep_voice: bool | None = None,
                  extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A `synthesize` or `stream_open` frame with only the fields that are set."""
    ref = reference.to_wire() if isinstance(reference, Reference) else reference
    fields = {"text": text, "voice": voice, "reference": ref, "instruct": instruct, "language": language,
              "encoding": encoding, "sample_rate": sample_rate, "stream": stream, "progress": progress,
              "options": options_to_wire(options), "timestamps": timestamps, "keep_voice": keep_voice}
    frame = {"type": kind, "id": request_id}
    frame.update({k: v for k, v in fields.items() if v is not None})
    frame.update(extra or {})
    return frame


def dumps(frame: dict[str, Any]) -> str:
    return json.dumps(frame, separators=(",", ":"), ensure_ascii=False)


def parse_audio(frame: bytes, received_at: float | None = None) -> AudioChunk:
    """A binary audio frame: 4-byte big-endian header length, JSON header, samples.
    `received_at` (`time.perf_counter()`, now when not given) is when it came off the socket."""
    (n,) = struct.unpack(">I", frame[:4])
    header = json.loads(frame[4:4 + n])
    return AudioChunk(request_id=header["id"], data=frame[4 + n:], sample_rate=header["sample_rate"],
                      encoding=header["encoding"], samples=header["samples"], chunk=header.get("chunk", 0),
                      final=bool(header.get("final")), segment=header.get("segment"),
                      offset_samples=header.get("offset_samples"),
                      received_at=time.perf_counter() if received_at is None else received_at, header=header)


def parse_ready(msg: dict[str, Any]) -> Ready:
    return Ready(protocol=msg.get("protocol", 1), model=msg.get("model", ""), sample_rate=msg["sample_rate"],
                 encodings=list(msg.get("encodings", [])), sample_rates=list(msg.get("sample_rates", [])),
                 limits=dict(msg.get("limits", {})))


def _timings(items: list[dict[str, Any]] | None, sample_rate: int) -> list[WordTiming]:
    return [WordTiming(w["text"], int(w["start_samples"]), int(w["end_samples"]), sample_rate)
            for w in items or []]


def parse_event(msg: dict[str, Any], sample_rate: int) -> Event | ChorusError | None:
    """A JSON server frame with an id as an event (an error as a `ChorusError`); None for
    frame types this client does not know (a newer server's additions are skipped)."""
    kind, rid = msg.get("type"), msg.get("id")
    if kind == "accepted":
        return Accepted(rid, msg.get("chunks"), list(msg.get("target_seconds") or []))
    if kind == "progress":
        return Progress(rid, msg.get("chunk", 0), msg["step"], msg["num_steps"], msg["fraction"], msg.get("segment"))
    if kind == "words":
        chars = _timings(msg["chars"], sample_rate) if "chars" in msg else None
        return Words(rid, _timings(msg.get("words"), sample_rate), chars, msg.get("segment"), msg.get("source"))
    if kind == "segment":
        return Segment(rid, msg["segment"], msg.get("text", ""), msg["offset_samples"], msg["samples"])
    if kind == "done":
        return Done(rid, msg.get("chunks", 0), msg.get("audio_seconds", 0.0), dict(msg.get("timings") or {}),
                    msg.get("voice_id"))
    if kind == "cancelled":
        return Cancelled(rid)
    if kind == "error":
        return error_from(msg)
    return None
