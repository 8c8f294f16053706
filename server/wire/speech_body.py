"""The body of `POST /v1/audio/speech`: OpenAI's fields plus OmniVoice's knobs at top level.

The same request as the WebSocket's `synthesize`, in OpenAI's spelling; parsed with the
wire's own rules (`server.wire.messages`), so errors read alike and name their field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from server import options as table
from server.visible_text import has_visible_text
from server.wire.messages import Options, ProtocolError, check_options, decode_body
from server.wire.sizes import MAX_LANGUAGE_CHARS, MAX_VOICE_CHARS

SpeechFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]


class VoiceRef(Struct, forbid_unknown_fields=True):
    """OpenAI's custom-voice form of `voice`: `{"id": "..."}`."""

    id: Annotated[str, Meta(max_length=MAX_VOICE_CHARS)]


class SpeechRequest(Options, forbid_unknown_fields=True, kw_only=True):
    """`POST /v1/audio/speech`: OpenAI's fields plus OmniVoice's knobs at top level.

    The knobs are `Options`' own, inherited (and checked against the same table), so the two
    spellings of a request can never disagree.
    """

    input: str
    model: Any = None
    voice: Annotated[str, Meta(max_length=MAX_VOICE_CHARS)] | VoiceRef | None = None
    instructions: str | None = None
    response_format: SpeechFormat = "mp3"
    stream_format: Literal["audio", "sse"] | None = None  # sse: OpenAI's speech.audio.* events
    language: Annotated[str, Meta(max_length=MAX_LANGUAGE_CHARS)] | None = None
    keep_voice: bool = False  # keep this speaker: its id in `X-Chorus-Voice-Id` (and sse's done event)
    # OpenAI's voices read "$3.50" and "12/05" as words: on here (true: the best normaliser
    # for the language) unless the body says false, or "reference" for the reference's
    normalize_text: bool | Literal["reference"] | None = None
    timestamps: Literal["word", "char"] | None = None  # with sse: speech.audio.words events

    @property
    def voice_name(self) -> str | None:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice

    def options(self) -> Options:
        return Options(**{name: getattr(self, name) for name in table.NAMES})


_SPEECH_RULES: dict[str, str] = {}
_SPEECH_RULES["response_format"] = "must be mp3, opus, aac, flac, wav or pcm"
_SPEECH_RULES["stream_format"] = "must be audio or sse"
_SPEECH_RULES["voice"] = f"must be at most {MAX_VOICE_CHARS} characters (a voice id or name)"
_SPEECH_RULES["voice.id"] = _SPEECH_RULES["voice"]
_SPEECH_RULES["language"] = f"must be at most {MAX_LANGUAGE_CHARS} characters"
_SPEECH_RULES["timestamps"] = "must be word, char or null"
_SPEECH_RULES["normalize_text"] = table.BY_NAME["normalize_text"].rule


def check_sizes(req: SpeechRequest, max_input_chars: int | None, max_instructions_chars: int | None) -> None:
    """`input` and `instructions` within their limits, checked before anything reads them."""
    if max_input_chars is not None and len(req.input) > max_input_chars:
        raise ProtocolError("text_too_long", f"input: {len(req.input)} characters, over the limit of "
                            f"{max_input_chars}", field="input")
    if max_instructions_chars is not None and req.instructions is not None and (
            len(req.instructions) > max_instructions_chars):
        raise ProtocolError("invalid_request", f"instructions: {len(req.instructions)} characters, over the "
                            f"limit of {max_instructions_chars}", field="instructions")


def parse_speech_request(body: bytes, max_input_chars: int | None = None,
                         max_instructions_chars: int | None = None) -> SpeechRequest:
    """The JSON body of `/v1/audio/speech` -> a typed request; `ProtocolError` otherwise.
    Sizes are checked first (`--max-text-chars`, `--max-instructions-chars`), the content after."""
    req = decode_body(body, SpeechRequest, _SPEECH_RULES)
    check_sizes(req, max_input_chars, max_instructions_chars)
    if not has_visible_text(req.input):
        raise ProtocolError("invalid_request", "input: must not be empty (nothing but spaces or invisible "
                            "characters)", field="input")
    if req.normalize_text is None:
        req.normalize_text = True
    check_options(req, prefix="")
    return req
