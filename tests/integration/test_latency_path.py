"""What lies between a client's frame and the engine's clock: nothing hidden.

The engine's timings count from the moment the server received the frame (not from the
engine's submit), a request that did not ask for progress hands the event loop nothing per
step, audio frames go out uncompressed (deflating audio costs time on both ends and saves
nothing), and a chunk decoded while a step runs is sent then, not after the step.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import websockets

from server.engine.types import ChunkAudio, GenerationOptions, Progress, SynthesisRequest
from tests.support.engine_helpers import Collector


def test_engine_timings_count_from_when_the_server_received_the_request(engine):
    sink = Collector()
    held = 5.0  # as if the frame had arrived this long before it reached the engine
    request = SynthesisRequest("early", "A short line.", options=GenerationOptions(num_step=2, seed=1),
                               received_at=time.perf_counter() - held)
    engine.submit(request, sink)
    sink.wait(["early"])
    done = sink.finished["early"]
    assert done.outcome == "done"
    assert done.queue_ms >= held * 1000
    assert done.first_audio_ms >= held * 1000
    assert done.total_ms >= done.first_audio_ms


def test_engine_timings_without_a_receive_time_count_from_submit(engine):
    sink = Collector()
    engine.submit(SynthesisRequest("plain", "A short line.", options=GenerationOptions(num_step=2, seed=1)), sink)
    sink.wait(["plain"])
    assert sink.finished["plain"].outcome == "done"
    assert sink.finished["plain"].total_ms < 5000  # not measured from some earlier epoch


def test_progress_events_only_for_requests_that_ask(engine):
    sink = Collector()
    opts = GenerationOptions(num_step=4, seed=1)
    engine.submit(SynthesisRequest("quiet", "A short line.", options=opts, progress=False), sink)
    engine.submit(SynthesisRequest("chatty", "A short line.", options=opts), sink)
    sink.wait(["quiet", "chatty"])
    kinds = {rid: [type(e) for e in sink.events[rid]] for rid in ("quiet", "chatty")}
    assert Progress not in kinds["quiet"] and ChunkAudio in kinds["quiet"]
    assert kinds["chatty"].count(Progress) == 4  # one per step of its one chunk
    assert sink.finished["quiet"].outcome == sink.finished["chatty"].outcome == "done"


def test_websocket_does_not_compress_audio(chorus_server):
    async def handshake():
        # a client that offers permessage-deflate (websockets does by default) is not given it
        async with websockets.connect(chorus_server.ws_url) as ws:
            return ws.response.headers.get("Sec-WebSocket-Extensions"), list(ws.protocol.extensions)

    header, extensions = asyncio.run(handshake())
    assert header is None
    assert extensions == []


def test_step_intervals_count_back_to_back_steps_only(engine):
    """A step's interval (launch to launch) is what a busy engine's cadence is; the first step
    after the engine waited for work has none, so idle time never reads as host overhead."""
    opts = GenerationOptions(num_step=4, seed=1)
    for rid in ("first", "second"):  # the engine idles between the two
        sink = Collector()
        before = engine.step_log[-1].index if engine.step_log else 0
        engine.submit(SynthesisRequest(rid, "A short line.", options=opts, progress=False), sink)
        sink.wait([rid])
        time.sleep(0.3)  # longer than the engine's idle wait for commands
        records = [r for r in engine.step_log if r.index > before]
        assert len(records) == 4
        assert records[0].interval is None
        assert all(r.interval is not None and r.interval > 0 for r in records[1:])
        # back to back, a step starts no sooner than the previous one's device work allows
        assert all(r.interval >= 0.5 * prev.seconds for prev, r in itertools.pairwise(records))


def test_waiting_for_a_step_takes_commands_meanwhile(model):
    """The engine thread waits for a step's device work by polling its event and taking
    commands in between: a decoded chunk's audio (or a cancel, a submit) is handled while a
    long step runs, not after it. (A CUDA event stand-in: done once a command was handled.)"""
    from server.config import EngineSettings
    from server.engine.runtime.commands import Cancel
    from server.engine.runtime.loop import EngineLoop

    eng = EngineLoop(model, EngineSettings())  # not started: this thread plays the engine's
    handled = []
    real_handle = eng._handle
    eng._handle = lambda command: (handled.append(command), real_handle(command))

    class StepInFlight:
        def query(self) -> bool:
            return bool(handled)

        def synchronize(self) -> None:
            raise AssertionError("waited without taking commands")

    try:
        eng._commands.put(Cancel("nobody"))
        eng._wait_for(StepInFlight())
        assert [type(c) for c in handled] == [Cancel]
    finally:
        eng.finisher.shutdown()
        eng.voice_encoder.shutdown()
