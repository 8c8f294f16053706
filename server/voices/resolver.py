"""A request's voice, from what the client named: a built-in name, a library voice (by id or by
its one display name), or a one-shot reference clip; and the library's uploads and deletes.

Library voices are decoded once and cached (`cache.VoiceCache`), never past their deletion;
kept voices are their owner's (`store.Owner`). Clips (uploads and one-shot references) are
encoded by the engine's voice encoder, at most `max_voice_encodes` at once (they share the CPU
with the step loop), and one-shot references are held to `--max-references-bytes` while they
wait. Everything here runs on the event loop and waits on threads and futures, never on the
engine's step.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Protocol

import numpy as np

from server.audio.files import AudioError, AudioLimits, DecodedAudio, decode_base64_audio, decode_in_thread
from server.engine.types import SHUTTING_DOWN, RequestRejected, VoicePrompt
from server.errors import ServiceError, did_you_mean
from server.metrics import Metrics
from server.voices.builtin import BUILTIN_NAMES
from server.voices.cache import VoiceCache
from server.voices.reference_budget import ReferenceBudget
from server.voices.store import LibraryFull, NameTaken, Owner, VoiceInfo, VoiceLibrary, same_name

log = logging.getLogger("chorus.voices")
VOICE_CACHE_SIZE = 64


class VoiceEncoder(Protocol):
    """The engine's voice encoder (`EnginePool.encode_voice`)."""

    def encode_voice(self, audio: np.ndarray, sample_rate: int, text: str | None) -> Future: ...


class Builtins(Protocol):
    """OpenAI's voice names as fixed voices (`server.voices.builtin.BuiltinVoices`)."""

    async def get(self, name: str) -> VoicePrompt: ...


