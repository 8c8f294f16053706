"""The body of `POST /v1/audio/dialogue`: the script's lines, the pause, the output format, and
the speech body's knobs at the top level (each line may set its own over them)."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from server import options as table
from server.wire.messages import (
    MAX_PAUSE_MS,
    DialogueLimits,
    DialogueLine,
    Options,
    check_dialogue,
    check_options,
    decode_body,
)
from server.wire.sizes import MAX_LANGUAGE_CHARS
from server.wire.speech_body import SpeechFormat


class DialogueBody(Options, forbid_unknown_fields=True, kw_only=True):
    lines: list[DialogueLine]
    model: object = None
    pause_ms: Annotated[int, Meta(ge=0, le=MAX_PAUSE_MS)] = 300
    response_format: SpeechFormat = "mp3"
    stream_format: Literal["audio", "sse"] | None = None
    language: Annotated[str, Meta(max_length=MAX_LANGUAGE_CHARS)] | None = None
    timestamps: Literal["word", "char"] | None = None  # with sse: speech.audio.words events
    # as on /v1/audio/speech: numbers read as words unless the body says false
    normalize_text: bool | Literal["reference"] | None = None


_RULES = {"response_format": "must be mp3, opus, aac, flac, wav or pcm", "stream_format": "must be audio or sse",
          "normalize_text": table.BY_NAME["normalize_text"].rule,
          "pause_ms": f"must be an integer 0..{MAX_PAUSE_MS}", "timestamps": "must be word, char or null"}


def parse_dialogue_body(body: bytes, max_text_chars: int | None, limits: DialogueLimits) -> DialogueBody:
    """The JSON body of `/v1/audio/dialogue` -> a typed request; `ProtocolError` otherwise."""
    req = decode_body(body, DialogueBody, _RULES)
    if req.normalize_text is None:
        req.normalize_text = True
    check_options(req, prefix="")
    check_dialogue(req.lines, req, max_text_chars, limits)
    return req
