"""Retries of `busy` with `retry_after_ms` (`BusyRetry`), against a scripted server
(`hostile_server`) that refuses a request or a stream turn a set number of times, then serves
it: the client waits the hint plus jitter (never less), sends the request again on the same id
(a stream with all its text so far, in order), and its caller sees one request; with retries
off it raises `BusyError` at once; a server that never stops refusing is given up on after
`max_wait_s`, with the `BusyError`. The Pipecat and LiveKit plugins retry the same way."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import pytest
from chorus_client import Accepted, AudioChunk, BusyError, BusyRetry, ChorusClient, Done
from chorus_client.errors import InternalError

from tests.clients.conftest import require_framework
from tests.clients.hostile_server import READY, audio_frame, audio_header, hostile_server, speak

HINT_MS = 100
JITTER = 0.5
SLACK_S = 0.25  # a loaded CI core's scheduling delay, on top of hint x (1 + jitter)
ANSWER = ["Sure", "! Th", "at i", "s it.", " See", " you."]


def run(coro, timeout: float = 30.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


@dataclass
class Script:
    """A server that answers each request `busy` (with `hint_ms`, or none) on its first
    `refusals` attempts (None: on every one), then serves it: a stream once its first text
    came (as the engine refuses a turn once its first sentence is submitted), a synthesize
    at once. What it saw: each attempt's arrival and each refusal's departure (monotonic)."""

    refusals: int | None = 2
    hint_ms: int | None = HINT_MS
    busy_after_audio: bool = False  # a stream served, then refused (after its first audio)
    opens: list[float] = field(default_factory=list)
    busies: list[float] = field(default_factory=list)
    texts: dict[str, list[str]] = field(default_factory=dict)  # per attempt served: the text it got

    async def handler(self, ws, server) -> None:
        await ws.send(json.dumps(READY))
        attempts: dict[str, int] = {}
        refusing: set[str] = set()
        serving: dict[str, str] = {}
        async for msg in server.frames(ws):
            kind, rid = msg["type"], msg.get("id")
            if kind in ("synthesize", "stream_open"):
                self.opens.append(time.monotonic())
                attempts[rid] = attempts.get(rid, 0) + 1
                refuse = self.refusals is None or attempts[rid] <= self.refusals
                if kind == "synthesize":
                    await (self.busy(ws, rid) if refuse else speak(ws, rid))
                    continue
                await ws.send(json.dumps({"type": "accepted", "id": rid, "chunks": None, "target_seconds": []}))
                if refuse:
                    refusing.add(rid)
                else:
                    serving[rid] = msg.get("text") or ""
            elif kind in ("stream_append", "stream_flush", "stream_close") and rid in refusing:
                refusing.discard(rid)  # the turn's first text: refused; its late frames are ignored
                await self.busy(ws, rid)
            elif kind == "stream_append" and rid in serving:
                serving[rid] += msg["text"]
                if self.busy_after_audio:
                    await ws.send(audio_frame(audio_header(rid, 240, segment=0, offset_samples=0), b"\0\0" * 240))
                    await self.busy(ws, rid)
                    serving.pop(rid)
            elif kind == "stream_close" and rid in serving:
                self.texts.setdefault(rid, []).append(serving.pop(rid))
                await ws.send(audio_frame(audio_header(rid, 240, segment=0, offset_samples=0), b"\0\0" * 240))
                await ws.send(json.dumps({"type": "done", "id": rid, "chunks": 1, "audio_seconds": 0.01,
                                          "timings": {}}))

    async def busy(self, ws, rid: str) -> None:
        frame = {"type": "error", "id": rid, "code": "busy", "message": "the engine's realtime work is over"}
        if self.hint_ms is not None:
            frame["retry_after_ms"] = self.hint_ms
        self.busies.append(time.monotonic())
        await ws.send(json.dumps(frame))

    def waits(self) -> list[float]:
        """Seconds from each refusal to the next attempt's arrival."""
        return [nxt - busy for busy, nxt in zip(self.busies, self.opens[1:])]


