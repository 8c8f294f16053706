"""`POST /v1/audio/speech`: OpenAI's speech endpoint, with OmniVoice's knobs at top level.

The official `openai` client's `audio.speech.create` works unchanged. `pcm` and `wav` are
streamed chunk by chunk as the text's chunks finish (a wav of several chunks carries the
"length unknown" sizes streamed WAV uses); `flac` is written whole, cross-faded as the
reference joins chunks.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import AsyncIterator

from litestar import Request, Response, post
from litestar.response import Stream

from server import protocol as p
from server.api.errors import ApiError, error_response
from server.audio_io import encode_flac, encode_samples, wav_header
from server.config import ServerConfig
from server.engine.types import (
    SHUTTING_DOWN,
    ChunkAudio,
    Finished,
    SynthesisRequest,
    VoicePrompt,
)
from server.service import ServiceError, SynthesisService

log = logging.getLogger("chorus.speech")
_request_ids = itertools.count(1)
ENDPOINT = "speech"
MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac"}
# OpenAI's built-in voice names: they select the model's own voice (no cloning), so clients
# written for OpenAI work unchanged. A library voice is named by its id.
OPENAI_VOICES = frozenset({"alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin", "nova",
                           "onyx", "sage", "shimmer", "verse"})


# the engine names fields as the WebSocket spells them; say them as this endpoint does
_FIELD_NAMES = (("options.", ""), ("instruct", "instructions"), ("text", "input"))


def _as_body_spells(name: str) -> str:
    for ours, theirs in _FIELD_NAMES:
        if name.startswith(ours) and (ours.endswith(".") or name[len(ours):len(ours) + 1] in ("", ":", ".")):
            return theirs + name[len(ours):]
    return name


def _http_error(exc: ServiceError) -> ApiError:
    field = _as_body_spells(exc.field) if exc.field else None
    return ApiError(exc.code, _as_body_spells(exc.message), field=field)


async def _voice(service: SynthesisService, voice: str | None) -> VoicePrompt | None:
    if voice is None or voice.lower() in OPENAI_VOICES:
        return None
    return await service.library_voice(voice)


async def _next_audio(events: asyncio.Queue) -> ChunkAudio | Finished:
    while True:
        event = await events.get()
        if isinstance(event, (ChunkAudio, Finished)):
            return event


def _failure(event: Finished) -> Response:
    if event.outcome == "cancelled":
        return error_response("busy", SHUTTING_DOWN, 503)
    return error_response("internal", event.message or "the engine failed on this request", 500)


@post("/audio/speech", status_code=200)
async def speech(request: Request, service: SynthesisService, config: ServerConfig) -> Response | Stream:
    received_at = time.perf_counter()  # the engine's timings count from here
    try:
        body = p.parse_speech_request(await request.body())
    except p.ProtocolError as exc:
        service.reject(ENDPOINT, exc.code)
        raise ApiError(exc.code, exc.message, field=exc.field) from None
    if len(body.input) > config.max_text_chars:
        service.reject(ENDPOINT, "text_too_long")
        raise ApiError("text_too_long", f"input: {len(body.input)} characters, over the limit of "
                       f"{config.max_text_chars}", field="input")
    request_id = f"h{next(_request_ids)}"
    fmt = body.response_format
    try:
        voice = await _voice(service, body.voice)
    except ServiceError as exc:
        service.reject(ENDPOINT, exc.code)
        raise _http_error(exc) from None
    try:
        synth = SynthesisRequest(
            request_id=request_id, text=body.input, language=body.language, instruct=body.instructions,
            voice=voice, stream="whole" if fmt == "flac" else "chunk", received_at=received_at,
            options=p.generation_options(body),
        )
        events: asyncio.Queue = asyncio.Queue()
        accepted = service.submit(synth, events.put_nowait, ENDPOINT)
    except ServiceError as exc:
        raise _http_error(exc) from None

    headers = {"X-Request-Id": request_id, "X-Sample-Rate": str(service.sample_rate)}
    try:
        first = await _next_audio(events)
    except BaseException:  # the client went away while we waited
        service.cancel(request_id)
        raise
    if isinstance(first, Finished):
        return _failure(first)
    rate = first.sample_rate
    if fmt == "flac" or (fmt == "wav" and first.final):
        audio = first.audio  # whole (flac asks for stream="whole") or the only chunk
        content = encode_flac(audio, rate) if fmt == "flac" else wav_header(rate, len(audio)) + encode_samples(
            audio, "pcm_s16le")
        return Response(content, media_type=MEDIA_TYPES[fmt], headers=headers)

    async def chunks() -> AsyncIterator[bytes]:
        ended = False
        try:
            if fmt == "wav":
                yield wav_header(rate, None)
            event: ChunkAudio | Finished = first
            while True:
                if isinstance(event, Finished):
                    ended = True
                    if event.outcome != "done":  # cut the body short: the client sees a broken stream
                        raise RuntimeError(f"request {request_id} ended mid-stream: {event.outcome} "
                                           f"({event.message})")
                    return
                yield encode_samples(event.audio, "pcm_s16le")
                event = await _next_audio(events)
        finally:
            if not ended:
                service.cancel(request_id)

    log.debug("streaming", extra={"request_id": request_id, "chunks": accepted.chunks, "format": fmt})
    return Stream(chunks(), media_type=MEDIA_TYPES[fmt], headers=headers)
