"""What the OpenAPI schema says that Litestar cannot read from the handlers' signatures.

The handlers read their own bodies (to word errors as the WebSocket does) and answer with
`Response` or `Stream` objects, so their signatures say little. Each route decorator gets
`**documented(...)`: its error statuses as `responses=` (Chorus's error envelope, below), and an
`operation_class` that fills in the request body, the success response's media types, headers
and links (the stateful order: create, then get and delete), and `Retry-After` on every 503.

The bodies' JSON schemas come from the wire's own msgspec Structs (`msgspec.json.schema_components`),
so the schema and the parsing cannot disagree; the knobs' ranges from the options table. The
WebSocket's messages (`/v1/stream`, which OpenAPI cannot describe as a route) are components too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import (
    Components,
    Link,
    OpenAPIHeader,
    OpenAPIMediaType,
    OpenAPIResponse,
    Operation,
    Reference,
    RequestBody,
    Schema,
)
from msgspec import UNSET, Struct, UnsetType

from server import options as table
from server.audio.encoders import MEDIA_TYPES
from server.streaming.frames import SegmentMsg, StreamAudioHeader, StreamProgressMsg
from server.text.lexicon import MAX_SAY_CHARS, MAX_TEXT_CHARS
from server.timestamps.frames import Span, WordsMsg
from server.wire import messages as wire
from server.wire.dialogue_body import DialogueBody
from server.wire.speech_body import SpeechRequest

REF = "#/components/schemas/{name}"
HttpErrorCode = Literal["bad_message", "invalid_request", "unauthorized", "voice_not_found", "model_not_found",
                        "text_too_long", "duplicate_id", "name_taken", "too_many_requests", "busy", "internal"]


class ErrorDetail(Struct, omit_defaults=True):
    """`code` as on the WebSocket; `field` (as the body spells it) when one field is at fault."""

    code: HttpErrorCode
    message: str
    field: str | UnsetType = UNSET


class ErrorBody(Struct):
    """Every HTTP error: `{"error": {"code", "message", "field"?}}`."""

    error: ErrorDetail


class ModelErrorDetail(ErrorDetail, kw_only=True):
    """`model_not_found` with OpenAI's `type` and `param` beside Chorus's `field`."""

    type: Literal["invalid_request_error"]
    param: Literal["model"]


class ModelErrorBody(Struct):
    error: ModelErrorDetail


class Health(Struct):
    status: Literal["ok"]


class Readiness(Struct):
    ready: bool
    engines: int


_WHY = {
    400: "`bad_message`: the body is not JSON (or the `Host` header is malformed)",
    401: "`unauthorized`: a valid API key is required (`Authorization: Bearer KEY`)",
    403: "`unauthorized`: a `Host` or browser origin this server does not serve; "
         "`invalid_request`: a built-in voice cannot be deleted",
    404: "`voice_not_found`, or `invalid_request` (no such entry or route)",
    408: "`bad_message`: the request's headers or body did not arrive in time",
    409: "`name_taken`: the name (or the pronunciation's text, for that voice) is taken",
    413: "`text_too_long`: a text over `--max-text-chars`, or a body over the size limit",
    415: "`invalid_request`: not multipart, or the upload is no readable audio file",
    422: "`invalid_request`: a field is wrong (`field` names it)",
    500: "`internal`: the server failed on this request",
    503: "`busy`: the server is full or stopping; try again after `Retry-After` seconds",
}
COMMON = (400, 403, 408, 500, 503)  # any route: the Host, slow requests, failures, connection slots
KEYED = (401,)  # behind the API key: every /v1 route


_MODEL_404 = "`model_not_found`: no such model (OpenAI's error shape: `type` and `param` too)"


def error_specs(*statuses: int, model_404: bool = False) -> dict[int | str, ResponseSpec]:
    specs: dict[int | str, ResponseSpec] = {
        status: ResponseSpec(ErrorBody, description=_WHY[status], generate_examples=False) for status in statuses}
    if model_404:
        specs[404] = ResponseSpec(ModelErrorBody, description=_MODEL_404, generate_examples=False)
    return specs


def binary(media_type: str) -> OpenAPIMediaType:
    return OpenAPIMediaType(schema=Schema(type="string", format="binary", content_media_type=media_type))


def audio_response(headers: dict[str, OpenAPIHeader]) -> tuple[str, OpenAPIResponse]:
    """The 200 of a route that speaks (`response_format`, `stream_format`): each audio media type,
    or with sse, `text/event-stream` whose events (each as OpenAPI before 3.2 describes one: its
    `data` field) are `SpeechEvent`s."""
    event = Schema(type="object", required=["data"], description="one event: `data: ` + a JSON `SpeechEvent`",
                   properties={"data": Schema(type="string", content_media_type="application/json",
                                              content_schema=Reference(REF.format(name="SpeechEvent"))),
                               "event": Schema(type="string")})
    return "200", OpenAPIResponse(
        description="The audio in the `response_format`'s media type, streamed as its chunks finish (flac "
                    "whole); with `stream_format: \"sse\"`, `text/event-stream` events (`SpeechEvent`)",
        content={**{media: binary(media) for media in MEDIA_TYPES.values()},
                 "text/event-stream": OpenAPIMediaType(schema=event)},
        headers={"X-Request-Id": header("the request's id, as in the server log", required=True),
                 "X-Sample-Rate": header("the audio's sample rate in Hz", required=True, pattern=r"^[0-9]+$"),
                 **headers})


def json_body(component: str, description: str) -> RequestBody:
    return RequestBody(required=True, description=description,
                       content={"application/json": OpenAPIMediaType(schema=Reference(REF.format(name=component)))})


def header(description: str, required: bool = False, pattern: str | None = None) -> OpenAPIHeader:
    return OpenAPIHeader(schema=Schema(type="string", pattern=pattern), required=required, description=description)


RETRY_AFTER = header("seconds to wait before trying again", required=True, pattern=r"^[0-9]+$")


def _operation_class(ok: tuple[str, OpenAPIResponse] | None, body: RequestBody | None,
                     links: dict[str, Link] | None, open_route: bool, retry_after: bool) -> type[Operation]:
    @dataclass
    class Documented(Operation):
        def __post_init__(self) -> None:
            responses = self.responses or {}
            if ok is not None:
                responses[ok[0]] = ok[1]
            if links:
                success = next(status for status in responses if status.startswith("2"))
                responses[success].links = links
            busy = responses.get("503")
            if retry_after and isinstance(busy, OpenAPIResponse):
                busy.headers = {**(busy.headers or {}), "Retry-After": RETRY_AFTER}
            if body is not None:
                self.request_body = body
            if open_route:
                self.security = []  # no API key, whatever the rest of the API needs
            self.responses = responses

    return Documented


def documented(*errors: int, ok: tuple[str, OpenAPIResponse] | None = None, body: RequestBody | None = None,
               links: dict[str, Link] | None = None, keyed: bool = True, model_404: bool = False,
               retry_after: bool = True, specs: dict[int | str, ResponseSpec] | None = None) -> dict[str, Any]:
    """A route decorator's OpenAPI arguments: `errors` (plus the common ones, and 401 behind the
    key) as the error envelope, `specs` replacing any of them (or the success response), `ok`
    replacing the success response with several media types, the request `body`, the success
    response's `links`; `keyed=False` for routes open without the key."""
    statuses = sorted({*errors, *COMMON, *(KEYED if keyed else ())})
    return {"responses": {**error_specs(*statuses, model_404=model_404), **(specs or {})},
            "operation_class": _operation_class(ok, body, links, not keyed, retry_after)}