def assert_waits_honour_the_hint(script: Script, hint_s: float = HINT_MS / 1000) -> None:
    waits = script.waits()
    assert waits and all(hint_s <= w <= hint_s * (1 + JITTER) + SLACK_S for w in waits), waits


async def stream_answer(client: ChorusClient, pieces=ANSWER, delay: float = 0.03):
    """Append the pieces (as an LLM writes them) while the events are read; the events and the stream."""
    stream = client.stream()

    async def feed() -> None:
        for piece in pieces:
            await stream.append(piece)
            await asyncio.sleep(delay)
        await stream.close()

    await stream.start()
    feeder = asyncio.create_task(feed())
    try:
        events = [event async for event in stream]
    finally:
        await feeder
    return events, stream


def test_the_wait_is_the_hint_plus_jitter_within_the_cap():
    policy = BusyRetry(max_wait_s=1.0, jitter=0.5, max_retries=3)
    rng = random.Random(1)
    busy = BusyError("full", retry_after_ms=200)
    waits = [policy.wait_s(busy, 0, 0.0, rng) for _ in range(200)]
    assert all(0.2 <= w <= 0.3 for w in waits) and max(waits) - min(waits) > 0.05  # spread, never early
    assert policy.wait_s(busy, 0, 0.8, rng) is None  # would pass max_wait_s
    assert policy.wait_s(busy, 3, 0.0, rng) is None  # max_retries
    assert policy.wait_s(BusyError("draining"), 0, 0.0, rng) is None  # no hint: raised at once
    assert policy.wait_s(InternalError("x", retry_after_ms=100), 0, 0.0, rng) is None  # only busy
    assert BusyRetry(min_wait_s=0.05).wait_s(BusyError("x", retry_after_ms=0), 0, 0.0, rng) >= 0.05  # no spin
    with pytest.raises(ValueError):
        BusyRetry(jitter=-1)


def test_a_stream_turn_refused_twice_is_retried_after_the_hint_and_served_with_all_its_text():
    script = Script(refusals=2)

    async def go():
        async with hostile_server(script.handler) as server, \
                ChorusClient(server.url, busy_retry=BusyRetry(jitter=JITTER)) as client:
            return await stream_answer(client)

    events, stream = run(go())
    assert len(script.opens) == 3 and len(script.busies) == 2
    assert_waits_honour_the_hint(script)
    assert script.texts == {stream.id: ["".join(ANSWER)]}  # every piece once, in order, on the attempt served
    assert [type(e) for e in events] == [Accepted, AudioChunk, Done]  # one request, as its caller sees it
    assert stream.busy_retries == 2 and HINT_MS / 1000 * 2 <= stream.busy_waited_s <= HINT_MS / 1000 * 2 * 1.5
    assert stream.sent_at is not None


def test_a_synthesize_refused_twice_is_retried_and_served():
    script = Script(refusals=2)

    async def go():
        async with hostile_server(script.handler) as server, \
                ChorusClient(server.url, busy_retry=BusyRetry(jitter=JITTER)) as client:
            request = client.synthesize("Hello.")
            return await request.collect(), request.busy_retries

    result, retries = run(go())
    assert result.done is not None and result.audio and retries == 2
    assert len(script.opens) == 3
    assert_waits_honour_the_hint(script)


def test_with_retries_off_busy_is_raised_at_once():
    script = Script(refusals=2)

    async def go():
        async with hostile_server(script.handler) as server, ChorusClient(server.url, busy_retry=None) as client:
            t0 = time.perf_counter()
            with pytest.raises(BusyError) as info:
                await stream_answer(client)
            return info.value, time.perf_counter() - t0

    err, seconds = run(go())
    assert err.retry_after_ms == HINT_MS and len(script.opens) == 1
    assert seconds < 1.0  # the feeder's pieces, no wait on top


