"""A scripted dialogue: several speakers' lines, one turn each, all in the engine together,
their audio out in script order with a pause between lines.

Each distinct voice named is resolved once (lines in one voice are one speaker); lines with no
voice speak in one automatic voice, taken from the first of them (as a text stream's later
segments take their first segment's), so those wait for its first tokens. The others go to the
engine at once, in order, each told when its listener will need it (the lines before it, as
planned, and their pauses: the deadline scheduler runs later lines beside more urgent work),
so the lines share steps; but the first line runs alone until its first audio (packed beside
every later line, each of its steps would cost what theirs do, and the script's first sound
would wait for all of them). The lines share one audio cap. Events come out in script order: a
line's start, its audio and words, then a pause, then the next line; the first failure ends the
dialogue (the other lines are cancelled).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import msgspec
from msgspec import Struct

from server.engine.types import ChunkTokens, GenerationOptions, VoicePrompt
from server.errors import ServiceError
from server.timestamps.frames import TimestampKind
from server.turns.audio_cap import AudioCap
from server.turns.events import TurnAudio, TurnEnd, TurnEvent, TurnProgress, TurnWords
from server.turns.request import TurnRequest
from server.turns.service import SynthesisService
from server.turns.turn import Turn
from server.voices.pace import chained_voice
from server.voices.store import Owner

log = logging.getLogger("chorus.turns")


class ScriptLine(Struct, frozen=True):
    text: str
    voice: str | None = None
    instruct: str | None = None
    options: GenerationOptions = msgspec.field(default_factory=GenerationOptions)


class DialogueRequest(Struct, frozen=True):
    request_id: str
    client_id: str
    endpoint: str
    owner: Owner
    lines: tuple[ScriptLine, ...]
    pause_ms: int = 300
    language: str | None = None
    normalize: bool | str = False  # `normalize_text`: true, "reference" or false
    timestamps: TimestampKind | None = None
    progress: bool = False
    received_at: float | None = None
    out_rate: int | None = None
    text_field: str = "lines"


class LineStart(Struct, frozen=True):
    """Line `line` begins here (its audio follows)."""

    line: int
    voice: str | None
    text: str


class Pause(Struct, frozen=True):
    """Silence between two lines, in seconds."""

    seconds: float


class LineEvent(Struct, frozen=True):
    """One of a line's turn events (progress, audio, words)."""

    line: int
    event: TurnProgress | TurnAudio | TurnWords


DialogueEvent = LineStart | Pause | LineEvent | TurnEnd


