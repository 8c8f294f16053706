"""Budget, admission, cancellation and fault isolation of the engine loop."""

from __future__ import annotations

import pytest
import torch

from server.engine.scheduling.scheduler import Scheduler
from server.engine.types import GenerationOptions, RequestRejected, SynthesisRequest, VoicePrompt
from tests.support.engine_helpers import GREEDY, Collector, packed_len, running_engine, start_engine

TEXT = "The budget test sentence, of a modest length."


def test_budget_never_exceeded_and_everyone_finishes(model):
    probe = start_engine(model)
    one = packed_len(probe, SynthesisRequest("x", TEXT, options=GenerationOptions(num_step=8)))
    probe.stop()
    budget = int(one * 2.5)  # room for two at a time
    with running_engine(model, max_packed_tokens=budget, max_batch_size=8) as eng:
        c = Collector()
        ids = [f"b{i}" for i in range(7)]
        for rid in ids:
            eng.submit(SynthesisRequest(rid, TEXT, options=GenerationOptions(num_step=8)), c)
        c.wait(ids)
        assert all(c.outcome(rid) == "done" for rid in ids)
        log = list(eng.step_log)
        assert max(s.packed_tokens for s in log) <= budget
        assert max(s.items for s in log) == 2
        # FIFO: requests start in submission order
        assert c.start_order() == ids


def test_max_batch_size_is_respected(model):
    with running_engine(model, max_batch_size=3) as eng:
        c = Collector()
        ids = [f"m{i}" for i in range(7)]
        for rid in ids:
            eng.submit(SynthesisRequest(rid, TEXT, options=GenerationOptions(num_step=4)), c)
        c.wait(ids)
        assert max(s.items for s in eng.step_log) == 3


def test_too_large_request_is_refused_at_submission(model):
    with running_engine(model, max_packed_tokens=200) as eng:
        with pytest.raises(RequestRejected, match="packed tokens, over this server's budget of 200") as info:
            eng.submit(SynthesisRequest("big", TEXT * 4), Collector())
        assert info.value.field == "text"
        c = Collector()  # the engine still serves what fits
        eng.submit(SynthesisRequest("ok", "Hi.", options=GenerationOptions(num_step=4, guidance_scale=0.0)), c)
        c.wait(["ok"])
        assert c.outcome("ok") == "done"


def test_cancel_frees_capacity_at_the_next_step(model):
    probe = start_engine(model)
    one = packed_len(probe, SynthesisRequest("x", TEXT, options=GenerationOptions(num_step=64)))
    probe.stop()
    eng = start_engine(model, max_packed_tokens=int(one * 1.5))  # one at a time
    try:
        c = Collector()
        launched_at_cancel = {}

        def cancel_first(progress):
            if progress.request_id == "first" and progress.step == 3:
                launched_at_cancel["steps"] = eng._steps  # steps launched so far
                eng.cancel("first")

        c.on_progress = cancel_first
        eng.submit(SynthesisRequest("first", TEXT, options=GenerationOptions(num_step=64)), c)
        eng.submit(SynthesisRequest("second", TEXT, options=GenerationOptions(num_step=6)), c)
        c.wait(["first", "second"])
        assert c.outcome("first") == "cancelled" and c.outcome("second") == "done"
        assert len(c.progress("first")) == 3
        log = list(eng.step_log)
        joined = next(s for s in log if s.admitted and s.index > 1)
        # removed at the next step boundary: second joined the very next step launched
        assert joined.index == launched_at_cancel["steps"] + 1
        # exactly one terminal event each
        for rid in ("first", "second"):
            assert sum(type(e).__name__ == "Finished" for e in c.events[rid]) == 1
    finally:
        eng.stop()


def test_cancel_unknown_or_finished_is_harmless(model):
    with running_engine(model) as eng:
        c = Collector()
        eng.submit(SynthesisRequest("a", "Hi.", options=GenerationOptions(num_step=3)), c)
        c.wait(["a"])
        eng.cancel("a")
        eng.cancel("never-existed")
        eng.submit(SynthesisRequest("b", "Hi.", options=GenerationOptions(num_step=3)), c)
        c.wait(["b"])
        assert len([e for e in c.events["a"] if type(e).__name__ == "Finished"]) == 1


def test_out_of_range_voice_codes_are_refused(model):
    with running_engine(model) as eng:
        for tokens in [torch.full((8, 20), 50_000, dtype=torch.long), torch.zeros((7, 20), dtype=torch.long),
                       torch.full((8, 20), -1, dtype=torch.long), torch.zeros((8, 0), dtype=torch.long)]:
            with pytest.raises(RequestRejected) as info:
                eng.submit(SynthesisRequest("v", TEXT, voice=VoicePrompt(tokens, "Ref.", 0.1)), Collector())
            assert info.value.field == "voice"


def test_an_exception_in_one_item_fails_only_that_request(model):
    def choking_on_one_item(real):
        def forward(canvas):
            if any(item.item_id.startswith("bad#") for item in canvas.items):
                raise RuntimeError("simulated failure tied to one item")
            return real.forward(canvas)
        return forward

    with running_engine(model, around=choking_on_one_item) as eng:
        c = Collector()
        ids = ["good0", "bad", "good1", "good2"]
        for rid in ids:
            eng.submit(SynthesisRequest(rid, TEXT, options=GenerationOptions(num_step=5, **GREEDY)), c)
        c.wait(ids)
        assert c.outcome("bad") == "error"
        assert "engine failed on this request" in c.finished["bad"].message
        assert [c.outcome(r) for r in ids if r != "bad"] == ["done"] * 3
        # and the loop keeps serving
        eng.submit(SynthesisRequest("after", "Still alive.", options=GenerationOptions(num_step=3)), c)
        c.wait(["after"])
        assert c.outcome("after") == "done"


