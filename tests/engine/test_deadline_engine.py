"""Deadline scheduling in a real engine (tiny checkpoint, CPU): a request due now pauses one
whose audio is needed far later, and the paused request's seeded audio is the same as alone."""

from __future__ import annotations

import time

import numpy as np

from server.config import EngineSettings
from server.engine.planning.request import plan_request
from server.engine.planning.utterances import packed_len_of
from server.engine.runtime.loop import EngineLoop
from server.engine.types import GenerationOptions, Progress, SynthesisRequest
from server.engine.work import RequestState
from tests.support.engine_helpers import Collector

TEXT = "A sentence the listener will only hear much later."


def _packed_len(model, request: SynthesisRequest) -> int:
    state = RequestState(request=request, plan=plan_request(model, request, 25), sink=None, seq=0, seed=0)
    return packed_len_of(model, state, 0)


def test_a_due_request_pauses_a_far_one_and_seeded_audio_does_not_change(model):
    opts = GenerationOptions(num_step=12, seed=1234)
    one = _packed_len(model, SynthesisRequest("x", TEXT, options=opts))
    eng = EngineLoop(model, EngineSettings(max_packed_tokens=int(one * 1.5)))  # one at a time
    assert eng.settings.scheduling == "deadline"  # the default
    eng.start()
    try:
        c = Collector()

        def newcomer_at_step_3(event: Progress) -> None:
            if event.request_id == "far" and event.step == 3:
                eng.submit(SynthesisRequest("now", "Needed right away.", options=GenerationOptions(num_step=6)), c)

        c.on_progress = newcomer_at_step_3
        far = SynthesisRequest("far", TEXT, options=opts, due_at=time.perf_counter() + 1000.0)
        eng.submit(far, c)
        c.wait(["far", "now"])
        assert c.outcome("far") == "done" and c.outcome("now") == "done"
        assert eng.scheduler.paused_total >= 1
        order = [(e.request_id, e.step) for e in c.timeline if isinstance(e, Progress)]
        # "now" ran all its steps while "far" waited part-way, then "far" went on
        now_done = order.index(("now", 6))
        assert ("far", 12) in order[now_done:] and ("far", 3) in order[:order.index(("now", 1))]

        c.on_progress = None  # the same seeded request alone, in FIFO order: the same tokens, audio
        eng.submit(SynthesisRequest("alone", TEXT, options=opts), c)
        c.wait(["alone"])
        for paused, alone in zip(c.tokens("far"), c.tokens("alone"), strict=True):
            np.testing.assert_array_equal(paused, alone)
        np.testing.assert_array_equal(np.concatenate(c.audio("far")), np.concatenate(c.audio("alone")))
    finally:
        eng.stop()


def test_fifo_setting_never_pauses(model):
    opts = GenerationOptions(num_step=8, seed=5)
    one = _packed_len(model, SynthesisRequest("x", TEXT, options=opts))
    eng = EngineLoop(model, EngineSettings(max_packed_tokens=int(one * 1.5), scheduling="fifo"))
    eng.start()
    try:
        c = Collector()
        eng.submit(SynthesisRequest("far", TEXT, options=opts, due_at=time.perf_counter() + 1000.0), c)
        eng.submit(SynthesisRequest("now", "Needed right away.", options=GenerationOptions(num_step=4)), c)
        c.wait(["far", "now"])
        assert c.start_order() == ["far", "now"] and eng.scheduler.paused_total == 0
    finally:
        eng.stop()
