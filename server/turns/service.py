"""The asyncio side of the engines: submit a request, hand its events back on the event loop
(audio in text order, exactly one end), count it, and drain on shutdown; and what every turn
shares (the voices, the text preparer, the kept-voice policy, the aligner).

Engines call their sinks from their own threads; everything here runs on the event loop and
never waits on the engine. Every door submits through a `server.turns.turn.Turn`, so a
request's audio does not depend on how it was asked for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from server.audio.files import AudioLimits, DecodedAudio
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
from server.voices.builtin import BuiltinVoices
from server.voices.kept import KeepPolicy, KeptVoice
from server.voices.resolver import VoiceResolver
from server.voices.store import Owner, VoiceLibrary

log = logging.getLogger("chorus.service")

# Codes an engine may reject with that the protocol knows; anything else is invalid_request.
_ENGINE_CODES = {"invalid_request", "duplicate_id", "text_too_long", "busy", "voice_not_found"}


class Engine(Protocol):
    """The part of the engine API the service uses (`server.engine.runtime.pool.EnginePool`: one
    engine per device behind the single-engine API; `engines` lists them for metrics)."""

    sample_rate: int
    frame_rate: float
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
    # the engine's events before its caller has the `Accepted` (the engine may step while the
    # plan's answer crosses from the planner thread); None once they flow
    early: list[EngineEvent] | None = field(default_factory=list)

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
    def __init__(self, engine: Engine, library: VoiceLibrary, metrics: Metrics, *,
                 max_queue: int, asr_available: bool = False, audio_limits: AudioLimits = AudioLimits(),
                 max_references_bytes: int | None = None, max_voice_encodes: int = 2,
                 keep: KeepPolicy | None = None, aligner: Aligner | None = None, normalize_workers: int = 2,
                 text_limits: TextLimits | None = None, voice_cache_seconds: float = 2.0):
        self.engine = engine
        self.library = library
        self.metrics = metrics
        self.max_queue = max_queue
        self.keep_policy = keep or KeepPolicy()
        self.aligner = aligner  # `--aligner`: the "aligned" source of word timestamps
        self.draining = False
        self._jobs: dict[str, _Job] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        # engines plan requests here, off the event loop, one at a time in arrival order
        self._planner = ThreadPoolExecutor(1, thread_name_prefix="chorus-plan")
        self.voices = VoiceResolver(  # named, kept and one-shot voices; uploads and deletes
            engine, library, metrics, frame_rate=engine.frame_rate, draining=lambda: self.draining,
            asr_available=asr_available, audio_limits=audio_limits, max_references_bytes=max_references_bytes,
            max_voice_encodes=max_voice_encodes, cache_seconds=voice_cache_seconds)
        self.builtins = BuiltinVoices(self)
        self.voices.builtins = self.builtins
        self.text = TextPreparer(library.list_pronunciations, self.voices.ids_of,  # lexicon, normalisation
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

    @property
    def frame_rate(self) -> float:
        """Audio tokens a second (the voices' length unit)."""
        return self.engine.frame_rate

    def keeper(self, owner: Owner) -> KeptVoice:
        """A `keep_voice` ticket for one request or stream, the voice to be `owner`'s."""
        return KeptVoice(self.library, self.keep_policy, self.frame_rate, owner)

    async def encode_voice(self, audio: DecodedAudio, text: str | None) -> VoicePrompt:
        """A clip encoded as a voice (the built-in voices make theirs so)."""
        return await self.voices.encode(audio, text)

    @property
    def inflight(self) -> int:
        return len(self._jobs)

    # ---- requests -----------------------------------------------------------------------

    async def submit(self, request: SynthesisRequest, deliver: Deliver, endpoint: str,
                     on_tokens: Callable[[ChunkTokens], None] | None = None, segment: int | None = None) -> Accepted:
        """Queue `request`; `deliver` then gets, on this event loop: progress, audio in text
        order, and exactly one `Finished`, last; `on_tokens` (if given) each chunk's finished
        tokens, before its audio. None of them before the caller has the `Accepted` this
        returns and has used it up to its next await (a door's `accepted` frame comes first).
        Raises `ServiceError` for a request refused. `segment`: a text stream's segment (the
        stream counts its first audio; a later one belongs to a turn already taken, so a full
        queue does not cut the answer short).

        The engine plans the request (tokenises its text, sizes its chunks) on the planner
        thread, not on the event loop: its text is request-controlled work. A caller cancelled
        meanwhile leaves the plan to finish there and the request cancelled at once."""
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

        self._jobs[request.request_id] = job  # before any event can come
        self._idle.clear()
        planned = loop.run_in_executor(self._planner, self.engine.submit, request, sink)
        try:
            accepted = await asyncio.shield(planned)
        except asyncio.CancelledError:
            planned.add_done_callback(lambda done: done.exception() or self.cancel(request.request_id))
            self._flow(job)  # nobody waits for `accepted`: the events (the end among them) go on
            raise
        except RequestRejected as exc:
            self._forget(request.request_id)
            code = exc.code if exc.code in _ENGINE_CODES else "invalid_request"
            self.reject(endpoint, code)
            raise ServiceError(code, str(exc), exc.field, exc.retry_after_ms) from None
        except Exception:  # a bug: the caller answers `internal`; /metrics counts it like any refusal
            self._forget(request.request_id)
            self.reject(endpoint, "internal")
            raise
        self.metrics.inflight_requests.set(len(self._jobs))
        log.info("accepted", extra={"request_id": request.request_id, "chunks": accepted.chunks,
                                    "stream": request.stream, "voice": request.voice is not None})
        loop.call_soon(self._flow, job)  # after the caller has used `accepted`, before it next awaits
        return accepted

    def _forget(self, request_id: str) -> None:
        self._jobs.pop(request_id, None)
        if not self._jobs:
            self._idle.set()

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

    def _flow(self, job: _Job) -> None:
        """The events held until the caller had its `Accepted`, in order; later ones flow."""
        early, job.early = job.early, None
        for event in early or ():
            self._on_event(job, event)

    def _on_event(self, job: _Job, event: EngineEvent) -> None:
        if job.early is not None:
            job.early.append(event)
            return
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