def link(operation_id: str, parameter: str, pointer: str = "/id") -> Link:
    return Link(operation_id=operation_id, parameters={parameter: f"$response.body#{pointer}"})


# ---- the components made from the wire's Structs ---------------------------------------------------


class SpeechAudioDelta(Struct, tag="speech.audio.delta", tag_field="type"):
    """`stream_format: "sse"`: one piece of the `response_format`'s bytes, base64."""

    audio: str


class SpeechAudioWords(Struct, tag="speech.audio.words", tag_field="type", omit_defaults=True):
    """With `timestamps`: the words of the audio sent so far (a `words` frame without `id`)."""

    source: Literal["model", "aligned"]
    words: list[Span]
    chars: list[Span] | UnsetType = UNSET  # with `"timestamps": "char"`


class Usage(Struct):
    input_tokens: int
    output_tokens: int
    total_tokens: int


class SpeechAudioDone(Struct, tag="speech.audio.done", tag_field="type", omit_defaults=True):
    """The last event: usage (input: words; output: audio tokens, 25 a second); `voice_id` with `keep_voice`."""

    usage: Usage
    voice_id: str | UnsetType = UNSET


def _knob_schema(knob: table.Knob) -> dict[str, Any]:
    """One option's JSON schema, its range from the options table (as `check_options` checks it)."""
    if knob.kind == "bool":
        schema: dict[str, Any] = {"type": "boolean"}
    elif knob.kind == "seed":
        schema = {"type": "integer", "minimum": table.SEED_MIN, "maximum": table.SEED_MAX}
    else:
        schema = {"type": "integer" if knob.kind == "int" else "number", "minimum": knob.low, "maximum": knob.high}
    if knob.zero_off:
        schema = {"anyOf": [{"const": 0}, schema]}
    if knob.nullable:
        schema = {"anyOf": [schema, {"type": "null"}]}
    schema["default"] = knob.default
    if knob.why:
        schema["description"] = knob.why + (f" ({knob.unit})" if knob.unit else "")
    return schema


