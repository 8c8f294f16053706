"""Planning's table of character weights gives the reference's estimates bit for bit."""

from __future__ import annotations

import random
import sys

import pytest
from omnivoice.utils.duration import RuleDurationEstimator

from server.engine.planning import char_weights
from server.engine.planning.char_weights import WeightTable, speed_up_estimates
from tests.engine.test_packed_len_bound import TEXTS


def _every_script(estimator: RuleDurationEstimator) -> str:
    """Characters on both sides of every block boundary the estimator knows, the planes above
    them, and the special cases it checks first."""
    codes = {32, 0x0640, 0x3000, 0x20001, 0x2F800, 0x10FFFD}
    for bound in estimator.breakpoints:
        codes.update(range(max(bound - 2, 0), bound + 3))
    return "".join(chr(c) for c in sorted(codes) if not 0xD800 <= c <= 0xDFFF)


def _random_texts(seed: int, count: int = 200) -> list[str]:
    rng = random.Random(seed)
    pools = [range(0x20, 0x7F), range(0x4E00, 0x9FFF), range(0x0600, 0x06FF), range(0x0900, 0x097F),
             range(0x1F300, 0x1F6FF), range(0x0300, 0x036F), range(0xAC00, 0xD7AF), range(0, sys.maxunicode)]
    texts = []
    for _ in range(count):
        chars = [chr(rng.choice(rng.choice(pools))) for _ in range(rng.randint(0, 400))]
        texts.append("".join(c for c in chars if not 0xD800 <= ord(c) <= 0xDFFF))
    return texts


def test_the_table_sums_exactly_what_the_reference_sums():
    reference = RuleDurationEstimator()
    table = WeightTable(reference._get_char_weight)
    texts = [_every_script(reference), "", "Nice to meet you.", *TEXTS, *_random_texts(0)]
    for text in texts:
        expected = reference.calculate_total_weight(text)
        assert table.total(text) == expected
        assert type(table.total(text)) is type(expected)


def test_estimates_through_the_model_are_unchanged(model):
    reference = RuleDurationEstimator()
    cases = [(text, ref, frames) for text in [*TEXTS, *_random_texts(1, 40)]
             for ref, frames in [(None, None), ("A short reference.", 40), (TEXTS[1][:30], 77)]]
    before = [model._estimate_target_tokens(t, r, n, speed=s) for t, r, n in cases for s in (1.0, 0.7, 1.6)]
    estimator = model.duration_estimator
    saved = estimator.__dict__.get("calculate_total_weight")
    try:
        assert speed_up_estimates(model)
        assert isinstance(estimator.calculate_total_weight.__self__, WeightTable)
        after = [model._estimate_target_tokens(t, r, n, speed=s) for t, r, n in cases for s in (1.0, 0.7, 1.6)]
    finally:
        if saved is None:
            estimator.__dict__.pop("calculate_total_weight", None)
        else:
            estimator.calculate_total_weight = saved
    assert after == before
    assert reference.estimate_duration(TEXTS[0], "Nice to meet you.", 25) > 0


def test_a_table_full_of_rare_characters_starts_over(monkeypatch):
    monkeypatch.setattr(char_weights, "MAX_ENTRIES", 8)
    reference = RuleDurationEstimator()
    table = WeightTable(reference._get_char_weight)
    text = "".join(chr(0x4E00 + i) for i in range(50)) + "abc"
    assert table.total(text) == reference.calculate_total_weight(text)
    assert len(table) <= 8


@pytest.mark.parametrize("estimator", [None, object()])
def test_a_model_without_the_reference_estimator_is_left_alone(estimator):
    class Model:
        duration_estimator = estimator

    assert speed_up_estimates(Model()) is False
