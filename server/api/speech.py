"""`POST /v1/audio/speech`: OpenAI's speech endpoint, with OmniVoice's knobs at top level.

The official `openai` client works unchanged (every example of OpenAI's text-to-speech guide).
The body becomes a turn (`server.turns.turn`: every rule about a request is there), and this
door frames its events: `mp3` (the default, as OpenAI's), `opus` (Ogg), `aac` (ADTS), `wav` and
`pcm` are streamed as the text's chunks finish (`server.audio.encoders`, off the event loop);
`flac` is written whole, cross-faded as the reference joins chunks. `stream_format: "sse"` wraps
the same bytes in OpenAI's `speech.audio.delta` events, then one `speech.audio.done`. Free-text
`instructions` are mapped to OmniVoice's items; what is left out is named in
`X-Chorus-Ignored-Instructions`. A client that goes away before its audio starts stops its turn
(its text preparation too); one that goes away mid-body, at the next chunk.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol, TypeVar

import msgspec
import numpy as np
from litestar import Request, Response, post
from litestar.response import Stream

from server.api.auth import owner_of
from server.api.errors import ApiError, error_response
from server.api.schema_parts import audio_response, documented, header, json_body
from server.audio.encoders import MEDIA_TYPES, StreamEncoder, encode, http_encoder
from server.audio.files import encode_flac, encode_samples, wav_header
from server.config import ServerConfig
from server.engine.types import SHUTTING_DOWN
from server.timestamps.frames import WordsMsg
from server.turns.events import TurnAudio, TurnEnd, TurnEvent, TurnWords
from server.turns.request import TurnRequest
from server.turns.service import SynthesisService
from server.turns.turn import Turn
from server.voices.instructions import header_value, map_instructions
from server.voices.kept import KeepFailed
from server.wire import messages as p
from server.wire.speech_body import SpeechRequest, parse_speech_request

log = logging.getLogger("chorus.speech")
T = TypeVar("T")


class _Body(Protocol):
    timestamps: str | None
    stream_format: str | None


B = TypeVar("B", bound=_Body)
_request_ids = itertools.count(1)
ENDPOINT = "speech"
AUDIO_TOKENS_PER_SECOND = 25
IGNORED_HEADER = "X-Chorus-Ignored-Instructions"
USED_HEADER = "X-Chorus-Instructions"
VOICE_HEADER = "X-Chorus-Voice-Id"  # `keep_voice`: the kept voice
CLIENT_GONE = 499  # nobody reads it


# the engine names fields as the WebSocket spells them; say them as this endpoint does
_FIELD_NAMES = (("options.", ""), ("instruct", "instructions"), ("text", "input"))


def _as_body_spells(name: str) -> str:
    for ours, theirs in _FIELD_NAMES:
        if name.startswith(ours) and (ours.endswith(".") or name[len(ours):len(ours) + 1] in ("", ":", ".")):
            return theirs + name[len(ours):]
    return name


def turn_error_response(end: TurnEnd) -> Response:
    """A turn that ended before its audio started, as the error body its code says."""
    if end.outcome == "cancelled":  # not the client's doing: the server is stopping
        return error_response("busy", SHUTTING_DOWN, 503)
    code = end.code or "internal"
    retry = {"Retry-After": str(max(1, math.ceil(end.retry_after_ms / 1000)))} if end.retry_after_ms else None
    error = ApiError(code, _as_body_spells(end.message or "the request failed"),
                     field=_as_body_spells(end.field) if end.field else None, headers=retry)
    return error_response(error.code, error.message, error.status, error.headers, error.field)


async def read_body(request: Request, service: SynthesisService, endpoint: str, parse: Callable[[bytes], B]) -> B:
    """The body as `parse` reads it, or its `ApiError` (counted as a refusal); word timestamps
    need `stream_format: "sse"` (a body with both fields)."""
    try:
        body = parse(await request.body())
    except p.ProtocolError as exc:
        service.reject(endpoint, exc.code)
        raise ApiError(exc.code, exc.message, field=exc.field) from None
    if body.timestamps and body.stream_format != "sse":
        service.reject(endpoint, "invalid_request")
        raise ApiError("invalid_request", 'timestamps: need "stream_format": "sse" (the words come as '
                       "speech.audio.words events between the audio's)", field="timestamps")
    return body


async def until_disconnected(request: Request) -> None:
    """Returns when the client goes away (its body has been read: what comes next is the end)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def while_connected(request: Request, work: Awaitable[T]) -> T | None:
    """`work`'s result, or None when the client went away first (`work` is then cancelled): a
    door waits so for what decides its response's status."""
    waiting = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(until_disconnected(request))
    try:
        await asyncio.wait((waiting, gone), return_when=asyncio.FIRST_COMPLETED)
        return waiting.result() if waiting.done() else None
    finally:
        gone.cancel()
        waiting.cancel()