def _with_ranges(component: dict[str, Any], own: tuple[str, ...] = (), nullable: bool = False) -> None:
    """The knobs' ranges into a component holding them, but for fields the Struct redefines
    (the speech body's own `normalize_text`); `nullable`: each may be null (a dialogue line's)."""
    for name, prop in component.get("properties", {}).items():
        if name in table.BY_NAME and name not in own:
            schema = _knob_schema(table.BY_NAME[name])
            if nullable and not table.BY_NAME[name].nullable:
                schema = {"anyOf": [schema, {"type": "null"}], "default": None}
            prop.clear()
            prop.update(schema)


def _string_limits(prop: dict[str, Any], **limits: int) -> None:
    """`minLength`/`maxLength` on a string property, or on the string branch of a nullable one."""
    for branch in prop.get("anyOf", [prop]):
        if branch.get("type") == "string":
            branch.update(limits)


def _any_object(t: type) -> dict[str, Any]:
    """`model: object` (any JSON at all: OpenAI's model names and whatever else a client sends)."""
    if t is object:
        return {"description": "any JSON value (the served model answers whatever the name)"}
    raise NotImplementedError


def _union(schemas: list[dict[str, Any]], description: str) -> dict[str, Any]:
    return {"description": description, "anyOf": schemas}


def wire_schemas(new_pronunciation: type, max_input_chars: int | None,
                 max_instructions_chars: int | None) -> dict[str, Any]:
    """The components from msgspec: the HTTP bodies (the lexicon's from its route's module, which
    imports this one), the sse events, the WebSocket's messages (its unions as the wire has them;
    a stream's frames and the audio headers beside)."""
    stream_frames = (StreamProgressMsg, WordsMsg, SegmentMsg)
    headers = (wire.AudioHeader, StreamAudioHeader, wire.DialogueAudioHeader)
    events = (SpeechAudioDelta, SpeechAudioWords, SpeechAudioDone)
    out, components = msgspec.json.schema_components(
        (wire.ClientMessage, wire.ServerMessage, SpeechRequest, DialogueBody, new_pronunciation, wire.Options,
         *stream_frames, *headers, *events), schema_hook=_any_object, ref_template=REF)
    for name, struct in (("SpeechRequest", SpeechRequest), ("DialogueBody", DialogueBody), ("Options", None)):
        _with_ranges(components[name], own=tuple(getattr(struct, "__annotations__", ())))
    _with_ranges(components["LineOptions"], nullable=True)
    components["SpeechRequest"]["description"] = (
        "The body of `POST /v1/audio/speech`: OpenAI's fields, plus OmniVoice's knobs at the top level (the "
        "WebSocket's `options`: the same names, defaults and ranges).")
    speech = components["SpeechRequest"]["properties"]
    speech["input"]["description"] = "the text to speak (some visible characters)"
    _string_limits(speech["input"], minLength=1, **({"maxLength": max_input_chars} if max_input_chars else {}))
    if max_instructions_chars:
        _string_limits(speech["instructions"], maxLength=max_instructions_chars)
    entry = components[new_pronunciation.__name__]["properties"]
    _string_limits(entry["text"], minLength=1, maxLength=MAX_TEXT_CHARS)
    _string_limits(entry["say"], minLength=1, maxLength=MAX_SAY_CHARS)
    entry["text"]["description"] = "a word or phrase as it is written"
    entry["say"]["description"] = "what to say instead: words, or a CMU form in brackets (`[K AO1 R AH0 S]`)"
    entry["voice"]["description"] = "a voice's id (or a built-in name), or null for every voice"

    def refs(types: tuple[type, ...]) -> list[dict[str, Any]]:
        return [{"$ref": REF.format(name=t.__name__)} for t in types]

    components["WebSocketClientMessage"] = {  # msgspec's own union, with its discriminator (`type`)
        **out[0], "description": "A text frame a client sends on `/v1/stream` (docs/protocol.md): JSON with "
                                 "its `type`."}
    components["WebSocketServerMessage"] = _union(
        out[1]["anyOf"] + refs(stream_frames), "A text frame the server sends on `/v1/stream`; a stream's "
        "`progress` carries its `segment`.")
    components["WebSocketAudioHeader"] = _union(refs(headers), "The JSON header of a binary audio frame: a "
                                                "4-byte big-endian length, this header, then the samples.")
    components["SpeechEvent"] = _union(refs(events), "A `data:` line of `stream_format: \"sse\"`.")
    return components


@dataclass
class WireComponents(Components):
    """Litestar's components, plus the wire's (Litestar rebuilds `schemas` from the handlers it
    sees, so these are merged in as the schema is written out; Litestar's own win a clash)."""

    wire: dict[str, Any] = field(default_factory=dict)

    @property
    def _exclude_fields(self) -> set[str]:
        return {"wire"}

    def to_schema(self) -> dict[str, Any]:
        out = super().to_schema()
        schemas = {**self.wire, **out.get("schemas", {})}
        out["schemas"] = {name: schemas[name] for name in sorted(schemas)}
        return out
