"""`POST /v1/audio/speech`: OpenAI's speech endpoint, with OmniVoice's knobs at top level.

The official `openai` client works unchanged (every example of OpenAI's text-to-speech guide).
`mp3` (the default, as OpenAI's), `opus` (Ogg), `aac` (ADTS), `wav` and `pcm` are streamed
as the text's chunks finish (`server.audio.encoders`); `flac` is written whole, cross-faded as the
reference joins chunks. `stream_format: "sse"` wraps the same bytes in OpenAI's
`speech.audio.delta` events, then one `speech.audio.done`. Free-text `instructions` are
mapped to OmniVoice's items; what is left out is named in `X-Chorus-Ignored-Instructions`.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import math
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

import msgspec
import numpy as np
from litestar import Request, Response, get, post
from litestar.response import Stream

from server.api.auth import owner_of
from server.api.errors import ApiError, error_response
from server.audio.encoders import MEDIA_TYPES, StreamEncoder, http_encoder
from server.audio.files import encode_flac, encode_samples, wav_header
from server.config import ServerConfig
from server.engine.types import (
    SHUTTING_DOWN,
    ChunkAudio,
    Finished,
    SynthesisRequest,
    VoicePrompt,
)
from server.timestamps.clock import WordClock
from server.timestamps.frames import WordsMsg
from server.turns.service import ServiceError, SynthesisService
from server.voices.instructions import header_value, map_instructions
from server.voices.kept import KeepFailed
from server.voices.store import Owner
from server.wire import messages as p
from server.wire.speech_body import parse_speech_request

log = logging.getLogger("chorus.speech")
T = TypeVar("T")
_request_ids = itertools.count(1)
ENDPOINT = "speech"
AUDIO_TOKENS_PER_SECOND = 25
STARTED_AT = int(time.time())
IGNORED_HEADER = "X-Chorus-Ignored-Instructions"
USED_HEADER = "X-Chorus-Instructions"
VOICE_HEADER = "X-Chorus-Voice-Id"  # `keep_voice`: the kept voice


# the engine names fields as the WebSocket spells them; say them as this endpoint does
_FIELD_NAMES = (("options.", ""), ("instruct", "instructions"), ("text", "input"))


def _as_body_spells(name: str) -> str:
    for ours, theirs in _FIELD_NAMES:
        if name.startswith(ours) and (ours.endswith(".") or name[len(ours):len(ours) + 1] in ("", ":", ".")):
            return theirs + name[len(ours):]
    return name


def _http_error(exc: ServiceError) -> ApiError:
    field = _as_body_spells(exc.field) if exc.field else None
    retry = {"Retry-After": str(max(1, math.ceil(exc.retry_after_ms / 1000)))} if exc.retry_after_ms else None
    return ApiError(exc.code, _as_body_spells(exc.message), field=field, headers=retry)


async def _voice(service: SynthesisService, voice: str | None, owner: Owner) -> VoicePrompt | None:
    """None (the model's own voice), a built-in name, a library id or a display name."""
    if voice is None:
        return None
    return await service.named_voice(voice, owner)


async def _until_disconnected(request: Request) -> None:
    """Returns when the client goes away (its body has been read: what comes next is the end)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _while_connected(request: Request, work: Awaitable[T]) -> T:
    """`work`, cancelled if the client goes away first (then `ClientGone`): a request's text
    preparation and its wait for the first audio stop with their client (`server.bounds`)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()
            raise ClientGone()
        return task.result()
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()


class ClientGone(Exception):
    """The HTTP client disconnected before its response began."""


async def _next_audio(events: asyncio.Queue) -> ChunkAudio | Finished:
    while True:
        event = await events.get()
        if isinstance(event, (ChunkAudio, Finished)):
            return event


def _failure(event: Finished) -> Response:
    if event.outcome == "cancelled":
        return error_response("busy", SHUTTING_DOWN, 503)
    return error_response("internal", event.message or "the engine failed on this request", 500)


def _sse(event: dict) -> bytes:
    return f"data: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


@post("/audio/speech", status_code=200)
async def speech(request: Request, service: SynthesisService, config: ServerConfig) -> Response | Stream:
    """OpenAI's speech endpoint. JSON body: `model` (any name), `input`, `voice` (a built-in
    name, a library voice's id or name, or null), `instructions`, `response_format` (mp3, opus,
    aac, flac, wav, pcm), `speed`, `stream_format` (`audio` or `sse`), plus OmniVoice's options
    at the top level (`language`, `num_step`, `guidance_scale`, `seed`, ...: docs/protocol.md)."""
    received_at = time.perf_counter()  # the engine's timings count from here
    try:
        body = parse_speech_request(await request.body(), config.max_text_chars, config.max_instructions_chars)
    except p.ProtocolError as exc:
        service.reject(ENDPOINT, exc.code)
        raise ApiError(exc.code, exc.message, field=exc.field) from None
    request_id = f"h{next(_request_ids)}"
    fmt = body.response_format
    sse = body.stream_format == "sse"
    if body.timestamps and not sse:
        service.reject(ENDPOINT, "invalid_request")
        raise ApiError("invalid_request", 'timestamps: need "stream_format": "sse" (the words come as '
                       "speech.audio.words events between the audio's)", field="timestamps")
    instructions = map_instructions(body.instructions)
    owner = owner_of(request, config.api_keys)
    try:
        voice = await _voice(service, body.voice_name, owner)
    except ServiceError as exc:
        service.reject(ENDPOINT, exc.code)
        raise _http_error(exc) from None
    try:
        text = await _while_connected(request, service.text.prepare(
            body.input, body.language, body.normalize_text, body.voice_name, field="input"))
        synth = SynthesisRequest(
            request_id=request_id, text=text, language=body.language, instruct=instructions.instruct,
            voice=voice, stream="whole" if fmt == "flac" else "chunk", received_at=received_at,
            options=p.generation_options(body), progress=False,
        )
        events: asyncio.Queue = asyncio.Queue()
        kept = service.keeper(owner) if body.keep_voice else None
        clock = WordClock(request_id, body.timestamps) if body.timestamps else None
        hooks = [hook.on_tokens for hook in (kept, clock) if hook is not None]
        accepted = service.submit(synth, events.put_nowait, ENDPOINT,
                                  (lambda event: [hook(event) for hook in hooks]) if hooks else None)
    except ServiceError as exc:
        raise _http_error(exc) from None
    except ClientGone:
        return Response(b"", status_code=499)  # nobody reads it

    headers = {"X-Request-Id": request_id, "X-Sample-Rate": str(service.sample_rate)}
    if instructions.instruct:
        headers[USED_HEADER] = header_value([instructions.instruct])
    if instructions.ignored:
        headers[IGNORED_HEADER] = header_value(instructions.ignored)
        log.info("instructions ignored: %s", "; ".join(instructions.ignored), extra={"request_id": request_id})
    try:
        first = await _while_connected(request, _next_audio(events))
    except BaseException:  # the client went away while we waited
        service.cancel(request_id)
        if isinstance(sys.exc_info()[1], ClientGone):
            return Response(b"", status_code=499)
        raise
    if isinstance(first, Finished):
        return _failure(first)
    if kept is not None:  # its write started with the first chunk's tokens, before this audio
        try:
            headers[VOICE_HEADER] = await kept.voice_id()
        except KeepFailed as exc:
            service.cancel(request_id)
            return error_response("internal", str(exc), 500, field="keep_voice")
    rate = first.sample_rate
    media_type = "text/event-stream" if sse else MEDIA_TYPES[fmt]
    if not sse and (fmt == "flac" or (fmt in ("wav", "pcm") and first.final)):
        # whole (flac asks for stream="whole") or the only chunk: a file with its true length
        content = encode_flac(first.audio, rate) if fmt == "flac" else _whole(fmt, first.audio, rate)
        return Response(content, media_type=media_type, headers=headers)

    frames = [0.0]  # the audio's seconds, for the sse usage
    aligning: deque[asyncio.Future] = deque()  # `--aligner`: the chunks' words, in chunk order

    async def audio() -> AsyncIterator[tuple[bytes, dict | None]]:
        """The format's bytes as each chunk arrives, with its words (`timestamps`, sse only);
        ends cut short if the request fails."""
        encoder: StreamEncoder | None = None if fmt == "flac" else http_encoder(fmt, rate)
        try:
            event: ChunkAudio | Finished = first
            while not isinstance(event, Finished):
                frames[0] += event.audio.shape[-1] / rate
                # flac (only with sse): the whole file in one delta
                data = encode_flac(event.audio, rate) if encoder is None else encoder.push(
                    event.audio, last=event.final).data
                words = None
                if clock is not None:
                    text = clock.whole_text() if fmt == "flac" else clock.texts.get(event.chunk, "")
                    if service.aligner is None:
                        words = _words_event(clock.frame(text, event.audio.shape[-1], rate, rate))
                    else:  # aligned on its own thread: sent once done, the audio goes on meanwhile
                        aligning.append(asyncio.ensure_future(
                            clock.aligned_frame(service.aligner, text, event.audio, rate, rate)))
                if data or words:
                    yield data, words
                event = await _next_audio(events)
            if event.outcome != "done":  # cut the body short: the client sees a broken stream
                raise RuntimeError(f"request {request_id} ended mid-stream: {event.outcome} ({event.message})")
        finally:
            if encoder is not None:
                encoder.close()

    async def body_bytes() -> AsyncIterator[bytes]:
        ended = False
        try:
            if not sse:
                async for data, _ in audio():
                    if data:
                        yield data
            else:
                async for data, words in audio():
                    if data:
                        yield _sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
                    if words:
                        yield _sse(words)
                    while aligning and aligning[0].done():
                        yield _sse(_words_event(aligning.popleft().result()))
                while aligning:  # the alignments still running, before the end
                    yield _sse(_words_event(await aligning.popleft()))
                # usage: input words and output codec frames (OmniVoice's audio tokens, 25 a second)
                words, tokens = len(body.input.split()), round(frames[0] * AUDIO_TOKENS_PER_SECOND)
                done = {"type": "speech.audio.done",
                        "usage": {"input_tokens": words, "output_tokens": tokens, "total_tokens": words + tokens}}
                if VOICE_HEADER in headers:
                    done["voice_id"] = headers[VOICE_HEADER]
                yield _sse(done)
            ended = True
        finally:
            if not ended:
                service.cancel(request_id)

    log.debug("streaming", extra={"request_id": request_id, "chunks": accepted.chunks, "format": fmt, "sse": sse})
    return Stream(body_bytes(), media_type=media_type, headers=headers)


def _words_event(frame: WordsMsg) -> dict:
    """A `words` frame as OpenAI-style sse's `speech.audio.words` event (no id: one request)."""
    event = {**msgspec.to_builtins(frame), "type": "speech.audio.words"}
    del event["id"]
    return event


def _whole(fmt: str, audio: np.ndarray, rate: int) -> bytes:
    """A one-chunk wav or pcm, whole: the WAV header then carries its true length."""
    head = wav_header(rate, int(audio.shape[-1])) if fmt == "wav" else b""
    return head + encode_samples(audio, "pcm_s16le")


class ModelCard(msgspec.Struct):
    id: str
    object: str = "model"
    created: int = 0
    owned_by: str = "chorus"


class ModelList(msgspec.Struct):
    data: list[ModelCard]
    object: str = "list"


@get("/models")
async def list_models(service: SynthesisService) -> ModelList:
    """OpenAI's model list: the served model. Any `model` name is accepted by the speech
    endpoint (clients send `tts-1`, `gpt-4o-mini-tts`...); all of them mean this one."""
    return ModelList([ModelCard(service.model_name, created=STARTED_AT)])


@get("/models/{model_id:path}")
async def retrieve_model(model_id: str, service: SynthesisService) -> ModelCard | Response:
    """OpenAI's `models.retrieve`: the served model by its id (ids hold slashes, as
    `k2-fsa/OmniVoice`); any other id is 404 in OpenAI's error shape (`model_not_found`,
    with OpenAI's `type` and `param` beside Chorus's `field`)."""
    model_id = model_id.lstrip("/")
    if model_id != service.model_name:
        message = f"model: no model {model_id!r}; this server serves {service.model_name!r}"
        return Response({"error": {"code": "model_not_found", "message": message, "field": "model",
                                   "type": "invalid_request_error", "param": "model"}}, status_code=404)
    return ModelCard(service.model_name, created=STARTED_AT)