class _Cancellable(Protocol):
    def cancel(self) -> None: ...


async def first_audio_or_refusal(request: Request, work: _Cancellable, first: Awaitable[T]) -> T | Response:
    """What decides a response's status: the first audio (returned as it is), or the response for
    a client that left first (its work cancelled) or for work that ended first (its error)."""
    event = await while_connected(request, first)
    if event is None:
        work.cancel()
        return Response(b"", status_code=CLIENT_GONE)
    if isinstance(event, TurnEnd):
        return turn_error_response(event)
    return event


async def _first_audio(events: AsyncIterator[TurnEvent]) -> TurnAudio | TurnEnd:
    """The turn's first audio (it will play: 200), or its end (an error's status)."""
    async for event in events:
        if isinstance(event, (TurnAudio, TurnEnd)):
            return event
    raise AssertionError("a turn ends with TurnEnd")


def sse_event(event: dict) -> bytes:
    return f"data: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


_AUDIO = audio_response({
    USED_HEADER: header("the voice design items found in `instructions` (`; `-separated)"),
    IGNORED_HEADER: header("what of `instructions` was ignored (`; `-separated, percent-encoded)"),
    VOICE_HEADER: header("with `keep_voice`: the kept voice's id")})


@post("/audio/speech", status_code=200, operation_id="createSpeech", tags=["audio"],
      **documented(404, 413, 422, ok=_AUDIO, body=json_body("SpeechRequest", "OpenAI's speech body, "
                   "plus OmniVoice's knobs at the top level")))
async def speech(request: Request, service: SynthesisService, config: ServerConfig) -> Response | Stream:
    """OpenAI's speech endpoint. JSON body: `model` (any name), `input`, `voice` (a built-in
    name, a library voice's id or name, or null), `instructions`, `response_format` (mp3, opus,
    aac, flac, wav, pcm), `speed`, `stream_format` (`audio` or `sse`), plus OmniVoice's options
    at the top level (`language`, `num_step`, `guidance_scale`, `seed`, ...: docs/protocol.md)."""
    received_at = time.perf_counter()  # the engine's timings count from here
    body = await read_body(request, service, ENDPOINT, lambda data: parse_speech_request(
        data, config.max_text_chars, config.max_instructions_chars))
    sse = body.stream_format == "sse"
    request_id = f"h{next(_request_ids)}"
    instructions = map_instructions(body.instructions)
    turn = Turn(service, TurnRequest(
        request_id=request_id, client_id=request_id, endpoint=ENDPOINT, text=body.input, text_field="input",
        owner=owner_of(request, config.api_keys), voice=body.voice_name, instruct=instructions.instruct,
        language=body.language, options=p.generation_options(body), normalize=body.normalize_text,
        stream="whole" if body.response_format == "flac" else "chunk", keep_voice=body.keep_voice,
        timestamps=body.timestamps, progress=False, received_at=received_at)).start()
    events = turn.events()
    first = await first_audio_or_refusal(request, turn, _first_audio(events))
    if isinstance(first, Response):
        return first
    headers = {"X-Request-Id": request_id, "X-Sample-Rate": str(service.sample_rate)}
    if instructions.instruct:
        headers[USED_HEADER] = header_value([instructions.instruct])
    if instructions.ignored:
        headers[IGNORED_HEADER] = header_value(instructions.ignored)
        log.info("instructions ignored: %s", "; ".join(instructions.ignored), extra={"request_id": request_id})
    if body.keep_voice:  # its write started with the first chunk's tokens, before this audio
        try:
            headers[VOICE_HEADER] = await turn.kept_voice_id()
        except KeepFailed as exc:
            turn.cancel()
            return error_response("internal", str(exc), 500, field="keep_voice")
    fmt = body.response_format
    if not sse and (fmt == "flac" or (fmt in ("wav", "pcm") and first.final)):
        # whole (flac asks for stream="whole") or the only chunk: a file with its true length
        content = await asyncio.to_thread(_whole, fmt, first.audio, first.sample_rate)
        return Response(content, media_type=MEDIA_TYPES[fmt], headers=headers)
    return Stream(_body(turn, events, first, body, headers.get(VOICE_HEADER)),
                  media_type="text/event-stream" if sse else MEDIA_TYPES[fmt], headers=headers)


