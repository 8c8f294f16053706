"""The duration estimator's per-character sum, as a table lookup with the same result.

`WeightTable` maps characters to `RuleDurationEstimator`'s own weights and sums the same floats
in the same order with the same built-in `sum`, so every estimate is bit-identical; only the
reference's cached method call per character goes.
"""

from __future__ import annotations

from collections.abc import Callable

from server.engine.reference import ReferenceModel

MAX_ENTRIES = 1 << 16  # distinct characters remembered; a text of more rare ones starts a new table


class WeightTable(dict):
    """char -> the reference's weight, filled on first sight of each character."""

    def __init__(self, weigh: Callable[[str], float]):
        super().__init__()
        self._weigh = weigh

    def __missing__(self, char: str) -> float:
        if len(self) >= MAX_ENTRIES:
            self.clear()
        weight = self[char] = self._weigh(char)
        return weight

    def total(self, text: str) -> float:
        """`sum(weight(c) for c in text)`, the reference's `calculate_total_weight`."""
        return sum(map(self.__getitem__, text))


def speed_up_estimates(model: ReferenceModel) -> bool:
    """Give `model`'s duration estimator the table's sum in place of its per-character calls:
    the one change planning makes to the reference instance (`ReferenceModel`), on it alone.
    False, and nothing changed, for an estimator without the reference's `_get_char_weight` /
    `calculate_total_weight` pair (another omnivoice version's)."""
    estimator = getattr(model, "duration_estimator", None)
    weigh = getattr(estimator, "_get_char_weight", None)
    if weigh is None or not callable(getattr(estimator, "calculate_total_weight", None)):
        return False
    estimator.calculate_total_weight = WeightTable(weigh).total
    return True
