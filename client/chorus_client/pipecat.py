"""Chorus as a Pipecat TTS service (`pip install chorus-client[pipecat]`).

Shaped like Pipecat's WebSocket TTS services (Cartesia's, ElevenLabs'): one connection
opened at start and shared by every turn; one audio context per turn, which is one Chorus
text stream (`stream_open` on the turn's first text, `stream_append` per token, `stream_close`
when the LLM's response ends); audio arrives on a receive task and is queued into the turn's
audio context as `TTSAudioRawFrame`s at the pipeline's output rate (the server resamples);
an interruption cancels the stream at once (its late audio is dropped here, the server
stops at its next step); `words` frames become Pipecat word timestamps; a server error is
pushed upstream as an `ErrorFrame` carrying the typed `ChorusError`. A turn the server
refuses `busy` with `retry_after_ms` is retried by the client (`busy_retry`: the hint plus
jitter, within a total wait), its text so far sent again; only a turn still refused after
that is reported.

Chorus cuts streamed text into sentences itself, so the default text aggregation is
`TOKEN`: every LLM token goes straight to the server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from loguru import logger
from pipecat.frames.frames import CancelFrame, EndFrame, Frame, StartFrame, TTSAudioRawFrame, TTSStoppedFrame
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TextAggregationMode, TTSService
from pipecat.utils.errors import ErrorCategory

from .client import ChorusClient
from .errors import (
    BufferFullError,
    BusyError,
    ChorusError,
    ConnectionLostError,
    InternalError,
    ProtocolError,
    RequestTimeoutError,
    TooManyRequestsError,
    UnauthorizedError,
)
from .events import AudioChunk, Cancelled, Done, Words
from .requests import TextStream
from .retry import DEFAULT_BUSY_RETRY, BusyRetry
from .wire import Options, Reference

CATEGORIES: dict[type[ChorusError], ErrorCategory] = {
    UnauthorizedError: ErrorCategory.AUTHENTICATION,
    BusyError: ErrorCategory.RATE_LIMIT,
    TooManyRequestsError: ErrorCategory.RATE_LIMIT,
    ConnectionLostError: ErrorCategory.CONNECTIVITY,
    RequestTimeoutError: ErrorCategory.CONNECTIVITY,
    InternalError: ErrorCategory.SERVER,
    ProtocolError: ErrorCategory.SERVER,  # the server sent what the protocol does not allow
    BufferFullError: ErrorCategory.APPLICATION,  # the audio was not read as it came
}


def error_category(err: ChorusError) -> ErrorCategory:
    """The category of the error's class or of its nearest base that has one (a
    `HandshakeError` is a `ProtocolError`); the rest are the request's own fault."""
    for cls in type(err).__mro__:
        if cls in CATEGORIES:
            return CATEGORIES[cls]
    return ErrorCategory.INVALID_REQUEST


@dataclass
class ChorusTTSSettings(TTSSettings):
    """Pipecat's TTS settings (`voice`: a library voice id or name; `language`)."""