async def _body(turn: Turn, events: AsyncIterator[TurnEvent], first: TurnAudio, body: SpeechRequest,
                voice_id: str | None) -> AsyncIterator[bytes]:
    """The format's bytes as each chunk arrives (with sse, as events, with the words); cut
    short when the turn fails, so the client sees a broken stream; a client that leaves
    cancels the turn."""
    fmt, sse, rate = body.response_format, body.stream_format == "sse", first.sample_rate
    encoder: StreamEncoder | None = None if fmt == "flac" else http_encoder(fmt, rate)
    seconds, ended = 0.0, False
    try:
        event: TurnEvent = first
        while True:
            if isinstance(event, TurnAudio):
                seconds += event.audio.shape[-1] / rate
                data = (await asyncio.to_thread(encode_flac, event.audio, rate) if encoder is None  # flac: sse only
                        else (await encode(encoder, event.audio, event.final)).data)
                if data:
                    yield sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}) if sse \
                        else data
            elif isinstance(event, TurnWords) and sse:
                yield sse_event(_words_event(event.frame))
            elif isinstance(event, TurnEnd):
                if event.outcome != "done":
                    raise RuntimeError(f"request {turn.request.request_id} ended mid-stream: {event.outcome} "
                                       f"({event.message})")
                break
            event = await anext(events)
        if sse:  # usage: input words and output codec frames (OmniVoice's audio tokens, 25 a second)
            words, tokens = len(body.input.split()), round(seconds * AUDIO_TOKENS_PER_SECOND)
            done: dict = {"type": "speech.audio.done",
                          "usage": {"input_tokens": words, "output_tokens": tokens, "total_tokens": words + tokens}}
            if voice_id is not None:
                done["voice_id"] = voice_id
            yield sse_event(done)
        ended = True
    finally:
        if encoder is not None:
            encoder.close()
        if not ended:
            turn.cancel()


def _words_event(frame: WordsMsg) -> dict:
    """A `words` frame as OpenAI-style sse's `speech.audio.words` event (no id: one request)."""
    event = {**msgspec.to_builtins(frame), "type": "speech.audio.words"}
    del event["id"]
    return event


def _whole(fmt: str, audio: np.ndarray, rate: int) -> bytes:
    """A whole file: flac, or a one-chunk wav or pcm (the WAV header then carries its true length)."""
    if fmt == "flac":
        return encode_flac(audio, rate)
    head = wav_header(rate, int(audio.shape[-1])) if fmt == "wav" else b""
    return head + encode_samples(audio, "pcm_s16le")
