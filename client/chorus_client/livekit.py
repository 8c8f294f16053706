"""Chorus as a LiveKit Agents TTS plugin (`pip install chorus-client[livekit]`).

`TTS(url=...)` declares streaming: `stream()` opens one Chorus text stream per LiveKit
synthesis stream (`push_text` -> `stream_append`, `flush` -> `stream_flush`, `end_input` ->
`stream_close`) and emits its audio as raw PCM at the TTS's `sample_rate` (the server
resamples); `synthesize()` sends a whole text as one `synthesize` request. Closing a stream
(the agent's barge-in) cancels it on the server. With `timestamps="word"` the `words`
frames become LiveKit timed transcripts (`aligned_transcript`). Server errors are raised
as LiveKit's `APIStatusError` (status as on Chorus's HTTP API, `busy` and
`too_many_requests` retryable) and a lost connection as `APIConnectionError`, so the
framework's retry and fallback logic applies. Before that, a request the server refuses
`busy` with `retry_after_ms` is retried by the client itself (`busy_retry`: the hint plus
jitter, within a total wait; a stream's text so far is sent again), so only a refusal that
outlasts it reaches LiveKit.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from livekit.agents import (
    DEFAULT_API_CONNECT_OPTIONS,
    APIConnectionError,
    APIConnectOptions,
    APIError,
    APIStatusError,
    APITimeoutError,
    tts,
    utils,
)
from livekit.agents.types import TimedString

from .client import ChorusClient
from .errors import ChorusError, ConnectionLostError, RequestTimeoutError
from .events import AudioChunk, Done, Words
from .requests import _Request
from .retry import DEFAULT_BUSY_RETRY, BusyRetry
from .wire import Options, Reference

# the HTTP status Chorus's HTTP API gives each code (the WebSocket has no status of its own)
STATUS = {"bad_message": 400, "invalid_request": 422, "duplicate_id": 409, "voice_not_found": 404,
          "text_too_long": 413, "too_many_requests": 429, "busy": 503, "unauthorized": 401, "internal": 500,
          "stream_idle": 408, "stream_too_long": 413, "conflict": 409,
          # the client's own: a frame or body the server should not have sent
          "protocol_error": 502, "bad_handshake": 502, "bad_response": 502}
RETRYABLE = {"busy", "too_many_requests", "internal"}


def api_error(err: ChorusError) -> APIError:
    """A Chorus error as LiveKit's own error type (its `body` keeps the protocol's frame)."""
    if isinstance(err, RequestTimeoutError):
        return APITimeoutError(str(err))
    if isinstance(err, ConnectionLostError):
        return APIConnectionError(str(err))
    return APIStatusError(str(err), status_code=err.status or STATUS.get(err.code, 500), request_id=err.request_id,
                          body=err.payload, retryable=err.code in RETRYABLE)


class TTS(tts.TTS):
    def __init__(self, *, url: str = "http://127.0.0.1:8000", api_key: str | None = None, voice: str | None = None,
                 reference: Reference | None = None, instruct: str | None = None, language: str | None = None,
                 options: Options = None, timestamps: str | None = None, keep_voice: bool | None = None,
                 sample_rate: int = 24000, client: ChorusClient | None = None,
                 busy_retry: BusyRetry | None = DEFAULT_BUSY_RETRY):
        """`voice` (library voice), `reference` (one-shot clone) or `instruct` (voice design)
        pick the voice of every synthesis; `options` are Chorus's generation options;
        `client` shares an existing `ChorusClient` (then `aclose()` leaves it open, and its own
        `busy_retry` applies); `busy_retry`: how a request refused `busy` with
        `retry_after_ms` is tried again before LiveKit hears of it (None: at once)."""
        super().__init__(capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=timestamps is not None),
                         sample_rate=sample_rate, num_channels=1)
        self._own_client = client is None
        self._client = client or ChorusClient(url, api_key=api_key, busy_retry=busy_retry)
        self._request: dict[str, Any] = {}
        self.update_options(voice=voice, reference=reference, instruct=instruct, language=language, options=options,
                            timestamps=timestamps, keep_voice=keep_voice)
        self.last_voice_id: str | None = None  # with keep_voice: the voice the last synthesis kept
        self._prewarm_task: asyncio.Task | None = None

    @property
    def model(self) -> str:
        ready = self._client.ready
        return ready.model if ready else "chorus"

    @property
    def provider(self) -> str:
        return "Chorus"

    @property
    def client(self) -> ChorusClient:
        return self._client

    def update_options(self, **fields: Any) -> None:
        """Change `voice`, `reference`, `instruct`, `language`, `options`, `timestamps` or
        `keep_voice` for the syntheses that start after this call."""
        self._request.update(fields)

    def prewarm(self) -> None:
        """Open the WebSocket ahead of the first turn (when called inside an event loop)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._prewarm_task = loop.create_task(self._client.connect())

    def synthesize(self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> ChunkedStream:
        return ChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def stream(self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> SynthesizeStream:
        return SynthesizeStream(tts=self, conn_options=conn_options)

    async def aclose(self) -> None:
        if self._own_client:
            await self._client.close()

    def request_fields(self) -> dict[str, Any]:
        """The fields every request of this TTS carries (voice, options, rate, encoding)."""
        return dict(self._request, sample_rate=self.sample_rate, encoding="pcm_s16le")


async def _emit(request: _Request, emitter: tts.AudioEmitter, owner: TTS) -> None:
    """Push a request's audio and word timings into LiveKit's emitter until it ends."""
    async for event in request:
        if isinstance(event, AudioChunk):
            emitter.push(event.data)
        elif isinstance(event, Words):
            emitter.push_timed_transcript([TimedString(f"{w.text} ", start_time=w.start_seconds,
                                                       end_time=w.end_seconds) for w in event.words])
        elif isinstance(event, Done):
            owner.last_voice_id = event.voice_id or owner.last_voice_id


async def _end(request: _Request) -> None:
    """A request left before its end (cancelled task, error): cancel it on the server."""
    if not request.ended:
        with contextlib.suppress(ChorusError):
            await request.cancel()


class ChunkedStream(tts.ChunkedStream):
    """A whole text: one `synthesize` request."""

    def __init__(self, *, tts: TTS, input_text: str, conn_options: APIConnectOptions):
        super().__init__(tts=tts, input_text=input_text, conn_options=conn_options)
        self._chorus_tts = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        owner = self._chorus_tts
        request = owner.client.synthesize(self._input_text, request_id=utils.shortuuid("lk-"), **owner.request_fields())
        output_emitter.initialize(request_id=request.id, sample_rate=owner.sample_rate, num_channels=1,
                                  mime_type="audio/pcm")
        try:
            await _emit(request, output_emitter, owner)
        except ChorusError as err:
            raise api_error(err) from err
        finally:
            await _end(request)


class SynthesizeStream(tts.SynthesizeStream):
    """Text pushed in as an LLM writes it: one Chorus text stream."""

    def __init__(self, *, tts: TTS, conn_options: APIConnectOptions):
        super().__init__(tts=tts, conn_options=conn_options)
        self._chorus_tts = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        owner = self._chorus_tts
        stream = owner.client.stream(request_id=utils.shortuuid("lk-"), **owner.request_fields())
        output_emitter.initialize(request_id=stream.id, sample_rate=owner.sample_rate, num_channels=1,
                                  mime_type="audio/pcm", stream=True)

        async def send_text() -> None:
            async for item in self._input_ch:
                if isinstance(item, self._FlushSentinel):
                    await stream.flush()
                    continue
                self._mark_started()
                await stream.append(item)
            await stream.close()

        try:
            await stream.start()
            output_emitter.start_segment(segment_id=stream.id)
            sender = asyncio.create_task(send_text(), name="chorus-send-text")
            try:
                await _emit(stream, output_emitter, owner)
                await sender
            finally:
                await utils.aio.cancel_and_wait(sender)
            output_emitter.end_segment()
        except ChorusError as err:
            raise api_error(err) from err
        finally:
            await _end(stream)
