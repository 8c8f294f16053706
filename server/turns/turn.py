"""One request from its text to its end, whatever door it came through.

A `Turn` takes a `TurnRequest` as the door received it and applies every rule about a request
once: resolve its voice (a named, kept or one-shot voice, as its owner may use), prepare its text
(the lexicon, `normalize_text`, the spoken-length cap: `server.text.prepare`), submit it (the
engine plans and caps its audio), then pass the engine's events on as `TurnEvent`s in order: its
audio, each chunk's words after that chunk's audio (`timestamps`, on the client's clock; an
aligner's off the loop, in chunk order), and one `TurnEnd`, after the kept voice's id
(`keep_voice`) and the last words. A shared `AudioCap` (a stream's) counts its audio as made.

A door that submits in an order of its own (a text stream: segments in order, each when there
is room and its voice is known) calls `prepare()` as soon as the text is whole, so preparing it
overlaps what plays before it, and `release()` when the turn may go to the engine; `start()` is
both at once. `cancel()` stops it wherever it is: while its voice or text is being prepared (that
work stops: `server.bounds`), while it waits to be released, or in the engine (at the next step).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import msgspec

from server.engine.types import ChunkAudio, ChunkTokens, Finished, Progress, SynthesisRequest, VoicePrompt
from server.errors import ServiceError
from server.timestamps.clock import WordClock
from server.timestamps.model_words import AsWritten
from server.turns.audio_cap import AudioCap
from server.turns.events import TurnAccepted, TurnAudio, TurnEnd, TurnEvent, TurnProgress, TurnWords
from server.turns.request import TurnRequest
from server.turns.service import SynthesisService
from server.voices.kept import KeepFailed, KeptVoice

log = logging.getLogger("chorus.turns")
OVER_CAP = "stream_too_long"


class Turn:
    def __init__(self, service: SynthesisService, request: TurnRequest, *, audio_cap: AudioCap | None = None,
                 on_first_tokens: Callable[[ChunkTokens], None] | None = None,
                 on_ready: Callable[[], None] | None = None):
        """`audio_cap`: shared with the other turns of a stream; `on_first_tokens`: chunk 0's
        finished tokens (a stream chains its voice from them); `on_ready`: called once its voice
        and text are prepared (a door that releases turns in order)."""
        self.service = service
        self.request = request
        self.audio_cap = audio_cap
        self.on_first_tokens = on_first_tokens
        self.on_ready = on_ready
        self.accepted: TurnAccepted | None = None
        self.spoken: str | None = None  # the text as synthesised (lexicon, normalisation)
        self.as_written = AsWritten()  # the lexicon's substitutions: word timestamps show what was written
        self.voice: VoicePrompt | None = None
        self.kept: KeptVoice | None = None
        self.words: WordClock | None = None
        self._events: asyncio.Queue[TurnEvent] = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self._released: asyncio.Future[tuple[VoicePrompt | None, float | None]] | None = None
        self.ready = asyncio.Event()  # voice and text prepared: it may be released
        self.settled = asyncio.Event()  # accepted by the engine (with its plan), or ended
        self._submitting = False
        self._words_sent: asyncio.Task | None = None  # aligned words, in chunk order (the last of them)
        self._aligning: list[asyncio.Task] = []
        self._submitted = False
        self._cancel_requested = False
        self._ended = False
        self.end: TurnEnd | None = None  # how it ended, once it has

    # ---- the door's side ----------------------------------------------------------------

    def start(self) -> Turn:
        """Prepare and submit as soon as prepared."""
        self.prepare()
        self.release()
        return self

    def prepare(self) -> Turn:
        """Resolve the voice (unless one is given) and prepare the text now; submit on `release`."""
        loop = asyncio.get_running_loop()
        self._released = loop.create_future()
        self._task = loop.create_task(self._start())
        self._task.add_done_callback(self._started)
        return self

    def release(self, prompt: VoicePrompt | None = None, due_at: float | None = None) -> None:
        """Submit once prepared: with `prompt` as its voice when given (a stream's, known only by
        now), needed by `due_at` (perf_counter; a stream's later segment)."""
        assert self._released is not None, "prepare() first"
        if not self._released.done():
            self._released.set_result((prompt, due_at))

    async def events(self) -> AsyncIterator[TurnEvent]:
        """Every event of the turn, in order, ending with its `TurnEnd`."""
        while True:
            event = await self._events.get()
            yield event
            if isinstance(event, TurnEnd):
                return

    def cancel(self) -> None:
        """Stop the turn: it ends with `cancelled` (`requested`), unless it has already ended."""
        self._cancel_requested = True
        if self._submitted:
            self.service.cancel(self.request.request_id)
        elif self._task is not None and not self._task.done():
            self._task.cancel()

    @property
    def ended(self) -> bool:
        return self._ended

    async def kept_voice_id(self) -> str:
        """The kept voice's id (`keep_voice`), once stored: its write starts with the first chunk's
        tokens, so it is known by the first audio (HTTP puts it in a header); `KeepFailed` else."""
        if self.kept is None:
            raise KeepFailed("keep_voice: the request was not asked to keep its voice")
        return await self.kept.voice_id()

    # ---- preparing and submitting -------------------------------------------------------

    async def _start(self) -> None:
        r = self.request
        try:
            if r.prompt is not None or r.voice_at_release:
                self.voice = r.prompt
            else:
                self.voice = await self.service.voices.resolve(
                    r.voice, r.reference.audio if r.reference else None, r.reference.text if r.reference else None,
                    r.owner)
            spoken = await self.service.text.prepare_spoken(r.text, r.language, r.normalize, r.voice, r.text_field)
            self.spoken, self.as_written = spoken.text, AsWritten(spoken.as_written)
            self.ready.set()
            if self.on_ready is not None:
                self.on_ready()
            assert self._released is not None
            prompt, due_at = await self._released
            if self._cancel_requested:
                raise asyncio.CancelledError
            await self._submit(self.spoken, prompt or self.voice, due_at)
        except ServiceError as exc:
            if not self._submitting:  # the engine's own refusals are counted by the service
                self.service.reject(r.endpoint, exc.code)
            self._end(TurnEnd("error", exc.code, exc.message, exc.field, exc.retry_after_ms))
        except asyncio.CancelledError:  # `cancel()` (or a disconnect) before the engine had it
            self._end(TurnEnd("cancelled", requested=True))
        except Exception:  # a bug here fails this turn only
            log.exception("starting a turn failed", extra={"request_id": r.request_id})
            self._end(TurnEnd("error", "internal", "the server failed to start this request"))

    def _started(self, task: asyncio.Task) -> None:
        """A task cancelled before its first step never runs `_start`'s handlers (the
        cancellation is thrown in before its `try`): a cancel that comes in the same turn of
        the loop as the request still ends it, once."""
        if task.cancelled():
            self._end(TurnEnd("cancelled", requested=True))

    async def _submit(self, text: str, voice: VoicePrompt | None, due_at: float | None) -> None:
        r = self.request
        self.voice = voice
        request = SynthesisRequest(
            request_id=r.request_id, text=text, language=r.language, instruct=r.instruct, voice=voice,
            options=r.options, stream=r.stream, received_at=r.received_at, due_at=due_at, progress=r.progress)
        self.kept = self.service.keeper(r.owner) if r.keep_voice else None
        self.words = WordClock(r.client_id, r.timestamps, self.as_written) if r.timestamps else None
        self._submitting = True
        accepted = await self.service.submit(request, self._on_engine_event, r.endpoint, self._on_tokens,
                                             segment=r.segment)
        self._submitted = True
        if self._cancel_requested:  # asked while the engine planned it
            self.service.cancel(r.request_id)
        planned = sum(accepted.target_seconds)
        if self.audio_cap is not None and (total := self.audio_cap.plan(r.request_id, planned)) is not None:
            self.service.cancel(r.request_id)
            self._over_cap(total)
            return
        self.accepted = TurnAccepted(accepted.chunks, tuple(accepted.target_seconds))
        self._put(self.accepted)
        self.settled.set()

    def _on_tokens(self, event: ChunkTokens) -> None:
        if event.chunk == 0:
            if self.kept is not None:
                self.kept.keep(event.tokens, event.text)
            if self.on_first_tokens is not None:
                self.on_first_tokens(event)
        if self.words is not None:
            self.words.on_tokens(event)

    # ---- the engine's events ------------------------------------------------------------

    def _on_engine_event(self, event: Progress | ChunkAudio | Finished) -> None:
        if self._ended:
            return
        if isinstance(event, Progress):
            self._put(TurnProgress(event.chunk, event.step, event.num_steps, event.fraction))
        elif isinstance(event, ChunkAudio):
            self._audio(event)
        elif event.outcome == "done":
            if self.audio_cap is not None:
                self.audio_cap.finished(self.request.request_id)
            end = TurnEnd("done", audio_seconds=event.audio_seconds, queue_ms=event.queue_ms,
                          first_audio_ms=event.first_audio_ms, total_ms=event.total_ms)
            if self.kept is None and self._words_sent is None:
                self._end(end)
            else:  # after the words still being aligned; with the kept voice's id
                asyncio.get_running_loop().create_task(self._end_after_words(end))
        elif event.outcome == "cancelled":
            self._end(TurnEnd("cancelled", requested=self._cancel_requested))
        else:
            self._end(TurnEnd("error", "internal", event.message or "the engine failed on this request"))

    def _audio(self, event: ChunkAudio) -> None:
        if self.audio_cap is not None and (
                total := self.audio_cap.made(self.request.request_id, event.audio.shape[-1] / event.sample_rate)):
            self.service.cancel(self.request.request_id)
            self._over_cap(total)
            return
        self._put(TurnAudio(event.chunk, event.audio, event.sample_rate, event.final))
        if self.words is not None:
            self._place_words(event)

    def _place_words(self, event: ChunkAudio) -> None:
        """The chunk's words on the client's clock: at once from the model's estimate, or from the
        aligner (its thread; later audio does not wait, the words keep chunk order)."""
        assert self.words is not None
        words, out_rate = self.words, self.request.out_rate or event.sample_rate
        text = words.whole_text() if self.request.stream == "whole" else words.texts.get(event.chunk, "")
        if self.service.aligner is None:
            self._put(TurnWords(event.chunk, words.frame(text, event.audio.shape[-1], event.sample_rate, out_rate)))
            return
        aligned = words.aligned_frame(self.service.aligner, text, event.audio, event.sample_rate, out_rate)
        self._words_sent = asyncio.get_running_loop().create_task(
            self._words_in_turn(self._words_sent, event.chunk, aligned))
        self._aligning.append(self._words_sent)

    async def _words_in_turn(self, previous: asyncio.Task | None, chunk: int, frame) -> None:
        if previous is not None:
            await previous
        words = await frame
        if not self._ended:
            self._put(TurnWords(chunk, words))

    async def _end_after_words(self, end: TurnEnd) -> None:
        if self._words_sent is not None:
            await self._words_sent
        if self.kept is not None:
            try:
                end = msgspec.structs.replace(end, voice_id=await self.kept.voice_id())
            except KeepFailed as exc:
                end = TurnEnd("error", "internal", str(exc), "keep_voice")
        self._end(end)

    def _over_cap(self, total: float) -> None:
        cap = self.audio_cap.max_seconds if self.audio_cap is not None else None
        self._end(TurnEnd("error", OVER_CAP, f"the audio would reach {total:.0f} s, over this server's limit of "
                          f"{cap:g} s (shorten the text, or raise speed or lower duration)"))

    # ---- out ------------------------------------------------------------------------------

    def _put(self, event: TurnEvent) -> None:
        if not self._ended:
            self._events.put_nowait(event)

    def _end(self, end: TurnEnd) -> None:
        if not self._ended:
            self._events.put_nowait(end)
            self._ended = True
            self.end = end
            self.settled.set()
            for task in self._aligning:  # alignments not started yet are dropped with their turn
                task.cancel()