class Dialogue:
    def __init__(self, service: SynthesisService, request: DialogueRequest, audio_cap: AudioCap):
        self.service = service
        self.request = request
        self.audio_cap = audio_cap
        self.turns: list[Turn] = []
        self._lines: list[asyncio.Queue[TurnEvent]] = [asyncio.Queue() for _ in request.lines]
        self._failure: asyncio.Future[TurnEnd] = asyncio.get_running_loop().create_future()
        self._task: asyncio.Task | None = None
        self._chain: asyncio.Future[VoicePrompt] | None = None
        self._first_heard = asyncio.Event()  # line 0's first audio (or its end)
        self.planned = asyncio.Event()  # every line accepted by the engine, or the dialogue ended first
        self.refusal: TurnEnd | None = None  # the first line refused (`line K: ...`), or its voices'

    def start(self) -> Dialogue:
        self._task = asyncio.get_running_loop().create_task(self._start())
        self._task.add_done_callback(lambda _: self.planned.set())  # every line released, refused, or cancelled
        return self

    def cancel(self) -> None:
        """End every line: the dialogue ends with `cancelled` (`requested`)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        for turn in self.turns:
            turn.cancel()
        self._fail(TurnEnd("cancelled", requested=True))
        self.planned.set()

    async def _start(self) -> None:
        r = self.request
        try:
            voices = await self._voices()
        except ServiceError as exc:
            self.service.reject(r.endpoint, exc.code)
            self.refusal = TurnEnd("error", exc.code, exc.message, exc.field, exc.retry_after_ms)
            self._fail(self.refusal)
            return
        unnamed = [k for k, line in enumerate(r.lines) if line.voice is None]
        if unnamed:
            self._chain = asyncio.get_running_loop().create_future()
        for k, line in enumerate(r.lines):
            turn = Turn(self.service, TurnRequest(
                request_id=f"{r.request_id}/{k}", client_id=r.client_id, endpoint=r.endpoint, text=line.text,
                owner=r.owner, voice=line.voice, voice_at_release=True, instruct=line.instruct, language=r.language,
                options=line.options, normalize=r.normalize, timestamps=r.timestamps, progress=r.progress,
                received_at=r.received_at, segment=k, out_rate=r.out_rate, text_field=f"{r.text_field}[{k}].text"),
                audio_cap=self.audio_cap, on_first_tokens=self._chained if unnamed and k == unnamed[0] else None)
            self.turns.append(turn.prepare())
            asyncio.get_running_loop().create_task(
                self._relay(turn, self._lines[k], self._first_heard if k == 0 else None))
        await self._release(voices, unnamed[0] if unnamed else None)

    async def _voices(self) -> dict[str, VoicePrompt | None]:
        """Each distinct named voice, resolved once; one that fails names the first line that
        asked for it (`line K: ...`, field `lines[K].voice`)."""
        r = self.request
        first_line = {}
        for k, line in enumerate(r.lines):
            if line.voice is not None:
                first_line.setdefault(line.voice, k)
        names = list(first_line)
        results = await asyncio.gather(*(self.service.voices.resolve(name, None, None, r.owner) for name in names),
                                       return_exceptions=True)
        for name, result in zip(names, results, strict=True):
            if isinstance(result, ServiceError):
                k = first_line[name]
                raise ServiceError(result.code, f"line {k}: {result.message}", field=f"{r.text_field}[{k}].voice",
                                   retry_after_ms=result.retry_after_ms)
            if isinstance(result, BaseException):
                raise result
        return dict(zip(names, results, strict=True))  # type: ignore[arg-type]

    async def _release(self, voices: dict[str, VoicePrompt | None], first_unnamed: int | None) -> None:
        """Release the lines in order, each due when the lines before it (as planned) and their
        pauses will have been heard."""
        r = self.request
        base = r.received_at if r.received_at is not None else time.perf_counter()
        offset = 0.0
        for k, (line, turn) in enumerate(zip(r.lines, self.turns, strict=True)):
            if line.voice is not None:
                prompt = voices[line.voice]
            elif k == first_unnamed or self._chain is None:
                prompt = None
            else:
                prompt = await asyncio.shield(self._chain)
            turn.release(prompt, base + offset if k else None)
            await turn.settled.wait()
            if turn.accepted is None:  # it ended (refused): the dialogue ends with it
                if turn.end is not None and turn.end.outcome == "error":
                    self.refusal = self._of_line(turn.end, k)
                return
            offset += sum(turn.accepted.target_seconds) + r.pause_ms / 1000.0
            if k == 0:  # the first line alone until it is heard: the script's first sound as soon as a lone line's
                await self._first_heard.wait()

    def _chained(self, event: ChunkTokens) -> None:
        if self._chain is not None and not self._chain.done():
            self._chain.set_result(chained_voice(event.tokens, event.text, self.service.frame_rate))

    @staticmethod
    async def _relay(turn: Turn, queue: asyncio.Queue[TurnEvent], heard: asyncio.Event | None) -> None:
        try:
            async for event in turn.events():
                queue.put_nowait(event)
                if heard is not None and isinstance(event, (TurnAudio, TurnEnd)):
                    heard.set()
        finally:
            if heard is not None:
                heard.set()

    def _of_line(self, end: TurnEnd, k: int) -> TurnEnd:
        """A line's error as the dialogue's: `line K: ...`, its field within `lines[K]`."""
        field, lines = end.field, self.request.text_field
        if field is not None and not field.startswith(f"{lines}["):
            field = f"{lines}[{k}].{field}"
        return msgspec.structs.replace(end, message=f"line {k}: {end.message}", field=field)

    def _fail(self, end: TurnEnd) -> None:
        if not self._failure.done():
            self._failure.set_result(end)

    async def events(self) -> AsyncIterator[DialogueEvent]:
        """Every event, in script order, ending with one `TurnEnd`: a line's start, its events,
        a pause before the next; the first line that fails (or a cancel) ends it all."""
        r = self.request
        first: TurnEnd | None = None
        seconds = 0.0
        for k, line in enumerate(r.lines):
            yield LineStart(k, line.voice, line.text)
            while True:
                event, of_line = await self._next(k)
                if isinstance(event, TurnEnd):
                    break
                if isinstance(event, (TurnProgress, TurnAudio, TurnWords)):
                    yield LineEvent(k, event)
            if event.outcome != "done":
                self.cancel()  # the other lines too
                if of_line and event.outcome == "error":
                    event = self._of_line(event, k)
                yield event
                return
            first = first or event
            seconds += event.audio_seconds
            if k + 1 < len(r.lines) and r.pause_ms:
                yield Pause(r.pause_ms / 1000.0)
                seconds += r.pause_ms / 1000.0
        total_ms = round((time.perf_counter() - (r.received_at or time.perf_counter())) * 1000.0, 3)
        assert first is not None
        yield TurnEnd("done", audio_seconds=round(seconds, 4), queue_ms=first.queue_ms,
                      first_audio_ms=first.first_audio_ms, total_ms=total_ms)

    async def _next(self, k: int) -> tuple[TurnEvent, bool]:
        """Line `k`'s next event (and True), or the dialogue's own end (and False): its voices
        failed, or it was cancelled."""
        getting = asyncio.ensure_future(self._lines[k].get())
        await asyncio.wait((getting, self._failure), return_when=asyncio.FIRST_COMPLETED)
        if getting.done():
            return getting.result(), True
        getting.cancel()
        return self._failure.result(), False