class VoiceResolver:
    def __init__(self, encoder: VoiceEncoder, library: VoiceLibrary, metrics: Metrics, *, frame_rate: float,
                 draining: Callable[[], bool], asr_available: bool = False,
                 audio_limits: AudioLimits = AudioLimits(), max_references_bytes: int | None = None,
                 max_voice_encodes: int = 2, cache_seconds: float = 2.0):
        self.encoder = encoder
        self.library = library
        self.metrics = metrics
        self.frame_rate = frame_rate
        self._draining = draining
        self.asr_available = asr_available
        self.audio_limits = audio_limits
        self.references = ReferenceBudget(max_references_bytes)
        # encodes share the CPU with the step loop: at most this many at once, the rest wait in order
        self.encode_slots = asyncio.Semaphore(max_voice_encodes)
        # library voices decoded once; forgotten when the library says one was removed (any replica)
        self._cache: VoiceCache[VoicePrompt] = VoiceCache(VOICE_CACHE_SIZE, cache_seconds)
        library.watch(self._cache.forget)
        self.builtins: Builtins | None = None  # set by the service once it can speak them

    async def resolve(self, voice: str | None, reference_audio: str | None, reference_text: str | None,
                      owner: Owner | None = None) -> VoicePrompt | None:
        """The encoded voice of a request: a named voice (one `owner` may use), a one-shot
        reference, or None (the model's own)."""
        if voice is not None:
            return await self.named(voice, owner)
        if reference_audio is None:
            return None
        if self._draining():
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
            return await self.encode(audio, reference_text, prefix="reference.")
        finally:
            self.references.give(size)

    async def named(self, name: str, owner: Owner | None = None) -> VoicePrompt:
        """A voice by what a client calls it: a built-in name (OpenAI's: alloy...), a library
        id, or the display name of exactly one library voice (`owner` may use)."""
        if self.builtins is not None and name.lower() in BUILTIN_NAMES:
            return await self.builtins.get(name.lower())
        try:
            return await self.library_voice(name, owner)
        except ServiceError:
            listed = await asyncio.to_thread(self.library.list, owner)
            named = [v.id for v in listed if v.name.casefold() == name.casefold()]
            if len(named) == 1:
                return await self.library_voice(named[0], owner)
            if len(named) > 1:
                raise ServiceError("voice_not_found", f"voice: {len(named)} voices are named {name!r}; "
                                   "name one by its id") from None
            close = did_you_mean(name, [*BUILTIN_NAMES, *(v.name for v in listed), *(v.id for v in listed)])
            raise _not_found(name, close) from None

    async def library_voice(self, voice_id: str, owner: Owner | None = None) -> VoicePrompt:
        """A library voice by id, decoded once; a cached one is checked against the library
        again when its last check is older than `--voice-cache-seconds` (`server.voices.cache`)."""
        from server.engine.model.voice_codec import voice_from_bytes  # lazy: keeps torch out of the web layer

        key = (voice_id, owner.tag if owner is not None and owner.by_key else None)
        if (cached := self._cache.get(key)) is not None:
            prompt, fresh = cached
            if fresh:
                return prompt
            if await asyncio.to_thread(self.library.get, voice_id, owner) is not None:
                self._cache.checked(key)
                return prompt
            self._cache.forget([voice_id])
            raise _not_found(voice_id)
        blob = await asyncio.to_thread(self.library.load, voice_id, owner)
        if blob is None:
            raise _not_found(voice_id)
        prompt = await asyncio.to_thread(voice_from_bytes, blob)
        self._cache.put(key, prompt)
        return prompt

    def ids_of(self, voice: str) -> set[str]:
        """What a request's `voice` stands for, for voice-scoped lexicon entries (blocking)."""
        return {voice, voice.lower()} | {v.id for v in self.library.list() if same_name(v.name, voice)}

    async def encode(self, audio: DecodedAudio, text: str | None, prefix: str = "") -> VoicePrompt:
        """The reference's `create_voice_clone_prompt`, run by the engine's voice encoder."""
        if text is not None and not text.strip():
            text = None
        if text is None and not self.asr_available:
            raise ServiceError("invalid_request", f"{prefix}text: a transcript is required "
                               "(this server runs without --asr-model)", f"{prefix}text")
        if self.encode_slots.locked():
            self.metrics.voice_encode_waits.inc()
        async with self.encode_slots:
            if self._draining():
                raise ServiceError("busy", SHUTTING_DOWN)
            self.metrics.voice_encodes.inc()
            try:
                return await asyncio.wrap_future(self.encoder.encode_voice(audio.samples, audio.sample_rate, text))
            except RequestRejected as exc:
                raise _encode_refused(exc, prefix) from None
            finally:
                self.metrics.voice_encodes.dec()

    async def add(self, audio: DecodedAudio, text: str | None, name: str | None) -> VoiceInfo:
        """Encode an uploaded clip once and store it in the library."""
        from server.engine.model.voice_codec import voice_to_bytes  # lazy: keeps torch out of the web layer

        prompt = await self.encode(audio, text)
        blob = await asyncio.to_thread(voice_to_bytes, prompt)
        seconds = prompt.num_frames / self.frame_rate
        try:
            info = await asyncio.to_thread(self.library.add, name, prompt.text, seconds, blob)
        except LibraryFull as exc:
            raise ServiceError("invalid_request", str(exc)) from None
        except NameTaken as exc:
            raise ServiceError("name_taken", str(exc), "name") from None
        log.info("voice added", extra={"voice": info.id, "seconds": info.seconds})
        return info

    async def delete(self, voice_id: str, owner: Owner | None = None) -> bool:
        gone = await asyncio.to_thread(self.library.delete, voice_id, owner)  # the library tells the cache
        if gone:
            log.info("voice deleted", extra={"voice": voice_id})
        return gone


def _not_found(voice_id: str, close: str = "") -> ServiceError:
    return ServiceError("voice_not_found", f"voice: no voice {voice_id!r}{close}; GET /v1/voices lists the voices "
                        "(a built-in name such as 'alloy', a library voice's id or name)", "voice")


def _encode_refused(exc: RequestRejected, prefix: str) -> ServiceError:
    code = exc.code if exc.code == "busy" else "invalid_request"
    if code != "invalid_request":
        return ServiceError(code, str(exc))
    return ServiceError(code, f"{prefix}{exc}", f"{prefix}{exc.field or 'audio'}")
