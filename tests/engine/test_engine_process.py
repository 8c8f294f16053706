"""Engines in their own processes behind the pool: same audio, same errors, and a dead engine
process fails only its own requests and comes back."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest

from server.config import EngineSettings
from server.engine.runtime.pool import EnginePool
from server.engine.runtime.process import DIED, EngineProcess
from server.engine.types import GenerationOptions, RequestRejected, SynthesisRequest
from tests.conftest import make_reference_clip
from tests.support.engine_helpers import GREEDY, Collector

TEXT = "Engines in their own processes speak the same."
LONG = " ".join(["A long line that keeps its engine busy for a while, step after step."] * 6)


@pytest.fixture(scope="module")
def pool(tiny_checkpoint):
    settings = EngineSettings(device="cpu", engine_processes=True)
    engines = [EngineProcess(str(tiny_checkpoint), settings, f"engine{i}") for i in range(2)]
    pool = EnginePool(engines)
    yield pool
    pool.stop()


def _request(rid: str, text: str = TEXT, **options) -> SynthesisRequest:
    return SynthesisRequest(rid, text, options=GenerationOptions(**{"seed": 7, "num_step": 4, **GREEDY, **options}))


def test_audio_through_a_process_equals_the_in_process_engine(pool, tiny_checkpoint):
    from server.engine.runtime.loop import EngineLoop

    sink = Collector()
    pool.submit(_request("p1"), sink)
    sink.wait(["p1"])
    assert sink.outcome("p1") == "done"
    local = EngineLoop.load(str(tiny_checkpoint), EngineSettings(device="cpu"))
    local.start()
    try:
        here = Collector()
        local.submit(_request("p1"), here)
        here.wait(["p1"])
    finally:
        local.stop()
    assert [t.tobytes() for t in sink.tokens("p1")] == [t.tobytes() for t in here.tokens("p1")]
    assert [a.tobytes() for a in sink.audio("p1")] == [a.tobytes() for a in here.audio("p1")]
    assert [p.step for p in sink.progress("p1")] == [1, 2, 3, 4]


def test_refusals_cross_the_process_with_their_field(pool):
    with pytest.raises(RequestRejected) as info:
        pool.submit(_request("bad", num_step=0), Collector())
    assert info.value.field == "options.num_step"
    engine = pool.engines[0]
    with pytest.raises(RequestRejected) as info:
        engine.submit(SynthesisRequest("blank", "   "), Collector())
    assert info.value.field == "text"


def test_voice_encoding_and_stats_cross_the_process(pool):
    clip = make_reference_clip(2.0, 16000)
    prompt = pool.engines[1].encode_voice(clip, 16000, "a test clip").result(120)
    assert prompt.tokens.shape[0] == 8 and prompt.text
    stats = pool.engines[1].stats()
    assert stats.name == "engine1" and stats.steps_total >= 0


def test_a_killed_engine_process_fails_its_requests_alone_and_restarts(pool):
    victim, bystander = pool.engines
    started = threading.Event()
    doomed, other = Collector(), Collector()
    doomed.on_progress = lambda event: started.set()
    victim.submit(_request("doomed", LONG, num_step=64), doomed)
    bystander.submit(_request("other", LONG, num_step=16), other)
    assert started.wait(120)
    os.kill(victim.proc.pid, signal.SIGKILL)
    doomed.wait(["doomed"])
    assert doomed.finished["doomed"].outcome == "error" and doomed.finished["doomed"].message == DIED
    other.wait(["other"])
    assert other.outcome("other") == "done"
    # the pool's engine comes back: a new request on it finishes
    deadline_sink = Collector()
    for _ in range(600):
        if victim.ready and victim.restarts == 1:
            break
        threading.Event().wait(0.2)
    assert victim.restarts == 1 and victim.ready
    victim.submit(_request("after"), deadline_sink)
    deadline_sink.wait(["after"])
    assert deadline_sink.outcome("after") == "done"
    assert np.concatenate(deadline_sink.audio("after")).size > 0