def test_a_server_that_never_stops_refusing_is_given_up_on_after_the_cap():
    script = Script(refusals=None)
    cap = 0.6

    async def go():
        async with hostile_server(script.handler) as server, \
                ChorusClient(server.url, busy_retry=BusyRetry(max_wait_s=cap, jitter=JITTER)) as client:
            t0 = time.perf_counter()
            request = client.synthesize("Hello.")
            with pytest.raises(BusyError) as info:
                await request.collect()
            return info.value, time.perf_counter() - t0, request

    err, seconds, request = run(go())
    assert err.retry_after_ms == HINT_MS
    assert request.busy_waited_s <= cap and seconds <= cap + SLACK_S
    # at least cap / (hint x 1.5) retries fit (3 at the least), and no more than cap / hint
    assert 3 <= request.busy_retries <= round(cap / (HINT_MS / 1000)) and len(script.opens) == request.busy_retries + 1
    assert_waits_honour_the_hint(script)


def test_busy_without_a_hint_is_not_retried():
    script = Script(refusals=2, hint_ms=None)

    async def go():
        async with hostile_server(script.handler) as server, ChorusClient(server.url) as client:
            with pytest.raises(BusyError) as info:
                await client.synthesize("Hello.").collect()
            return info.value

    assert run(go()).retry_after_ms is None and len(script.opens) == 1


def test_busy_after_audio_reached_the_caller_is_not_retried():
    """A retry would speak again what was already played: the error is the stream's end."""
    script = Script(refusals=0, busy_after_audio=True)

    async def go():
        async with hostile_server(script.handler) as server, ChorusClient(server.url) as client:
            events = []
            stream = client.stream()
            await stream.append("Hello there. ")
            with pytest.raises(BusyError):
                async for event in stream:
                    events.append(event)
            return events

    events = run(go())
    assert [type(e) for e in events] == [Accepted, AudioChunk] and len(script.opens) == 1


def test_a_cancel_during_the_wait_ends_the_request_without_sending_it_again():
    script = Script(refusals=None, hint_ms=2000)

    async def go():
        async with hostile_server(script.handler) as server, ChorusClient(server.url) as client:
            request = client.synthesize("Hello.")
            reader = asyncio.create_task(request.collect())
            await server.eventually(lambda: len(script.busies) == 1)
            await asyncio.sleep(0.05)
            t0 = time.perf_counter()
            await request.cancel()
            result = await reader
            return result, time.perf_counter() - t0

    result, seconds = run(go())
    assert result.cancelled and seconds < 1.0 and len(script.opens) == 1


def test_the_pipecat_service_retries_a_refused_turn():
    require_framework("pipecat")
    from pipecat_agent import ANSWERS, run_agent

    script = Script(refusals=2)

    async def go():
        async with hostile_server(script.handler) as server:
            return await run_agent(server.url, ANSWERS[:1], sample_rate=24000,
                                   busy_retry=BusyRetry(jitter=JITTER))

    agent = run(go(), timeout=90)
    assert agent.errors == [] and len(agent.turns) == 1 and agent.turns[0].stopped and agent.turns[0].audio
    assert len(script.opens) == 3 and list(script.texts.values()) == [[ANSWERS[0]]]
    assert_waits_honour_the_hint(script)


def test_the_livekit_plugin_retries_a_refused_stream_and_synthesis():
    require_framework("livekit")
    from livekit_agent import ANSWERS, run_agent

    script = Script(refusals=2)

    async def go():
        async with hostile_server(script.handler) as server:
            return await run_agent(server.url, ANSWERS[:1], sample_rate=24000, busy_retry=BusyRetry(jitter=JITTER))

    spoken = run(go(), timeout=90)
    assert len(spoken) == 1 and spoken[0].audio
    assert len(script.opens) == 3 and list(script.texts.values()) == [[ANSWERS[0]]]
    assert_waits_honour_the_hint(script)

    script = Script(refusals=2)

    async def synthesis():
        from chorus_client import livekit as chorus

        async with hostile_server(script.handler) as server:
            tts = chorus.TTS(url=server.url, busy_retry=BusyRetry(jitter=JITTER))
            try:
                return b"".join([bytes(event.frame.data) async for event in tts.synthesize("Hello.")])
            finally:
                await tts.aclose()

    assert run(synthesis(), timeout=90) and len(script.opens) == 3
