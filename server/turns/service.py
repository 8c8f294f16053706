"""The asyncio side of a request: resolve its voice, pick an engine, submit, and hand the
engine's events back on the event loop, audio in text order.

Engines call their sinks from their own threads; everything here runs on the event loop
and never waits on the engine (voice encodes are awaited as futures). Both endpoints (the
WebSocket and `/v1/audio/speech`) go through `SynthesisService.submit`, so a request's
audio does not depend on how it was asked for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from server.audio.files import AudioError, AudioLimits, DecodedAudio, decode_base64_audio, decode_in_thread
from server.engine.types import (
    SHUTTING_DOWN,
    Accepted,
    ChunkAudio,
    ChunkTokens,
    EngineEvent,
    Finished,
    Progress,
    RequestRejected,
    SynthesisRequest,
    VoicePrompt,
)
from server.errors import ServiceError
from server.metrics import Metrics
from server.text.prepare import TextLimits, TextPreparer
from server.timestamps.clock import Aligner
from server.voices import LibraryFull, NameTaken, VoiceInfo, VoiceLibrary
from server.voices.builtin import BUILTIN_NAMES, BuiltinVoices
from server.voices.cache import VoiceCache
from server.voices.kept import KeepPolicy, KeptVoice
from server.voices.reference_budget import ReferenceBudget
from server.voices.store import Owner, same_name

log = logging.getLogger("chorus.service")

# Codes an engine may reject with that the protocol knows; anything else is invalid_request.
_ENGINE_CODES = {"invalid_request", "duplicate_id", "text_too_long", "busy", "voice_not_found"}
VOICE_CACHE_SIZE = 64


class Engine(Protocol):
    """The part of the engine API the service uses (`server.engine.runtime.pool.EnginePool`: one
    engine per device behind the single-engine API; `engines` lists them for metrics)."""

    sample_rate: int
    model_name: str
    engines: Sequence[Any]

    def submit(self, request: SynthesisRequest, sink: Callable[[EngineEvent], None]) -> Accepted: ...
    def cancel(self, request_id: str) -> None: ...
    def encode_voice(self, audio: np.ndarray, sample_rate: int, text: str | None) -> Future: ...
    def stats(self) -> Any: ...


Deliver = Callable[[Progress | ChunkAudio | Finished], None]


@dataclass
class _Job:
    """One accepted request: puts its engine's events in order for `deliver`."""

    request_id: str
    endpoint: str
    deliver: Deliver
    on_tokens: Callable[[ChunkTokens], None] | None = None
    first_audio_kind: str | None = "line"  # its first audio on /metrics (None: the caller counts it)
    next_chunk: int = 0
    held: dict[int, ChunkAudio] = field(default_factory=dict)

    def on_event(self, event: EngineEvent) -> Finished | None:
        """Pass progress through, release audio in chunk order, end with Finished."""
        if isinstance(event, Progress):
            self.deliver(event)
        elif isinstance(event, ChunkAudio):
            self.held[event.chunk] = event
            while self.next_chunk in self.held:
                self.deliver(self.held.pop(self.next_chunk))
                self.next_chunk += 1
        elif isinstance(event, Finished):
            if event.outcome == "done" and self.held:
                missing = self.next_chunk
                event = Finished(event.request_id, "error", f"the audio of chunk {missing} never came",
                                 event.audio_seconds, event.queue_ms, event.first_audio_ms, event.total_ms)
            self.held.clear()
            self.deliver(event)
            return event
        elif isinstance(event, ChunkTokens) and self.on_tokens is not None:
            self.on_tokens(event)
        return None  # ChunkTokens (unless asked for) and anything newer: not for clients