class ChorusTTSService(TTSService):
    """Streams each LLM turn to Chorus as one text stream and plays its audio."""

    Settings = ChorusTTSSettings
    _settings: ChorusTTSSettings

    def __init__(self, *, url: str = "http://127.0.0.1:8000", api_key: str | None = None,
                 voice: str | None = None, reference: Reference | None = None, instruct: str | None = None,
                 language: str | None = None, options: Options = None, timestamps: str | None = None,
                 keep_voice: bool | None = None, sample_rate: int | None = None,
                 client: ChorusClient | None = None, text_aggregation_mode: TextAggregationMode | None = None,
                 busy_retry: BusyRetry | None = DEFAULT_BUSY_RETRY, **kwargs: Any):
        """`voice` (library voice), `reference` (one-shot clone) or `instruct` (voice design)
        pick the voice, the same for every turn; `options` are Chorus's generation options;
        `timestamps="word"` asks for word timings (sent to the server as is); `client` shares
        an existing `ChorusClient` (the service then leaves it open at stop, and its own
        `busy_retry` applies); `busy_retry`: how a turn refused `busy` with `retry_after_ms` is
        tried again (None: reported at once)."""
        # Pipecat ends an audio context that gets no audio for this long; this service ends
        # each context itself (done, error, interruption), so a busy server's slow first
        # audio must not end a turn before it starts.
        kwargs.setdefault("stop_frame_timeout_s", 30.0)
        super().__init__(
            text_aggregation_mode=text_aggregation_mode or TextAggregationMode.TOKEN,
            push_text_frames=timestamps is None,
            push_start_frame=True,
            pause_frame_processing=False,
            sample_rate=sample_rate,
            settings=ChorusTTSSettings(model=None, voice=voice, language=language),
            **kwargs,
        )
        self._url, self._api_key = url, api_key
        self._busy_retry = busy_retry
        # what every turn's stream asks for besides its voice and language (those are settings)
        self._turn_request: dict[str, Any] = {"reference": reference, "instruct": instruct, "options": options,
                                              "timestamps": timestamps, "keep_voice": keep_voice}
        self._own_client = client is None
        self._client = client
        self._streams: dict[str, TextStream] = {}
        self._receivers: dict[str, asyncio.Task] = {}
        self._failed: set[str] = set()  # contexts whose stream the server ended with an error
        self.last_voice_id: str | None = None  # with keep_voice: the voice the last turn kept

    def can_generate_metrics(self) -> bool:
        return True

    async def start(self, frame: StartFrame):
        await super().start(frame)
        await self._connect()

    async def stop(self, frame: EndFrame):
        await super().stop(frame)
        await self._disconnect()

    async def cancel(self, frame: CancelFrame):
        await super().cancel(frame)
        await self._disconnect()

    async def _connect(self) -> None:
        if self._client is None:
            self._client = ChorusClient(self._url, api_key=self._api_key, busy_retry=self._busy_retry)
        try:
            ready = await self._client.connect()
        except ChorusError as err:
            await self._report(err)
            return
        if ready.sample_rates and self.sample_rate not in ready.sample_rates:
            await self.push_error(f"Chorus serves {ready.sample_rates} Hz, not the pipeline's {self.sample_rate}",
                                  category=ErrorCategory.INVALID_REQUEST)
        await self._call_event_handler("on_connected")

    async def _disconnect(self) -> None:
        for context_id in list(self._streams):
            await self._end_stream(context_id, cancel=True)
        if self._client is not None and self._own_client:
            await self._client.close()
            self._client = None
            await self._call_event_handler("on_disconnected")

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Append the text to the turn's stream, opening it on the turn's first text."""
        if context_id in self._failed:  # reported once; the rest of the turn's text is dropped
            yield None
            return
        try:
            stream = self._streams.get(context_id) or await self._open_stream(context_id)
            await stream.append(text)
            await self.start_tts_usage_metrics(text)
        except ChorusError as err:
            await self._report(err)
            yield TTSStoppedFrame(context_id=context_id)
            return
        yield None

    async def flush_audio(self, context_id: str | None = None):
        """The LLM's response ended: no more text for this turn's stream."""
        await self._close_input(context_id or self.get_active_audio_context_id())

    async def on_turn_context_completed(self):
        """Close the turn's stream even when Pipecat skips `flush_audio` (its audio context
        timed out before the first audio came), so the server never waits for more text."""
        context_id = self._turn_context_id
        await super().on_turn_context_completed()
        if context_id in self._failed:
            self._failed.discard(context_id)
            await self._end_context(context_id)
        else:
            await self._close_input(context_id)

    async def _end_context(self, context_id: str) -> None:
        if self.audio_context_available(context_id):
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)

    async def _close_input(self, context_id: str | None) -> None:
        stream = self._streams.get(context_id or "")
        if stream is not None and not stream.input_closed:
            try:
                await stream.close()
            except ChorusError as err:
                await self._report(err)

    async def on_audio_context_interrupted(self, context_id: str):
        """Barge-in: cancel the turn's stream now; nothing more of it is played."""
        await self.stop_all_metrics()
        self._failed.discard(context_id)
        await self._end_stream(context_id, cancel=True)
        await super().on_audio_context_interrupted(context_id)

    async def _open_stream(self, context_id: str) -> TextStream:
        if self._client is None:
            await self._connect()
        assert self._client is not None
        stream = self._client.stream(
            request_id=context_id, voice=self._settings.voice or None, language=self._settings.language or None,
            encoding="pcm_s16le", sample_rate=self.sample_rate, **self._turn_request)
        await stream.start()
        self._streams[context_id] = stream
        self._receivers[context_id] = self.create_task(self._receive(context_id, stream), f"chorus-{context_id}")
        return stream

    async def _receive(self, context_id: str, stream: TextStream) -> None:
        """Queue the stream's audio (and word timings) into its audio context, in order."""
        try:
            async for event in stream:
                if isinstance(event, AudioChunk):
                    if not self.audio_context_available(context_id) and context_id != self._turn_context_id:
                        await stream.cancel()  # interrupted before its stream was registered: stop it
                        continue
                    await self.append_to_audio_context(context_id, TTSAudioRawFrame(
                        audio=event.data, sample_rate=event.sample_rate, num_channels=1, context_id=context_id))
                elif isinstance(event, Words):
                    await self.add_word_timestamps([(w.text, w.start_seconds) for w in event.words], context_id)
                elif isinstance(event, Done):
                    self.last_voice_id = event.voice_id or self.last_voice_id
                    await self.stop_ttfb_metrics()
                    await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
                    await self.remove_audio_context(context_id)
                elif isinstance(event, Cancelled):
                    break
        except ChorusError as err:
            await self._report(err)
            if context_id == self._turn_context_id:  # its turn's text still comes: end it with the turn
                self._failed.add(context_id)
            else:
                await self._end_context(context_id)
        finally:
            self._streams.pop(context_id, None)
            self._receivers.pop(context_id, None)

    async def _end_stream(self, context_id: str, *, cancel: bool) -> None:
        stream = self._streams.pop(context_id, None)
        receiver = self._receivers.pop(context_id, None)
        if stream is not None and cancel:
            try:
                await stream.cancel()
            except ChorusError as err:
                logger.debug(f"{self}: cancel of {context_id} not sent: {err}")
        if receiver is not None:
            await self.cancel_task(receiver)

    async def _report(self, err: ChorusError) -> None:
        """A server error as Pipecat reports provider errors: an `ErrorFrame` upstream."""
        await self.stop_all_metrics()
        await self.push_error(error_msg=f"Chorus: {err}", exception=err, category=error_category(err))


__all__ = ["ChorusTTSService", "ChorusTTSSettings", "error_category"]
