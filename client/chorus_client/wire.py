"""The protocol's frames, both ways: request dicts out, typed events in.

Fields the caller leaves at None are not sent, so options of a newer protocol wave
(`timestamps`, `keep_voice`, `first_chunk_seconds`) reach a server that knows them and
bother none that does not.
"""

from __future__ import annotations

import base64
import json
import math
import struct
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from .errors import ChorusError, HandshakeError, ProtocolError, error_from
from .events import (
    Accepted,
    AudioChunk,
    Cancelled,
    Done,
    Event,
    Line,
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
    normalize_text: bool | Literal["reference"] | None = None  # "reference": the reference's normaliser, for parity
    extra: dict[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "extra" and v is not None}
        out.update(self.extra)
        return out


Options = SynthesisOptions | dict[str, Any] | None


@dataclass
class DialogueLine:
    """One line of a dialogue: what is said, in which voice (a built-in name, a library or kept
    voice; None: the dialogue's one automatic voice), optionally how (`instruct`, and knobs over
    the dialogue's `options`)."""

    text: str
    voice: str | None = None
    instruct: str | None = None
    options: Options = None

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"voice": self.voice, "text": self.text}
        if self.instruct is not None:
            out["instruct"] = self.instruct
        if (options := options_to_wire(self.options)) is not None:
            out["options"] = options
        return out


LineSpec = DialogueLine | dict[str, Any] | tuple[str | None, str]


def line_to_wire(line: LineSpec) -> dict[str, Any]:
    """A dialogue line as the protocol's object: a `DialogueLine`, a dict (as it is), or a
    `(voice, text)` pair."""
    if isinstance(line, DialogueLine):
        return line.to_wire()
    if isinstance(line, tuple) and len(line) == 2:
        return {"voice": line[0], "text": line[1]}
    if isinstance(line, dict):
        return dict(line)
    raise TypeError(f"a dialogue line is a DialogueLine, a dict or a (voice, text) pair, not {type(line).__name__}")


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