class SynthesisService:
    def __init__(self, engine: Engine, voices: VoiceLibrary, metrics: Metrics, *,
                 max_queue: int, asr_available: bool = False, audio_limits: AudioLimits = AudioLimits(),
                 max_references_bytes: int | None = None, max_voice_encodes: int = 2,
                 keep: KeepPolicy | None = None, aligner: Aligner | None = None, normalize_workers: int = 2,
                 text_limits: TextLimits | None = None, voice_cache_seconds: float = 2.0):
        self.engine = engine
        self.voices = voices
        self.metrics = metrics
        self.max_queue = max_queue
        self.asr_available = asr_available
        self.audio_limits = audio_limits
        self.keep_policy = keep or KeepPolicy()
        self.aligner = aligner  # `--aligner`: the "aligned" source of word timestamps
        self.draining = False
        self._jobs: dict[str, _Job] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        # library voices decoded once; forgotten when the library says one was removed (any replica)
        self._voice_cache: VoiceCache[VoicePrompt] = VoiceCache(VOICE_CACHE_SIZE, voice_cache_seconds)
        voices.watch(self._voice_cache.forget)
        self.references = ReferenceBudget(max_references_bytes)
        # encodes share the CPU with the step loop: at most this many at once, the rest wait in order
        self.encode_slots = asyncio.Semaphore(max_voice_encodes)
        self.builtins = BuiltinVoices(self)
        self.text = TextPreparer(voices.list_pronunciations, self._voice_ids,  # lexicon, normalisation
                                 normalize_workers=normalize_workers, limits=text_limits or TextLimits())

    @property
    def sample_rate(self) -> int:
        return self.engine.sample_rate

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    @property
    def engines(self) -> list[Any]:
        """Each device's engine (for metrics and readiness)."""
        return list(self.engine.engines)

    def _voice_ids(self, voice: str) -> set[str]:
        """What a request's `voice` stands for, for voice-scoped lexicon entries (blocking)."""
        return {voice, voice.lower()} | {v.id for v in self.voices.list() if same_name(v.name, voice)}

    def keeper(self, owner: Owner) -> KeptVoice:
        """A `keep_voice` ticket for one request or stream, the voice to be `owner`'s."""
        return KeptVoice(self.voices, self.keep_policy, self.engines[0].frame_rate, owner)

    @property
    def inflight(self) -> int:
        return len(self._jobs)

    # ---- requests -----------------------------------------------------------------------

    def submit(self, request: SynthesisRequest, deliver: Deliver, endpoint: str,
               on_tokens: Callable[[ChunkTokens], None] | None = None, segment: int | None = None) -> Accepted:
        """Queue `request`; `deliver` then gets, on this event loop: progress, audio in text
        order, and exactly one `Finished`, last; `on_tokens` (if given) each chunk's finished
        tokens, before its audio. Raises `ServiceError` for a request refused. `segment`: a text
        stream's segment (the stream counts its first audio; a later one belongs to a turn
        already taken, so a full queue does not cut the answer short)."""
        if self.draining:
            self.reject(endpoint, "busy")
            raise ServiceError("busy", SHUTTING_DOWN)
        if len(self._jobs) >= self.max_queue and not segment:
            self.reject(endpoint, "busy")
            raise ServiceError("busy", f"the server has {self.max_queue} requests queued; try again later")
        job = _Job(request.request_id, endpoint, deliver, on_tokens, "line" if segment is None else None)
        loop = asyncio.get_running_loop()

        def sink(event: EngineEvent) -> None:  # engine thread
            loop.call_soon_threadsafe(self._on_event, job, event)

        try:
            accepted = self.engine.submit(request, sink)
        except RequestRejected as exc:
            code = exc.code if exc.code in _ENGINE_CODES else "invalid_request"
            self.reject(endpoint, code)
            raise ServiceError(code, str(exc), exc.field, exc.retry_after_ms) from None
        except Exception:  # a bug: the caller answers `internal`; /metrics counts it like any refusal
            self.reject(endpoint, "internal")
            raise
        self._jobs[request.request_id] = job
        self._idle.clear()
        self.metrics.inflight_requests.set(len(self._jobs))
        log.info("accepted", extra={"request_id": request.request_id, "chunks": accepted.chunks,
                                    "stream": request.stream, "voice": request.voice is not None})
        return accepted

    def cancel(self, request_id: str) -> None:
        if request_id in self._jobs:
            self.engine.cancel(request_id)

    # ---- shutdown -----------------------------------------------------------------------

    def start_draining(self) -> None:
        """Take no new work (new requests and voice uploads get `busy`); what is in flight goes on."""
        self.draining = True

    def cancel_all(self) -> int:
        """Cancel every request in flight (each ends with `cancelled` at its next step)."""
        for request_id in list(self._jobs):
            self.engine.cancel(request_id)
        return len(self._jobs)

    async def wait_idle(self, timeout: float, hurry: asyncio.Event | None = None) -> bool:
        """Wait until no accepted request is in flight, up to `timeout` s or until `hurry`
        is set; True when none is left."""
        waits = [asyncio.ensure_future(self._idle.wait())]
        if hurry is not None:
            waits.append(asyncio.ensure_future(hurry.wait()))
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        return not self._jobs

    def reject(self, endpoint: str, code: str) -> None:
        """Count a request refused before it reached an engine."""
        self.metrics.rejected(endpoint, code)

    def _on_event(self, job: _Job, event: EngineEvent) -> None:
        try:
            finished = job.on_event(event)
        except Exception:  # a consumer's failure must not lose the bookkeeping
            log.exception("delivering an event failed", extra={"request_id": job.request_id})
            finished = event if isinstance(event, Finished) else None
        if finished is None:
            return
        self._jobs.pop(job.request_id, None)
        if not self._jobs:
            self._idle.set()
        self.metrics.inflight_requests.set(len(self._jobs))
        self.metrics.finished(job.endpoint, finished.outcome, finished.audio_seconds, finished.first_audio_ms,
                              kind=job.first_audio_kind)
        extra = {"request_id": job.request_id, "outcome": finished.outcome,
                 "audio_s": finished.audio_seconds, "queue_ms": finished.queue_ms,
                 "first_audio_ms": finished.first_audio_ms, "total_ms": finished.total_ms}
        if finished.outcome == "error":
            log.warning("failed: %s", finished.message, extra=extra)
        else:
            log.info(finished.outcome, extra=extra)

    # ---- voices -------------------------------------------------------------------------

    async def resolve_voice(self, voice_id: str | None, reference_audio: str | None,
                            reference_text: str | None, owner: Owner | None = None) -> VoicePrompt | None:
        """The encoded voice of a request: a library voice (one `owner` may use), a one-shot
        reference, or None."""
        if voice_id is not None:
            return await self.named_voice(voice_id, owner)
        if reference_audio is None:
            return None
        if self.draining:
            raise ServiceError("busy", SHUTTING_DOWN)
        size = len(reference_audio)
        if not self.references.take(size):  # before it is decoded; given back once encoded (or failed)
            raise ServiceError("busy", f"reference.audio: the server holds {self.references.held} bytes of "
                               f"reference audio for requests being prepared; this one adds {size}, over its "
                               f"limit of {self.references.max_bytes} (--max-references-bytes): try again later")
        try:
            try:
                audio = await decode_in_thread(decode_base64_audio, reference_audio, "reference.audio",
                                               self.audio_limits, what="reference.audio", limits=self.audio_limits)
            except AudioError as exc:
                raise ServiceError("invalid_request", str(exc), "reference.audio") from None
            return await self.encode_voice(audio, reference_text, prefix="reference.")
        finally:
            self.references.give(size)

    async def named_voice(self, name: str, owner: Owner | None = None) -> VoicePrompt:
        """A voice by what a client calls it: a built-in name (OpenAI's: alloy...), a library
        id, or the display name of exactly one library voice (`owner` may use)."""
        if name.lower() in BUILTIN_NAMES:
            return await self.builtins.get(name.lower())
        try:
            return await self.library_voice(name, owner)
        except ServiceError:
            named = [v.id for v in await asyncio.to_thread(self.voices.list, owner)
                     if v.name.casefold() == name.casefold()]
            if len(named) == 1:
                return await self.library_voice(named[0], owner)
            if len(named) > 1:
                raise ServiceError("voice_not_found", f"voice: {len(named)} voices are named {name!r}; "
                                   "name one by its id") from None
            raise

    async def library_voice(self, voice_id: str, owner: Owner | None = None) -> VoicePrompt:
        """A library voice by id, decoded once; a cached one is checked against the library
        again when its last check is older than `--voice-cache-seconds` (`server.voices.cache`)."""
        from server.engine.model.voice_codec import voice_from_bytes  # lazy: keeps torch out of the web layer

        key = (voice_id, owner.tag if owner is not None and owner.by_key else None)
        if (cached := self._voice_cache.get(key)) is not None:
            prompt, fresh = cached
            if fresh:
                return prompt
            if await asyncio.to_thread(self.voices.get, voice_id, owner) is not None:
                self._voice_cache.checked(key)
                return prompt
            self._voice_cache.forget([voice_id])
            raise ServiceError("voice_not_found", f"voice: no voice {voice_id!r} in the library", "voice")
        blob = await asyncio.to_thread(self.voices.load, voice_id, owner)
        if blob is None:
            raise ServiceError("voice_not_found", f"voice: no voice {voice_id!r} in the library", "voice")
        prompt = await asyncio.to_thread(voice_from_bytes, blob)
        self._voice_cache.put(key, prompt)
        return prompt

    async def encode_voice(self, audio: DecodedAudio, text: str | None, prefix: str = "") -> VoicePrompt:
        """The reference's `create_voice_clone_prompt`, run on an engine thread."""
        if text is not None and not text.strip():
            text = None
        if text is None and not self.asr_available:
            raise ServiceError("invalid_request", f"{prefix}text: a transcript is required "
                               "(this server runs without --asr-model)", f"{prefix}text")
        if self.encode_slots.locked():
            self.metrics.voice_encode_waits.inc()
        async with self.encode_slots:
            if self.draining:
                raise ServiceError("busy", SHUTTING_DOWN)
            self.metrics.voice_encodes.inc()
            try:
                return await asyncio.wrap_future(self.engine.encode_voice(audio.samples, audio.sample_rate, text))
            except RequestRejected as exc:
                raise self._encode_refused(exc, prefix) from None
            finally:
                self.metrics.voice_encodes.dec()

    @staticmethod
    def _encode_refused(exc: RequestRejected, prefix: str) -> ServiceError:
        code = exc.code if exc.code == "busy" else "invalid_request"
        if code != "invalid_request":
            return ServiceError(code, str(exc))
        return ServiceError(code, f"{prefix}{exc}", f"{prefix}{exc.field or 'audio'}")

    async def add_voice(self, audio: DecodedAudio, text: str | None, name: str | None) -> VoiceInfo:
        """Encode an uploaded clip once and store it in the library."""
        from server.engine.model.voice_codec import voice_to_bytes  # lazy: keeps torch out of the web layer

        prompt = await self.encode_voice(audio, text)
        blob = await asyncio.to_thread(voice_to_bytes, prompt)
        seconds = prompt.num_frames / self.engines[0].frame_rate
        try:
            info = await asyncio.to_thread(self.voices.add, name, prompt.text, seconds, blob)
        except LibraryFull as exc:
            raise ServiceError("invalid_request", str(exc)) from None
        except NameTaken as exc:
            raise ServiceError("name_taken", str(exc), "name") from None
        log.info("voice added", extra={"voice": info.id, "seconds": info.seconds})
        return info

    async def delete_voice(self, voice_id: str, owner: Owner | None = None) -> bool:
        gone = await asyncio.to_thread(self.voices.delete, voice_id, owner)  # the library tells the cache
        if gone:
            log.info("voice deleted", extra={"voice": voice_id})
        return gone
