"""The step runner on the tiny checkpoint: out-of-memory caps, retry in halves, the
launched step it hands back (moved here from test_engine_scheduling.py with the runner)."""

from __future__ import annotations

import pytest
import torch

from server.engine.planning.request import plan_request
from server.engine.planning.utterances import build_utterance, packed_len_of
from server.engine.scheduling.output import ScheduledBatch
from server.engine.types import GenerationOptions, SynthesisRequest
from server.engine.work import RequestState
from tests.support.engine_helpers import Collector, packed_len, running_engine

TEXT = "The budget test sentence, of a modest length."


def _state(model, rid: str, seq: int, num_step: int = 4) -> RequestState:
    request = SynthesisRequest(rid, TEXT, options=GenerationOptions(num_step=num_step, seed=seq))
    state = RequestState(request=request, plan=plan_request(model, request, 25), sink=None, seq=seq, seed=seq)
    packed_len_of(model, state, 0)
    return state


def test_out_of_memory_shrinks_the_step_instead_of_failing(model):
    limit = {"tokens": None}

    def with_small_memory(real):
        def forward(canvas):
            if limit["tokens"] is not None and canvas.total_len > limit["tokens"]:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return real.forward(canvas)
        return forward

    with running_engine(model, around=with_small_memory) as eng:
        c = Collector()
        ids = [f"o{i}" for i in range(4)]
        probe = packed_len(eng, SynthesisRequest("x", TEXT, options=GenerationOptions(num_step=6)))
        limit["tokens"] = int(probe * 2.5)  # "memory" for two at a time
        for rid in ids:
            eng.submit(SynthesisRequest(rid, TEXT, options=GenerationOptions(num_step=6)), c)
        c.wait(ids)
        assert [c.outcome(r) for r in ids] == ["done"] * 4
        assert eng.runner.oom_cap is not None and eng.runner.oom_cap <= limit["tokens"]


def test_run_isolates_a_failing_item_and_steps_the_rest_once(model):
    """The runner's contract: the culprit comes back in `failed`, every other utterance is in
    exactly one launched part with its next step number, and its canvas moved one step."""
    from server.engine.model.runner import StepRunner, backbone_for

    states = [_state(model, f"r{i}", i) for i in range(5)]
    utts = [build_utterance(model, s, 0, None, torch.device("cpu")) for s in states]
    real = backbone_for(model, "torch")

    def chokes_on_r3(canvas):
        if any(item.item_id.startswith("r3#") for item in canvas.items):
            raise RuntimeError("simulated")
        return real(canvas)

    runner = StepRunner.for_model(model, "torch", 100_000, backbone=chokes_on_r3)
    step = runner.run(ScheduledBatch(utts, admitted=5), index=7)
    assert [f.utt.state.request_id for f in step.failed] == ["r3"]
    assert sorted(u.state.request_id for u in step.stepped) == ["r0", "r1", "r2", "r4"]
    assert step.items == 5 and step.packed_tokens == sum(u.packed_len for u in utts)
    assert (step.admitted, step.index) == (5, 7)
    for part in step.parts:
        assert part.step_numbers == [1] * len(part.utts) and part.finite.tolist() == [True] * len(part.utts)
    mask_id = model.config.audio_mask_id
    revealed = {u.state.request_id: int((u.item.tokens != mask_id).sum()) for u in utts}
    assert revealed["r3"] == 0  # the failed item's canvas is untouched
    assert all(revealed[r] == utts[0].schedule[0] for r in ("r0", "r1", "r2", "r4"))


class _WarmingBackbone:
    """A backbone whose start-up step of `tokens` rows does what it is told."""

    def __init__(self, outcome):
        self.outcome, self.calls = outcome, []

    def warm_eager(self, tokens: int) -> bool:
        self.calls.append(tokens)
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


def test_the_start_up_step_runs_at_the_step_limit_and_an_out_of_memory_caps_steps(monkeypatch):
    from server.engine.model.runner import StepRunner

    monkeypatch.delenv("CHORUS_EAGER_WARMUP", raising=False)
    ran = StepRunner(_WarmingBackbone(True), None, torch.device("cpu"), 6000)
    ran.warm_largest_step()
    assert ran.backbone.calls == [6000] and ran.oom_cap is None
    # out of memory at start: steps begin capped at half, as after an out-of-memory step
    short = StepRunner(_WarmingBackbone(torch.OutOfMemoryError("CUDA out of memory")), None,
                       torch.device("cpu"), 6000)
    short.warm_largest_step()
    assert short.oom_cap == 3000
    # anything else would fail the first large step too: it fails the start instead
    broken = StepRunner(_WarmingBackbone(ValueError("bad kernel")), None, torch.device("cpu"), 6000)
    with pytest.raises(ValueError, match="bad kernel"):
        broken.warm_largest_step()
    monkeypatch.setenv("CHORUS_EAGER_WARMUP", "0")
    off = StepRunner(_WarmingBackbone(True), None, torch.device("cpu"), 6000)
    off.warm_largest_step()
    assert off.backbone.calls == []