def test_non_finite_logits_fail_their_request(model, monkeypatch):
    def poisoning_one_item(real):
        @torch.inference_mode()
        def forward(canvas):
            logits = real.forward(canvas)
            for index, item in enumerate(canvas.items):
                if item.item_id.startswith("nan#"):
                    start = canvas.cond_offsets[index]
                    logits[start : start + 2] = float("nan")
            return logits
        return forward

    with running_engine(model, around=poisoning_one_item) as eng:
        c = Collector()
        eng.submit(SynthesisRequest("nan", TEXT, options=GenerationOptions(num_step=4)), c)
        eng.submit(SynthesisRequest("fine", TEXT, options=GenerationOptions(num_step=4)), c)
        c.wait(["nan", "fine"])
        assert c.outcome("nan") == "error" and "non-finite" in c.finished["nan"].message
        assert c.outcome("fine") == "done"


def test_invalid_inputs_are_rejected_with_their_field(model):
    with running_engine(model) as eng:
        cases = [
            (SynthesisRequest("x", "  "), "text"),
            (SynthesisRequest("x", "Hi", instruct="purple voice"), "instruct"),
            (SynthesisRequest("x", "Hi", options=GenerationOptions(num_step=65)), "options.num_step"),
            (SynthesisRequest("x", "Hi", options=GenerationOptions(t_shift=0)), "options.t_shift"),
            (SynthesisRequest("x", "Hi", options=GenerationOptions(speed=9)), "options.speed"),
            (SynthesisRequest("x", "Hi", options=GenerationOptions(guidance_scale=11)), "options.guidance_scale"),
        ]
        for request, field in cases:
            with pytest.raises(RequestRejected) as info:
                eng.submit(request, Collector())
            assert info.value.field == field
            assert str(info.value).startswith(field)


def test_duplicate_inflight_id_is_refused(model):
    with running_engine(model) as eng:
        c = Collector()
        eng.submit(SynthesisRequest("dup", TEXT, options=GenerationOptions(num_step=30)), c)
        with pytest.raises(RequestRejected) as info:
            eng.submit(SynthesisRequest("dup", TEXT), c)
        assert info.value.code == "duplicate_id"
        c.wait(["dup"])


def test_stop_cancels_what_is_left(model):
    eng = start_engine(model)
    c = Collector()
    for i in range(3):
        eng.submit(SynthesisRequest(f"s{i}", TEXT, options=GenerationOptions(num_step=64)), c)
    eng.stop()
    c.wait(["s0", "s1", "s2"], timeout=30)
    assert {c.outcome(f"s{i}") for i in range(3)} == {"cancelled"}


class _FakeUtt:
    """What the scheduler sees of a chunk (`Schedulable`); `state.seq` names it in the asserts."""

    def __init__(self, seq, chunk, n, steps=4):
        self.state = type("S", (), {"seq": seq, "request_id": f"r{seq}"})()
        self.key, self.request_id, self.chunk_index = (seq, chunk), f"r{seq}", chunk
        self.packed_len = n
        self.steps_left = steps
        self.first_audio_at = None
        self.due = None  # FIFO never reads it

    def advance(self):
        self.steps_left -= 1


def test_scheduler_is_fifo_and_blocks_behind_a_waiting_head():
    s = Scheduler(max_batch_size=4, max_packed_tokens=100)
    for seq, n in [(0, 60), (1, 50), (2, 10)]:
        s.add(_FakeUtt(seq, 0, n))
    running, admitted = s.schedule()
    # r1 does not fit next to r0; r2 would, but may not overtake r1 (no starvation of r1)
    assert [u.state.seq for u in running] == [0] and admitted == 1
    s.retire(running)
    running, _ = s.schedule()
    assert [u.state.seq for u in running] == [1, 2]


def test_scheduler_orders_late_chunks_by_request_arrival():
    s = Scheduler(max_batch_size=1, max_packed_tokens=100)
    s.add(_FakeUtt(5, 0, 10))
    s.add(_FakeUtt(2, 1, 10))  # a later chunk of an earlier request goes first
    running, _ = s.schedule()
    assert running[0].state.seq == 2


def test_drain_finishes_in_flight_work_and_refuses_new(model):
    eng = start_engine(model)
    c = Collector()
    eng.submit(SynthesisRequest("quick", TEXT, options=GenerationOptions(num_step=4)), c)
    assert eng.drain(timeout=60) is True
    assert c.outcome("quick") == "done"
    with pytest.raises(RequestRejected) as info:
        eng.submit(SynthesisRequest("late", TEXT), c)
    assert info.value.code == "busy"
    eng.stop()


def test_drain_deadline_then_stop_cancels_the_rest(model):
    eng = start_engine(model)
    c = Collector()
    eng.submit(SynthesisRequest("slow", TEXT * 3, options=GenerationOptions(num_step=64)), c)
    assert eng.drain(timeout=0.05) is False
    eng.stop()
    c.wait(["slow"], timeout=30)
    assert c.outcome("slow") == "cancelled"
