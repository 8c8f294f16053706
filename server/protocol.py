"""Every wire message of the Chorus protocol (docs/protocol.md, version 1), in one place.

msgspec Structs give the shapes and ranges; `parse_client_message` turns any client text
frame into a typed message or a `ProtocolError` whose message names the offending field
(`options.num_step: must be 1..64`), so a bad frame is always answered, never fatal.
The OpenAI-compatible speech body lives here too: it is the same request, other spelling.
"""

from __future__ import annotations

import math
import re
import struct
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct, field

PROTOCOL_VERSION = 1
MAX_NUM_STEP = 64
ENCODINGS = ("pcm_s16le", "f32le")
ERROR_CODES = (
    "bad_message", "invalid_request", "duplicate_id", "voice_not_found", "text_too_long",
    "too_many_requests", "busy", "unauthorized", "internal",
)
ID_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # "any 64-bit integer", signed or unsigned

Encoding = Literal["pcm_s16le", "f32le"]
ErrorCode = Literal[
    "bad_message", "invalid_request", "duplicate_id", "voice_not_found", "text_too_long",
    "too_many_requests", "busy", "unauthorized", "internal",
]
NonNegative = Annotated[float, Meta(ge=0)]
Positive = Annotated[float, Meta(gt=0)]


class ProtocolError(Exception):
    """A client message we refuse; becomes an `error` frame (or an HTTP error body)."""

    def __init__(self, code: str, message: str, request_id: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


# ---- client -> server ------------------------------------------------------------------


class Options(Struct, forbid_unknown_fields=True, kw_only=True):
    """Generation knobs; every field optional, defaults are the reference's."""

    num_step: Annotated[int, Meta(ge=1, le=MAX_NUM_STEP)] = 32
    guidance_scale: Annotated[float, Meta(ge=0, le=10)] = 2.0
    t_shift: Annotated[float, Meta(gt=0, le=1)] = 0.1
    layer_penalty_factor: NonNegative = 5.0
    position_temperature: NonNegative = 5.0
    class_temperature: NonNegative = 0.0
    denoise: bool = True
    speed: Annotated[float, Meta(ge=0.25, le=4)] | None = None
    duration: Positive | None = None
    seed: int | None = None
    postprocess: bool = True
    chunk_seconds: Positive = 15.0
    chunk_threshold: NonNegative = 30.0


class Reference(Struct, forbid_unknown_fields=True):
    """One-shot cloning: a base64 audio file and its transcript (optional with ASR)."""

    audio: str
    text: str | None = None


class Synthesize(Struct, tag="synthesize", tag_field="type", forbid_unknown_fields=True, kw_only=True):
    id: Annotated[str, Meta(pattern=ID_PATTERN)]
    text: str
    voice: str | None = None
    reference: Reference | None = None
    instruct: str | None = None
    language: str | None = None
    encoding: Encoding = "pcm_s16le"
    # "sentence" is accepted as another name for "chunk" (docs/protocol.md's example spells it so).
    stream: Literal["chunk", "whole", "sentence"] = "chunk"
    progress: bool = True
    options: Options = field(default_factory=Options)

    @property
    def stream_mode(self) -> Literal["chunk", "whole"]:
        return "whole" if self.stream == "whole" else "chunk"


class Cancel(Struct, tag="cancel", tag_field="type", forbid_unknown_fields=True):
    id: Annotated[str, Meta(pattern=ID_PATTERN)]


class Ping(Struct, tag="ping", tag_field="type", forbid_unknown_fields=True):
    pass


ClientMessage = Synthesize | Cancel | Ping
_CLIENT_TYPES: dict[str, type] = {"synthesize": Synthesize, "cancel": Cancel, "ping": Ping}


# ---- server -> client ------------------------------------------------------------------


class Limits(Struct):
    max_text_chars: int
    max_inflight: int
    max_num_step: int = MAX_NUM_STEP


class Ready(Struct, tag="ready", tag_field="type"):
    model: str
    sample_rate: int
    limits: Limits
    protocol: int = PROTOCOL_VERSION
    encodings: list[str] = field(default_factory=lambda: list(ENCODINGS))


class AcceptedMsg(Struct, tag="accepted", tag_field="type"):
    id: str
    chunks: int
    target_seconds: list[float]


class ProgressMsg(Struct, tag="progress", tag_field="type"):
    id: str
    chunk: int
    step: int
    num_steps: int
    fraction: float


class AudioHeader(Struct, tag="audio", tag_field="type"):
    id: str
    chunk: int
    final: bool
    sample_rate: int
    encoding: str
    samples: int


class Timings(Struct):
    queue_ms: float
    first_audio_ms: float | None
    total_ms: float


class Done(Struct, tag="done", tag_field="type"):
    id: str
    chunks: int
    audio_seconds: float
    timings: Timings


class Cancelled(Struct, tag="cancelled", tag_field="type"):
    id: str


class ErrorMsg(Struct, tag="error", tag_field="type"):
    id: str | None
    code: str
    message: str


class Pong(Struct, tag="pong", tag_field="type"):
    pass


ServerMessage = Ready | AcceptedMsg | ProgressMsg | Done | Cancelled | ErrorMsg | Pong

_encoder = msgspec.json.Encoder()


def encode(message: Struct) -> str:
    """A server message as the JSON text of one frame."""
    return _encoder.encode(message).decode()


def audio_frame(header: AudioHeader, payload: bytes) -> bytes:
    """Binary audio frame: 4-byte big-endian header length, UTF-8 JSON header, samples."""
    head = _encoder.encode(header)
    return struct.pack(">I", len(head)) + head + payload


def split_audio_frame(frame: bytes) -> tuple[dict[str, Any], bytes]:
    """Inverse of `audio_frame` (for clients and tests)."""
    (n,) = struct.unpack(">I", frame[:4])
    return msgspec.json.decode(frame[4 : 4 + n]), frame[4 + n :]


# ---- parsing ---------------------------------------------------------------------------

# Human wording for range failures, keyed by field path; other failures keep msgspec's words.
_RULES = {
    "id": "must be 1-64 characters of A-Z a-z 0-9 _ . -",
    "options.num_step": f"must be an integer 1..{MAX_NUM_STEP}",
    "options.guidance_scale": "must be 0..10",
    "options.t_shift": "must be in (0, 1]",
    "options.layer_penalty_factor": "must be >= 0",
    "options.position_temperature": "must be >= 0",
    "options.class_temperature": "must be >= 0",
    "options.speed": "must be 0.25..4 or null",
    "options.duration": "must be seconds > 0 or null",
    "options.chunk_seconds": "must be > 0",
    "options.chunk_threshold": "must be >= 0",
    "encoding": "must be one of " + ", ".join(ENCODINGS),
    "stream": "must be chunk or whole",
}
_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<name>[^`]*)`")
_CONSTRAINT = re.compile(r"^Expected `\w+` (?:[<>]=?|matching regex)")
_MISSING = re.compile(r"Object missing required field `(?P<name>[^`]*)`")


def describe_validation_error(exc: msgspec.ValidationError, rules: dict[str, str] | None = None) -> str:
    """msgspec's `Expected ... - at $.options.num_step` as `options.num_step: must be 1..64`."""
    match = _AT.match(str(exc))
    assert match is not None
    msg, path = match.group("msg"), (match.group("path") or "").lstrip(".")
    for pattern, what in ((_UNKNOWN, "unknown field"), (_MISSING, "required")):
        if found := pattern.match(msg):
            name = f"{path}.{found.group('name')}" if path else found.group("name")
            return f"{name}: {what}"
    rule = (rules or _RULES).get(path)
    if "got `null`" in msg:
        return f"{path}: must not be null"
    if rule is not None and (_CONSTRAINT.search(msg) or msg.startswith("Invalid enum")):
        return f"{path}: {rule}"
    text = msg[0].lower() + msg[1:] if msg else "invalid"
    return f"{path}: {text}" if path else text


def _check_numbers(options: Options, prefix: str = "options.") -> None:
    for name in Options.__struct_fields__:
        value = getattr(options, name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ProtocolError("invalid_request", f"{prefix}{name}: must be a finite number")
    if options.seed is not None and not SEED_MIN <= options.seed <= SEED_MAX:
        raise ProtocolError("invalid_request", f"{prefix}seed: must be a 64-bit integer")


def check_synthesize(msg: Synthesize) -> None:
    """Rules a schema cannot say: non-empty text, voice/reference exclusive, finite numbers."""
    if not msg.text.strip():
        raise ProtocolError("invalid_request", "text: must not be empty", msg.id)
    if msg.voice is not None and msg.reference is not None:
        raise ProtocolError("invalid_request", "reference: voice and reference are exclusive; send one", msg.id)
    if msg.voice is not None and not msg.voice:
        raise ProtocolError("invalid_request", "voice: must be a voice id or null", msg.id)
    if msg.reference is not None and not msg.reference.audio:
        raise ProtocolError("invalid_request", "reference.audio: must be a base64 audio file", msg.id)
    try:
        _check_numbers(msg.options)
    except ProtocolError as exc:
        exc.request_id = msg.id
        raise


def _decode_json(data: str | bytes) -> Any:
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise ProtocolError("bad_message", f"not valid JSON: {exc}") from None
    except RecursionError:  # msgspec's depth limit: arrays or objects nested too deeply
        raise ProtocolError("bad_message", "not valid JSON: nested too deeply") from None


def parse_client_message(data: str | bytes) -> ClientMessage:
    """One client text frame -> a typed message; raises `ProtocolError` naming the problem."""
    raw = _decode_json(data)
    if not isinstance(raw, dict):
        raise ProtocolError("bad_message", "a message must be a JSON object with a `type`")
    kind = raw.get("type")
    if kind is None:
        raise ProtocolError("bad_message", "type: required (synthesize, cancel or ping)")
    target = _CLIENT_TYPES.get(kind) if isinstance(kind, str) else None
    if target is None:
        raise ProtocolError("bad_message", f"type: unknown message type {kind!r} (synthesize, cancel or ping)")
    raw_id = raw.get("id")
    request_id = raw_id if isinstance(raw_id, str) else None
    try:
        message = msgspec.convert(raw, target)
    except msgspec.ValidationError as exc:
        raise ProtocolError("invalid_request", describe_validation_error(exc), request_id) from None
    if isinstance(message, Synthesize):
        check_synthesize(message)
    return message


# ---- OpenAI-compatible speech ----------------------------------------------------------

SpeechFormat = Literal["wav", "pcm", "flac"]


class SpeechRequest(Options, forbid_unknown_fields=True, kw_only=True):
    """`POST /v1/audio/speech`: OpenAI's fields plus OmniVoice's knobs at top level.

    The knobs (ranges and defaults) are `Options`' own, inherited, so the two spellings of a
    request can never disagree.
    """

    input: str
    model: Any = None
    voice: str | None = None
    instructions: str | None = None
    response_format: SpeechFormat = "wav"
    stream_format: Literal["audio"] | None = None  # OpenAI's; only raw audio is offered
    language: str | None = None

    def options(self) -> Options:
        return Options(**{name: getattr(self, name) for name in Options.__struct_fields__})


_SPEECH_RULES = {k.removeprefix("options."): v for k, v in _RULES.items() if k.startswith("options.")}
_SPEECH_RULES["response_format"] = "must be wav, pcm or flac"
_SPEECH_RULES["stream_format"] = "must be audio (server-sent events are not offered)"


def parse_speech_request(body: bytes) -> SpeechRequest:
    """The JSON body of `/v1/audio/speech` -> a typed request; `ProtocolError` otherwise."""
    raw = _decode_json(body)
    if not isinstance(raw, dict):
        raise ProtocolError("bad_message", "the body must be a JSON object")
    try:
        req = msgspec.convert(raw, SpeechRequest)
    except msgspec.ValidationError as exc:
        raise ProtocolError("invalid_request", describe_validation_error(exc, _SPEECH_RULES)) from None
    if not req.input.strip():
        raise ProtocolError("invalid_request", "input: must not be empty")
    _check_numbers(req.options(), prefix="")
    return req
