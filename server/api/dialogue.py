"""Dialogues on both doors: the WebSocket's `dialogue` message and `POST /v1/audio/dialogue`.

A script becomes a `server.turns.dialogue.Dialogue` (every line a turn, all in the engine at
once, heard in order); this module frames its events. The audio is one stream at one rate, lines
back to back with the pause between them as silence: on the WebSocket each line starts with a
`line` frame and its audio frames carry `line` and `offset_samples`; over HTTP the bytes are one
file of the `response_format` (with sse, `speech.audio.line` events between the deltas).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import msgspec
import numpy as np
from litestar import Request, Response, post
from litestar.response import Stream

from server.api.auth import owner_of
from server.api.schema_parts import audio_response, documented, json_body
from server.api.speech import first_audio_or_refusal, read_body, sse_event
from server.audio.encoders import MEDIA_TYPES, StreamEncoder, default_rate, encode, http_encoder, ws_encoder
from server.audio.files import encode_flac
from server.config import ServerConfig
from server.timestamps.frames import Span, WordsMsg
from server.turns.audio_cap import AudioCap
from server.turns.dialogue import Dialogue, DialogueEvent, DialogueRequest, LineEvent, LineStart, Pause, ScriptLine
from server.turns.events import TurnAudio, TurnEnd, TurnProgress, TurnWords
from server.turns.service import SynthesisService
from server.voices.store import Owner
from server.wire import messages as p
from server.wire.dialogue_body import DialogueBody, parse_dialogue_body

log = logging.getLogger("chorus.dialogue")

ENDPOINT = "dialogue"
_request_ids = itertools.count(1)


def script(lines: list[p.DialogueLine], knobs) -> tuple[ScriptLine, ...]:
    """The wire's lines as the turns' (each line's knobs over the dialogue's)."""
    return tuple(ScriptLine(line.text, line.voice, line.instruct, p.generation_options(p.line_options(knobs, line)))
                 for line in lines)


def dialogue_of(service: SynthesisService, request: DialogueRequest, max_audio_seconds: float | None) -> Dialogue:
    return Dialogue(service, request, AudioCap(max_audio_seconds)).start()


@dataclass
class _Clock:
    """Where the dialogue's audio is: samples sent at the output rate, and each line's start."""

    out_rate: int
    samples: int = 0
    line_start: int = 0

    def shifted(self, frame: WordsMsg, line: int) -> WordsMsg:
        """A line's words (on its own clock) on the dialogue's."""
        def move(spans: list[Span] | None) -> list[Span] | None:
            return None if spans is None else [Span(s.text, s.start_samples + self.line_start,
                                                    s.end_samples + self.line_start) for s in spans]
        return msgspec.structs.replace(frame, words=move(frame.words) or [], chars=move(frame.chars), line=line)


async def relay_dialogue(dialogue: Dialogue, client_id: str, encoding: str, out_rate: int,
                         send: Callable[[msgspec.Struct], None], send_bytes: Callable[[bytes, float], None],
                         end: Callable[[p.ServerMessage], None], stopping: str) -> None:
    """A WebSocket dialogue's events as frames: per line a `line` frame, its audio (one encoder
    for the whole dialogue, so the pauses and lines join seamlessly) and words; then one end."""
    encoder: StreamEncoder | None = None
    clock, frames = _Clock(out_rate), 0
    try:
        async for event in dialogue.events():
            if isinstance(event, LineStart):
                clock.line_start = clock.samples
                send(p.LineMsg(client_id, event.line, event.voice, event.text, clock.samples))
            elif isinstance(event, (Pause, LineEvent)):
                audio = _audio_of(event, dialogue.service.sample_rate)
                if audio is not None:
                    if encoder is None:
                        encoder = ws_encoder(encoding, dialogue.service.sample_rate, out_rate)
                    out = await encode(encoder, audio, False)
                    line = event.line if isinstance(event, LineEvent) else -1
                    header = p.DialogueAudioHeader(client_id, 0, False, encoder.out_rate, encoding, out.samples,
                                                   packets=out.packets, line=line, offset_samples=clock.samples)
                    send_bytes(p.audio_frame(header, out.data), out.samples / encoder.out_rate)
                    clock.samples += out.samples
                    frames += 1
                elif isinstance(event, LineEvent) and isinstance(event.event, TurnWords):
                    send(clock.shifted(event.event.frame, event.line))
                elif isinstance(event, LineEvent) and isinstance(event.event, TurnProgress):
                    e = event.event
                    send(p.DialogueProgressMsg(client_id, e.chunk, e.step, e.num_steps, e.fraction, line=event.line))
            elif isinstance(event, TurnEnd):
                if event.outcome == "done" and encoder is not None:  # the codec's tail, the last frame
                    out = await encode(encoder, np.zeros(0, dtype=np.float32), True)
                    header = p.DialogueAudioHeader(client_id, 0, True, encoder.out_rate, encoding, out.samples,
                                                   packets=out.packets, line=len(dialogue.request.lines) - 1,
                                                   offset_samples=clock.samples)
                    send_bytes(p.audio_frame(header, out.data), out.samples / encoder.out_rate)
                    frames += 1
                end(_end_frame(client_id, event, frames, stopping))
    except Exception:  # a bug in relaying fails this dialogue only, and it still ends once
        log.exception("relaying a dialogue failed", extra={"request_id": dialogue.request.request_id})
        dialogue.cancel()
        end(p.ErrorMsg(client_id, "internal", "the server failed on this dialogue"))
    finally:
        if encoder is not None:
            encoder.close()


def _audio_of(event: DialogueEvent, rate: int) -> np.ndarray | None:
    """The samples an event adds to the dialogue's audio (at the engine's `rate`), or None."""
    if isinstance(event, Pause):
        return np.zeros(round(event.seconds * rate), dtype=np.float32)
    if isinstance(event, LineEvent) and isinstance(event.event, TurnAudio):
        return event.event.audio
    return None


def _end_frame(client_id: str, end: TurnEnd, frames: int, stopping: str) -> p.ServerMessage:
    if end.outcome == "done":
        return p.Done(client_id, frames, end.audio_seconds, p.Timings(end.queue_ms, end.first_audio_ms, end.total_ms))
    if end.outcome == "cancelled":
        return p.Cancelled(client_id, reason=None if end.requested else stopping)
    return p.ErrorMsg(client_id, end.code or "internal", end.message or "the dialogue failed", end.field,
                      end.retry_after_ms)


def ws_dialogue(service: SynthesisService, msg: p.Dialogue, prefix: str, owner: Owner, received_at: float,
                max_audio_seconds: float | None) -> tuple[Dialogue, int]:
    """A WebSocket `dialogue` as a started `Dialogue`, and the rate its client hears."""
    out_rate = msg.sample_rate or default_rate(msg.encoding, service.sample_rate)
    request = DialogueRequest(
        request_id=f"{prefix}/{msg.id}", client_id=msg.id, endpoint="stream", owner=owner,
        lines=script(msg.lines, msg.options), pause_ms=msg.pause_ms, language=msg.language,
        normalize=msg.options.normalize_text, timestamps=msg.timestamps, progress=msg.progress,
        received_at=received_at, out_rate=out_rate)
    return dialogue_of(service, request, max_audio_seconds), out_rate


@post("/audio/dialogue", status_code=200, operation_id="createDialogue", tags=["audio"],
      **documented(404, 413, 422, ok=audio_response({}),
                   body=json_body("DialogueBody", "a script of several speakers")))
async def dialogue(request: Request, service: SynthesisService, config: ServerConfig) -> Response | Stream:
    """A script of several speakers as one audio file: JSON `{"lines": [{"voice", "text",
    "instruct"?, "options"?}], "pause_ms"?, "response_format"?, "stream_format"?}` plus the speech
    body's knobs at the top level. Every line is synthesised at once and heard in order."""
    received_at = time.perf_counter()
    body = await read_body(request, service, ENDPOINT, lambda data: parse_dialogue_body(
        data, config.max_text_chars, p.DialogueLimits(config.max_dialogue_lines, config.max_dialogue_chars)))
    sse = body.stream_format == "sse"
    request_id = f"d{next(_request_ids)}"
    work = dialogue_of(service, DialogueRequest(
        request_id=request_id, client_id=request_id, endpoint=ENDPOINT, owner=owner_of(request, config.api_keys),
        lines=script(body.lines, body), pause_ms=body.pause_ms, language=body.language,
        normalize=body.normalize_text, timestamps=body.timestamps, received_at=received_at),
        config.engine.max_audio_seconds)
    events = _Prefetched(work.events())
    first = await first_audio_or_refusal(request, work, _first(work, events))
    if isinstance(first, Response):
        return first
    headers = {"X-Request-Id": request_id, "X-Sample-Rate": str(service.sample_rate)}
    return Stream(_body(work, events, body, service.sample_rate), headers=headers,
                  media_type="text/event-stream" if sse else MEDIA_TYPES[body.response_format])