def dialogue_frame(request_id: str, lines: list[LineSpec], *, pause_ms: int | None = None,
                   language: str | None = None, encoding: str | None = None, sample_rate: int | None = None,
                   progress: bool | None = None, options: Options = None, timestamps: str | None = None,
                   extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A `dialogue` frame with only the fields that are set."""
    fields = {"pause_ms": pause_ms, "language": language, "encoding": encoding, "sample_rate": sample_rate,
              "progress": progress, "options": options_to_wire(options), "timestamps": timestamps}
    frame: dict[str, Any] = {"type": "dialogue", "id": request_id, "lines": [line_to_wire(line) for line in lines]}
    frame.update({k: v for k, v in fields.items() if v is not None})
    frame.update(extra or {})
    return frame


def dumps(frame: dict[str, Any]) -> str:
    return json.dumps(frame, separators=(",", ":"), ensure_ascii=False)


class Malformed(ValueError):
    """A field of a server frame or body that is missing or of the wrong type (the caller
    turns it into the `ProtocolError` of the request it concerns)."""


_REQUIRED: Any = object()
INT: tuple[type, ...] = (int,)
NUMBER: tuple[type, ...] = (int, float)
TEXT: tuple[type, ...] = (str,)


def typed(obj: dict[str, Any], key: str, kinds: tuple[type, ...], default: Any = _REQUIRED) -> Any:
    """`obj[key]` if it is one of `kinds` (JSON's types: a bool is no int, NaN no number);
    `default` when it is missing or null, or `Malformed` when no default is given."""
    value = obj.get(key)
    if value is None:
        if default is _REQUIRED:
            raise Malformed(f"{key!r} is missing")
        return default
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds) \
            or (isinstance(value, float) and not math.isfinite(value)):
        names = " or ".join(k.__name__ for k in kinds)
        raise Malformed(f"{key!r} is {type(value).__name__} {_excerpt(value)}, not {names}")
    return value


def typed_list(obj: dict[str, Any], key: str, kinds: tuple[type, ...]) -> list[Any]:
    """`obj[key]` as a list whose every item is one of `kinds` (empty when missing)."""
    items = typed(obj, key, (list,), [])
    for i, item in enumerate(items):
        typed({f"{key}[{i}]": item}, f"{key}[{i}]", kinds)
    return list(items)


def _at_least(value: int, key: str, minimum: int) -> int:
    if value < minimum:
        raise Malformed(f"{key!r} is {value}, below {minimum}")
    return value


def _excerpt(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def decode_frame(frame: str | bytes) -> dict[str, Any]:
    """A JSON text frame as an object; `ProtocolError` (with no request: nothing in it can be
    trusted to name one) when it is not JSON or not an object."""
    try:
        msg = json.loads(frame)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ProtocolError(f"a frame that is not JSON ({exc}): {_excerpt(frame)}") from None
    if not isinstance(msg, dict):
        raise ProtocolError(f"a frame that is JSON but not an object: {_excerpt(msg)}")
    return msg


def request_id_of(msg: dict[str, Any]) -> str | None:
    """The request a frame names, when it names one as the protocol spells ids."""
    rid = msg.get("id")
    return rid if isinstance(rid, str) and rid else None


def parse_audio(frame: bytes, received_at: float | None = None) -> AudioChunk:
    """A binary audio frame: 4-byte big-endian header length, JSON header, samples.
    `received_at` (`time.perf_counter()`, now when not given) is when it came off the socket.
    A frame whose header names no request raises an unattributed `ProtocolError`; one whose
    other fields are wrong raises it for the request it names."""
    if len(frame) < 4:
        raise ProtocolError(f"an audio frame of {len(frame)} bytes, shorter than its length prefix")
    (n,) = struct.unpack(">I", frame[:4])
    if n > len(frame) - 4:
        raise ProtocolError(f"an audio frame whose header length {n} passes its {len(frame)} bytes")
    header = decode_frame(frame[4:4 + n])
    rid = request_id_of(header)
    if rid is None:
        raise ProtocolError(f"an audio frame whose header names no request: {_excerpt(header)}")
    try:
        return AudioChunk(request_id=rid, data=frame[4 + n:],
                          sample_rate=_at_least(typed(header, "sample_rate", INT), "sample_rate", 1),
                          encoding=typed(header, "encoding", TEXT),
                          samples=_at_least(typed(header, "samples", INT), "samples", 0),
                          chunk=typed(header, "chunk", INT, 0), final=typed(header, "final", (bool,), False),
                          segment=typed(header, "segment", INT, None),
                          offset_samples=typed(header, "offset_samples", INT, None),
                          received_at=time.perf_counter() if received_at is None else received_at, header=header,
                          line=typed(header, "line", INT, None))
    except Malformed as exc:
        raise ProtocolError(f"audio frame of {rid}: {exc}", request_id=rid) from None


def parse_ready(msg: Any) -> Ready:
    """The server's greeting, every field checked: a greeting this client cannot read raises
    `HandshakeError` (the connection is then unusable: its rates are unknown)."""
    if not isinstance(msg, dict) or msg.get("type") != "ready":
        raise HandshakeError(f"the server's first frame is not a ready frame: {_excerpt(msg, 120)}")
    try:
        return Ready(protocol=typed(msg, "protocol", INT, 1), model=typed(msg, "model", TEXT, ""),
                     sample_rate=_at_least(typed(msg, "sample_rate", INT), "sample_rate", 1),
                     encodings=typed_list(msg, "encodings", TEXT), sample_rates=typed_list(msg, "sample_rates", INT),
                     limits=dict(typed(msg, "limits", (dict,), {})))
    except Malformed as exc:
        raise HandshakeError(f"the server's ready frame is malformed: {exc}") from None


def _timings(msg: dict[str, Any], key: str, sample_rate: int) -> list[WordTiming]:
    timings = []
    for i, item in enumerate(typed_list(msg, key, (dict,))):
        try:
            timings.append(WordTiming(typed(item, "text", TEXT, ""), int(typed(item, "start_samples", NUMBER)),
                                      int(typed(item, "end_samples", NUMBER)), sample_rate))
        except Malformed as exc:
            raise Malformed(f"{key}[{i}]: {exc}") from None
    return timings


def parse_event(msg: dict[str, Any], sample_rate: int) -> Event | ChorusError | None:
    """A JSON server frame with an id as an event (an error as a `ChorusError`); None for
    frame types this client does not know (a newer server's additions are skipped). A frame
    with a field missing or mistyped raises `ProtocolError` for the request it names, or
    with no request when it names none (the caller then cannot tell whose it was)."""
    kind, rid = msg.get("type"), request_id_of(msg)
    if not isinstance(kind, str):
        raise ProtocolError(f"a frame with no type: {_excerpt(msg)}", request_id=rid)
    if kind == "error":
        return error_from(msg)
    if kind not in _EVENT_KINDS:
        return None
    if rid is None:
        raise ProtocolError(f"a {kind} frame that names no request: {_excerpt(msg)}")
    try:
        return _EVENT_KINDS[kind](msg, rid, sample_rate)
    except Malformed as exc:
        raise ProtocolError(f"{kind} frame of {rid}: {exc}", request_id=rid) from None


def _accepted(msg: dict[str, Any], rid: str, sample_rate: int) -> Accepted:
    return Accepted(rid, typed(msg, "chunks", INT, None), typed_list(msg, "target_seconds", NUMBER))


def _progress(msg: dict[str, Any], rid: str, sample_rate: int) -> Progress:
    return Progress(rid, typed(msg, "chunk", INT, 0), typed(msg, "step", INT), typed(msg, "num_steps", INT),
                    typed(msg, "fraction", NUMBER), typed(msg, "segment", INT, None), typed(msg, "line", INT, None))


def _words(msg: dict[str, Any], rid: str, sample_rate: int) -> Words:
    chars = _timings(msg, "chars", sample_rate) if msg.get("chars") is not None else None
    return Words(rid, _timings(msg, "words", sample_rate), chars, typed(msg, "segment", INT, None),
                 typed(msg, "source", TEXT, None), typed(msg, "line", INT, None))


def _segment(msg: dict[str, Any], rid: str, sample_rate: int) -> Segment:
    return Segment(rid, typed(msg, "segment", INT), typed(msg, "text", TEXT, ""), typed(msg, "offset_samples", INT),
                   typed(msg, "samples", INT))


def _line(msg: dict[str, Any], rid: str, sample_rate: int) -> Line:
    return Line(rid, _at_least(typed(msg, "line", INT), "line", 0), typed(msg, "voice", TEXT, None),
                typed(msg, "text", TEXT, ""), typed(msg, "offset_samples", INT), sample_rate)


def _done(msg: dict[str, Any], rid: str, sample_rate: int) -> Done:
    return Done(rid, typed(msg, "chunks", INT, 0), typed(msg, "audio_seconds", NUMBER, 0.0),
                dict(typed(msg, "timings", (dict,), {})), typed(msg, "voice_id", TEXT, None))


def _cancelled(msg: dict[str, Any], rid: str, sample_rate: int) -> Cancelled:
    return Cancelled(rid)


# the server frames of a request, each read by its own function; "error" is read by error_from
_EVENT_KINDS: dict[str, Callable[[dict[str, Any], str, int], Event]] = {
    "accepted": _accepted, "progress": _progress, "words": _words, "segment": _segment, "line": _line,
    "done": _done, "cancelled": _cancelled,
}
