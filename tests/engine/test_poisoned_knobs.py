"""Knobs beyond what float32 survives cannot poison the shared step.

Validation bounds the knobs; these tests go around it (`GenerationOptions` built directly and
the engine's option check switched off) to show the step itself holds: a layer penalty that
overflows float32 (0 x inf = NaN) or a denormal position temperature (every score infinite)
fails that request alone as non-finite, selection never picks a revealed or padding position,
and a bystander in the same steps gets the very audio it gets alone.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from server.config import EngineSettings
from server.engine.model.runner import StepRunner, backbone_for
from server.engine.planning.request import plan_request
from server.engine.planning.utterances import build_utterance, packed_len_of
from server.engine.runtime.loop import EngineLoop
from server.engine.types import GenerationOptions, SynthesisRequest
from server.engine.work import RequestState
from tests.support.engine_helpers import Collector

POISONS = {
    "penalty_inf": dict(layer_penalty_factor=1e39),  # inf in float32: layer 0 scores 0 x inf = NaN
    "penalty_overflow": dict(layer_penalty_factor=1e38),  # 7 x 1e38 overflows: -inf scores
    "temperature_denormal": dict(position_temperature=1e-40),  # x / 1e-40: every score infinite
    "penalty_nan": dict(layer_penalty_factor=float("nan")),
}


@pytest.fixture()
def unchecked(monkeypatch):
    """The engine's own option check off: what a bug in validation would let through."""
    monkeypatch.setattr("server.engine.planning.request.validate_options", lambda opts: None)


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_a_poisoned_request_fails_alone_and_the_bystander_is_unchanged(model, unchecked, poison):
    eng = EngineLoop(model, EngineSettings())
    c = Collector()
    bystander = GenerationOptions(num_step=6, seed=99)
    # submitted before the thread starts: both are admitted into the very same first step
    eng.submit(SynthesisRequest("poisoned", "A poisoned request, long enough.",
                                options=GenerationOptions(num_step=6, seed=1, **POISONS[poison])), c)
    eng.submit(SynthesisRequest("bystander", "The bystander sentence.", options=bystander), c)
    eng.start()
    try:
        c.wait(["poisoned", "bystander"])
        assert eng.step_log[0].items == 2  # they did share a step
        assert c.outcome("poisoned") == "error" and "non-finite" in c.finished["poisoned"].message
        assert not c.audio("poisoned")
        assert c.outcome("bystander") == "done"
        eng.submit(SynthesisRequest("alone", "The bystander sentence.", options=bystander), c)
        c.wait(["alone"])
        np.testing.assert_array_equal(np.concatenate(c.audio("bystander")), np.concatenate(c.audio("alone")))
        for shared, alone in zip(c.tokens("bystander"), c.tokens("alone"), strict=True):
            np.testing.assert_array_equal(shared, alone)
        # and the engine keeps serving
        eng.submit(SynthesisRequest("after", "Still serving.", options=GenerationOptions(num_step=3)), c)
        c.wait(["after"])
        assert c.outcome("after") == "done"
    finally:
        eng.stop()


def _utterance(model, rid: str, text: str, seed: int, **knobs):
    request = SynthesisRequest(rid, text, options=GenerationOptions(num_step=4, seed=seed, **knobs))
    state = RequestState(request=request, plan=plan_request(model, request, 25), sink=None, seq=seed, seed=seed)
    packed_len_of(model, state, 0)
    return build_utterance(model, state, 0, None, torch.device("cpu"))


SCORE_POISONS = {
    "nan_logits": (float("nan"), {}),
    "inf_logits": (float("inf"), {}),
    "minus_inf_logits": (-float("inf"), {}),
    **{name: (None, knobs) for name, knobs in POISONS.items()},
}


@pytest.mark.parametrize("poison", sorted(SCORE_POISONS))
def test_selection_picks_only_masked_positions_whatever_the_scores(model, unchecked, poison):
    """Garbage logits or poisoned knobs for one (shorter, so padded) item: each step it still
    reveals exactly its k still-masked positions, with ids inside the vocabulary, is flagged
    non-finite, and the other item steps exactly as it does alone."""
    garbage, knobs = SCORE_POISONS[poison]
    real = backbone_for(model, "torch")
    poisoning = {"on": False}  # the step of the poisoned item and its neighbour; off for `alone`'s

    @torch.inference_mode()
    def forward(canvas):
        logits = real(canvas)
        for index, item in enumerate(canvas.items):
            if poisoning["on"] and garbage is not None and item.item_id.startswith("p#"):
                start = canvas.cond_offsets[index]
                logits[start : start + item.target_len] = garbage
        return logits

    runner = StepRunner.for_model(model, "torch", 100_000, backbone=forward)
    mask_id, vocab = model.config.audio_mask_id, model.config.audio_vocab_size
    poisoned = _utterance(model, "p", "Short.", 1, **knobs)
    other = _utterance(model, "o", "A much longer neighbour sentence for padding.", 2)
    alone = _utterance(model, "o", "A much longer neighbour sentence for padding.", 2)
    assert poisoned.item.target_len < other.item.target_len

    from server.engine.scheduling.output import ScheduledBatch

    for _ in range(poisoned.num_step):
        before = poisoned.item.tokens.clone()
        poisoning["on"] = True
        step = runner.run(ScheduledBatch([poisoned, other], 0))
        poisoning["on"] = False
        runner.run(ScheduledBatch([alone], 0))
        assert not step.failed and [part.finite.tolist() for part in step.parts] == [[False, True]]
        after = poisoned.item.tokens
        changed = after != before
        assert int(changed.sum()) == poisoned.schedule[poisoned.step]  # exactly its k
        assert bool((before[changed] == mask_id).all())  # only positions that were masked
        assert int(after.min()) >= 0 and int(after.max()) < vocab
        assert torch.equal(other.item.tokens, alone.item.tokens)
        for utt in (poisoned, other, alone):
            utt.step += 1
    assert not bool((poisoned.item.tokens == mask_id).any())  # every position revealed once