class _Prefetched:
    """A dialogue's events, some read ahead (to decide the response's status) and given again."""

    def __init__(self, events: AsyncIterator[DialogueEvent]):
        self._events = events
        self.read: list[DialogueEvent] = []

    async def ahead(self) -> DialogueEvent:
        event = await anext(self._events)
        self.read.append(event)
        return event

    async def __aiter__(self) -> AsyncIterator[DialogueEvent]:
        while self.read:
            yield self.read.pop(0)
        async for event in self._events:
            yield event


async def _first(work: Dialogue, events: _Prefetched) -> DialogueEvent:
    """Read ahead to the first audio, then wait until every line is planned: a line the engine
    refuses (its instruct, its length) is the response's status, not an error after the 200.
    The end instead, if it comes first (an error's status)."""
    while True:
        event = await events.ahead()
        if isinstance(event, TurnEnd):
            return event
        if isinstance(event, LineEvent) and isinstance(event.event, TurnAudio):
            break
    await work.planned.wait()
    if work.refusal is not None:
        work.cancel()
        return work.refusal
    return event


async def _body(work: Dialogue, events: _Prefetched, body: DialogueBody, rate: int) -> AsyncIterator[bytes]:
    """The dialogue's bytes (or sse events), lines and pauses in order, at the engine's rate;
    cut short when a line fails; a client that leaves cancels every line."""
    fmt, as_events = body.response_format, body.stream_format == "sse"
    encoder: StreamEncoder | None = None if fmt == "flac" else http_encoder(fmt, rate)
    whole: list[np.ndarray] = []  # flac: written whole at the end
    clock, ended = _Clock(rate), False

    def delta(data: bytes) -> bytes:
        return sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}) if as_events \
            else data

    try:
        async for event in events:
            if isinstance(event, LineStart):
                clock.line_start = clock.samples
                if as_events:
                    yield sse_event({"type": "speech.audio.line", "line": event.line, "voice": event.voice,
                                     "text": event.text, "offset_samples": clock.samples})
            elif isinstance(event, TurnEnd):
                if event.outcome != "done":
                    raise RuntimeError(f"dialogue ended mid-stream: {event.outcome} ({event.message})")
                if encoder is None:
                    yield delta(await asyncio.to_thread(encode_flac, np.concatenate(whole) if whole else
                                                        np.zeros(0, dtype=np.float32), rate))
                elif tail := (await encode(encoder, np.zeros(0, dtype=np.float32), True)).data:
                    yield delta(tail)
                if as_events:
                    yield sse_event({"type": "speech.audio.done", "audio_seconds": event.audio_seconds})
                ended = True
            elif isinstance(event, LineEvent) and isinstance(event.event, TurnWords) and as_events:
                shifted = clock.shifted(event.event.frame, event.line)
                yield sse_event({**msgspec.to_builtins(shifted), "type": "speech.audio.words", "id": None})
            elif (audio := _audio_of(event, rate)) is not None:
                clock.samples += audio.shape[-1]
                if encoder is None:
                    whole.append(audio)
                elif data := (await encode(encoder, audio, False)).data:
                    yield delta(data)
    finally:
        if encoder is not None:
            encoder.close()
        if not ended:
            work.cancel()
