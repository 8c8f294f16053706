"""Every wire message of the Chorus protocol (docs/protocol.md, version 1), in one place.

msgspec Structs give the shapes and ranges; `parse_client_message` turns any client text
frame into a typed message or a `ProtocolError` whose message names the offending field
(`options.num_step: must be 1..64`), so a bad frame is always answered, never fatal.
The OpenAI-compatible speech body, the same request in OpenAI's spelling, is `server.wire.speech_body`;
the server's frames are `server.wire.frames` (re-exported here).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta, Struct, field

from server import options as table
from server.engine.types import GenerationOptions
from server.errors import did_you_mean
from server.visible_text import has_visible_text
from server.wire.frames import (  # noqa: F401 - the server's frames, re-exported: one import for the wire
    ENCODINGS,
    MAX_NUM_STEP,
    PROTOCOL_VERSION,
    SAMPLE_RATES,
    AcceptedMsg,
    AudioHeader,
    Cancelled,
    DialogueAudioHeader,
    DialogueProgressMsg,
    Done,
    ErrorMsg,
    Limits,
    LineMsg,
    Pong,
    ProgressMsg,
    Ready,
    ServerMessage,
    Timings,
    audio_frame,
    encode,
    split_audio_frame,
)
from server.wire.sizes import MAX_INSTRUCT_CHARS, MAX_LANGUAGE_CHARS, MAX_VOICE_CHARS, SIZE_RULES
from server.wire.validation import describe_validation_error

T = TypeVar("T")
OPUS_SAMPLE_RATES = (8000, 16000, 24000, 48000)  # the rates libopus takes
MAX_PAUSE_MS = 10_000  # a dialogue's pause between lines
ERROR_CODES = (
    "bad_message", "invalid_request", "duplicate_id", "voice_not_found", "text_too_long",
    "too_many_requests", "busy", "unauthorized", "internal", "stream_idle", "stream_too_long",
)
ID_PATTERN = r"^[A-Za-z0-9_.-]{1,64}\Z"  # \Z: "$" would admit a trailing newline

Encoding = Literal["pcm_s16le", "f32le", "mulaw", "alaw", "opus"]
ErrorCode = Literal[
    "bad_message", "invalid_request", "duplicate_id", "voice_not_found", "text_too_long",
    "too_many_requests", "busy", "unauthorized", "internal", "stream_idle", "stream_too_long",
]


class ProtocolError(Exception):
    """A client message we refuse; becomes an `error` frame (or an HTTP error body).

    `field` names the one field at fault (`options.num_step`), when there is one.
    """

    def __init__(self, code: str, message: str, request_id: str | None = None, field: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id
        self.field = field


# ---- client -> server ------------------------------------------------------------------


# Generation knobs, every field optional: names, types and defaults from the options table
# (`server/options.py`); the ranges are checked against the same table after decoding.
Options = msgspec.defstruct(
    "Options", [(k.name, k.python_type, k.default) for k in table.KNOBS],
    kw_only=True, forbid_unknown_fields=True, module=__name__,
)


def generation_options(options: Any) -> GenerationOptions:
    """The engine's options from the wire's (`Options` or the speech body's top level)."""
    return GenerationOptions(**{name: getattr(options, name) for name in table.NAMES})


class Reference(Struct, forbid_unknown_fields=True):
    """One-shot cloning: a base64 audio file and its transcript (optional with ASR)."""

    audio: str
    text: str | None = None


class VoiceFields(Struct, forbid_unknown_fields=True, kw_only=True):
    """What `synthesize` and `stream_open` share: the voice, the knobs, the audio format."""

    id: Annotated[str, Meta(pattern=ID_PATTERN)]
    voice: Annotated[str, Meta(max_length=MAX_VOICE_CHARS)] | None = None
    reference: Reference | None = None
    instruct: Annotated[str, Meta(max_length=MAX_INSTRUCT_CHARS)] | None = None
    language: Annotated[str, Meta(max_length=MAX_LANGUAGE_CHARS)] | None = None
    encoding: Encoding = "pcm_s16le"
    sample_rate: int | None = None  # default: 24000, 8000 for mulaw/alaw
    progress: bool = True
    options: Options = field(default_factory=Options)
    keep_voice: bool = False  # `done` then carries `voice_id`: this speaker, for later requests
    timestamps: Literal["word", "char"] | None = None  # `words` frames after each chunk's audio


class Synthesize(VoiceFields, tag="synthesize", tag_field="type", forbid_unknown_fields=True, kw_only=True):
    text: str
    # "sentence" is accepted as another name for "chunk" (docs/protocol.md's example spells it so).
    stream: Literal["chunk", "whole", "sentence"] = "chunk"

    @property
    def stream_mode(self) -> Literal["chunk", "whole"]:
        return "whole" if self.stream == "whole" else "chunk"


class StreamOpen(VoiceFields, tag="stream_open", tag_field="type", forbid_unknown_fields=True, kw_only=True):
    """Text streamed in: opens stream `id`; `text` (optional) is its first piece."""

    text: str = ""


class StreamFlush(Struct, tag="stream_flush", tag_field="type", forbid_unknown_fields=True):
    id: Annotated[str, Meta(pattern=ID_PATTERN)]


class StreamClose(StreamFlush, tag="stream_close", tag_field="type", forbid_unknown_fields=True):
    pass


class StreamAppend(StreamFlush, tag="stream_append", tag_field="type", forbid_unknown_fields=True):
    text: str


StreamMessage = StreamOpen | StreamAppend | StreamFlush | StreamClose


class Cancel(Struct, tag="cancel", tag_field="type", forbid_unknown_fields=True):
    id: Annotated[str, Meta(pattern=ID_PATTERN)]


class Ping(Struct, tag="ping", tag_field="type", forbid_unknown_fields=True):
    pass


# A dialogue line's knobs: any of the options, each None to take the dialogue's own.
LineOptions = msgspec.defstruct(
    "LineOptions", [(k.name, k.python_type | None, None) for k in table.KNOBS],
    kw_only=True, forbid_unknown_fields=True, module=__name__,
)


class DialogueLine(Struct, forbid_unknown_fields=True, kw_only=True):
    """One line of a script: who says it (a voice, or null: one automatic voice for every such
    line), what, and optionally how (`instruct`, knobs over the dialogue's)."""

    text: str
    voice: Annotated[str, Meta(max_length=MAX_VOICE_CHARS)] | None = None
    instruct: Annotated[str, Meta(max_length=MAX_INSTRUCT_CHARS)] | None = None
    options: LineOptions | None = None  # type: ignore[valid-type]


class Dialogue(Struct, tag="dialogue", tag_field="type", forbid_unknown_fields=True, kw_only=True):
    """A script of several speakers: every line synthesised at once, heard in order."""

    id: Annotated[str, Meta(pattern=ID_PATTERN)]
    lines: list[DialogueLine]
    pause_ms: Annotated[int, Meta(ge=0, le=MAX_PAUSE_MS)] = 300
    language: Annotated[str, Meta(max_length=MAX_LANGUAGE_CHARS)] | None = None
    encoding: Encoding = "pcm_s16le"
    sample_rate: int | None = None
    progress: bool = False
    options: Options = field(default_factory=Options)
    timestamps: Literal["word", "char"] | None = None


ClientMessage = Synthesize | Cancel | Ping | StreamMessage | Dialogue
_CLIENT_TYPES: dict[str, type] = {t.__struct_config__.tag: t for t in (  # type: ignore[misc]
    Synthesize, Cancel, Ping, StreamOpen, StreamAppend, StreamFlush, StreamClose, Dialogue)}
_TYPE_NAMES = ", ".join(_CLIENT_TYPES)


# ---- parsing ---------------------------------------------------------------------------

# Human wording for range failures, keyed by field path; other failures keep msgspec's words.
_RULES = {
    "id": "must be 1-64 characters of A-Z a-z 0-9 _ . -",
    "encoding": "must be one of " + ", ".join(ENCODINGS),
    "stream": "must be chunk or whole", **SIZE_RULES,
    "timestamps": "must be word, char or null",
    "options.normalize_text": table.BY_NAME["normalize_text"].rule,
}
def check_options(options: Any, prefix: str = "options.", request_id: str | None = None) -> None:
    """Every knob within the options table's range (finite numbers, 64-bit seeds)."""
    if (problem := table.first_problem(options)) is not None:
        name, rule = problem
        raise ProtocolError("invalid_request", f"{prefix}{name}: {rule}", request_id, field=f"{prefix}{name}")


def check_sample_rate(encoding: str, sample_rate: int | None, request_id: str | None = None) -> None:
    """`sample_rate` is one the wire offers, and one the encoding can carry."""
    if sample_rate is None:
        return
    rates = OPUS_SAMPLE_RATES if encoding == "opus" else SAMPLE_RATES
    if sample_rate not in rates:
        what = "with opus, must be" if encoding == "opus" else "must be one of"
        raise ProtocolError("invalid_request", f"sample_rate: {what} {', '.join(map(str, rates))}",
                            request_id, field="sample_rate")


def check_synthesize(msg: Synthesize) -> None:
    """Rules a schema cannot say: non-empty text, voice/reference exclusive, knob ranges."""
    if not has_visible_text(msg.text):
        raise ProtocolError("invalid_request", "text: must not be empty (nothing but spaces or invisible "
                            "characters)", msg.id, field="text")
    check_voice_fields(msg)


def check_voice_fields(msg: VoiceFields) -> None:
    """Voice/reference exclusive, a named voice not empty, sample rate, knob ranges."""
    if msg.voice is not None and msg.reference is not None:
        raise ProtocolError("invalid_request", "reference: voice and reference are exclusive; send one", msg.id,
                            field="reference")
    if msg.voice is not None and not msg.voice:
        raise ProtocolError("invalid_request", "voice: must be a voice id or null", msg.id, field="voice")
    if msg.reference is not None and not msg.reference.audio:
        raise ProtocolError("invalid_request", "reference.audio: must be a base64 audio file", msg.id,
                            field="reference.audio")
    check_sample_rate(msg.encoding, msg.sample_rate, msg.id)
    check_options(msg.options, request_id=msg.id)


def decode_json(data: str | bytes) -> Any:
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise ProtocolError("bad_message", f"not valid JSON: {exc}") from None
    except RecursionError:  # msgspec's depth limit: arrays or objects nested too deeply
        raise ProtocolError("bad_message", "not valid JSON: nested too deeply") from None


def line_options(knobs: Any, line: DialogueLine) -> Any:
    """A line's knobs: the dialogue's (`knobs`: an `Options`, or a body with the knobs at its
    top), with the line's own over them."""
    own = line.options
    return Options(**{name: (value if own is not None and (value := getattr(own, name)) is not None
                             else getattr(knobs, name)) for name in table.NAMES})


class DialogueLimits(Struct, frozen=True):
    """A script's size: its lines (`--max-dialogue-lines`) and their text together
    (`--max-dialogue-chars`); each line is also held to `--max-text-chars`."""

    max_lines: int = 100
    max_chars: int = 20_000


DEFAULT_DIALOGUE_LIMITS = DialogueLimits()


def check_dialogue(lines: list[DialogueLine], knobs: Any, max_text_chars: int | None, limits: DialogueLimits,
                   request_id: str | None = None) -> None:
    """A script's rules: 1..`max_lines` lines, each with visible text within `--max-text-chars`,
    all of them together within `--max-dialogue-chars`, every line's knobs in range."""
    if not 1 <= len(lines) <= limits.max_lines:
        raise ProtocolError("invalid_request", f"lines: must be 1..{limits.max_lines} lines (--max-dialogue-lines)",
                            request_id, field="lines")
    for k, line in enumerate(lines):
        if max_text_chars is not None and len(line.text) > max_text_chars:
            raise ProtocolError("text_too_long", f"lines[{k}].text: {len(line.text)} characters, over the limit "
                                f"of {max_text_chars}", request_id, field=f"lines[{k}].text")
    total = sum(len(line.text) for line in lines)
    if total > limits.max_chars:
        raise ProtocolError("text_too_long", f"lines: {total} characters together, over the limit of "
                            f"{limits.max_chars} (--max-dialogue-chars)", request_id, field="lines")
    for k, line in enumerate(lines):
        if not has_visible_text(line.text):
            raise ProtocolError("invalid_request", f"lines[{k}].text: must not be empty", request_id,
                                field=f"lines[{k}].text")
        check_options(line_options(knobs, line), prefix=f"lines[{k}].options.", request_id=request_id)


def decode_body(data: bytes, target: type[T], rules: dict[str, str]) -> T:
    """An HTTP JSON body as `target` (a Struct); `ProtocolError` naming the field at fault."""
    raw = decode_json(data)
    if not isinstance(raw, dict):
        raise ProtocolError("bad_message", "the body must be a JSON object")
    try:
        return msgspec.convert(raw, target)
    except msgspec.ValidationError as exc:
        at, message = describe_validation_error(exc, rules, target=target)
        raise ProtocolError("invalid_request", message, field=at) from None


def check_text_size(msg: ClientMessage, max_text_chars: int | None) -> None:
    """`text` and `reference.text` within `--max-text-chars`, before anything reads them."""
    if max_text_chars is None or not isinstance(msg, VoiceFields):
        return
    for name, text in (("text", msg.text if isinstance(msg, Synthesize) else None),
                       ("reference.text", msg.reference.text if msg.reference is not None else None)):
        if text is not None and len(text) > max_text_chars:
            raise ProtocolError("text_too_long", f"{name}: {len(text)} characters, over the limit of "
                                f"{max_text_chars}", msg.id, field=name)


def parse_client_message(data: str | bytes, max_text_chars: int | None = None,
                         dialogue_limits: DialogueLimits = DEFAULT_DIALOGUE_LIMITS) -> ClientMessage:
    """One client text frame -> a typed message; raises `ProtocolError` naming the problem
    (sizes first: `max_text_chars` is `--max-text-chars`; the content after)."""
    raw = decode_json(data)
    if not isinstance(raw, dict):
        raise ProtocolError("bad_message", "a message must be a JSON object with a `type`")
    raw_id = raw.get("id")
    request_id = raw_id if isinstance(raw_id, str) else None  # an error about this frame names its id
    kind = raw.get("type")
    if kind is None:
        raise ProtocolError("bad_message", f"type: required ({_TYPE_NAMES})", request_id, field="type")
    target = _CLIENT_TYPES.get(kind) if isinstance(kind, str) else None
    if target is None:
        close = did_you_mean(kind, _CLIENT_TYPES) if isinstance(kind, str) else ""
        raise ProtocolError("bad_message", f"type: unknown message type {kind!r}{close} ({_TYPE_NAMES})",
                            request_id, field="type")
    try:
        message = msgspec.convert(raw, target)
    except msgspec.ValidationError as exc:
        at, message = describe_validation_error(exc, _RULES, target=target)
        raise ProtocolError("invalid_request", message, request_id, field=at) from None
    check_text_size(message, max_text_chars)
    if isinstance(message, Synthesize):
        check_synthesize(message)
    elif isinstance(message, StreamOpen):
        check_voice_fields(message)
    elif isinstance(message, Dialogue):
        check_dialogue(message.lines, message.options, max_text_chars, dialogue_limits, message.id)
        check_sample_rate(message.encoding, message.sample_rate, message.id)
        check_options(message.options, request_id=message.id)
    return message

