"""The body of `POST /v1/audio/speech`: OpenAI's fields plus OmniVoice's knobs at top level.

The same request as the WebSocket's `synthesize`, in OpenAI's spelling; parsed with the
wire's own rules (`server.protocol`), so errors read alike and name their field.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import Struct

from server import options as table
from server.protocol import Options, ProtocolError, check_options, decode_json, describe_validation_error
from server.visible_text import has_visible_text

SpeechFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]


class VoiceRef(Struct, forbid_unknown_fields=True):
    """OpenAI's custom-voice form of `voice`: `{"id": "..."}`."""

    id: str


class SpeechRequest(Options, forbid_unknown_fields=True, kw_only=True):
    """`POST /v1/audio/speech`: OpenAI's fields plus OmniVoice's knobs at top level.

    The knobs are `Options`' own, inherited (and checked against the same table), so the two
    spellings of a request can never disagree.
    """

    input: str
    model: Any = None
    voice: str | VoiceRef | None = None
    instructions: str | None = None
    response_format: SpeechFormat = "mp3"
    stream_format: Literal["audio", "sse"] | None = None  # sse: OpenAI's speech.audio.* events
    language: str | None = None
    keep_voice: bool = False  # keep this speaker: its id in `X-Chorus-Voice-Id` (and sse's done event)
    # OpenAI's voices read "$3.50" and "12/05" as words: on here unless the body says false
    normalize_text: bool | None = None
    timestamps: Literal["word", "char"] | None = None  # with sse: speech.audio.words events

    @property
    def voice_name(self) -> str | None:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice

    def options(self) -> Options:
        return Options(**{name: getattr(self, name) for name in table.NAMES})


_SPEECH_RULES: dict[str, str] = {}
_SPEECH_RULES["response_format"] = "must be mp3, opus, aac, flac, wav or pcm"
_SPEECH_RULES["stream_format"] = "must be audio or sse"
_SPEECH_RULES["timestamps"] = "must be word, char or null"


def parse_speech_request(body: bytes) -> SpeechRequest:
    """The JSON body of `/v1/audio/speech` -> a typed request; `ProtocolError` otherwise."""
    raw = decode_json(body)
    if not isinstance(raw, dict):
        raise ProtocolError("bad_message", "the body must be a JSON object")
    try:
        req = msgspec.convert(raw, SpeechRequest)
    except msgspec.ValidationError as exc:
        at, message = describe_validation_error(exc, _SPEECH_RULES)
        raise ProtocolError("invalid_request", message, field=at) from None
    if not has_visible_text(req.input):
        raise ProtocolError("invalid_request", "input: must not be empty (nothing but spaces or invisible "
                            "characters)", field="input")
    if req.normalize_text is None:
        req.normalize_text = True
    check_options(req, prefix="")
    return req
