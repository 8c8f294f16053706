"""Phone numbers read digit by digit, before English normalisation under `normalize_text: true`.

Both normalisers Chorus measured read "555-1234" as a subtraction or a pair of numbers
(docs/normalization.md), where a listener expects "five five five, one two three four". A
number written as a phone number (North American forms: `555-1234`, `(555) 123-4567`,
`555.123.4567`, `1-800-555-0199`, `+1 415 555 2671`) or an emergency number after a verb that
calls it (`dial 911`) is spelled out here, group by group, so the normaliser that follows leaves it be.
"""

from __future__ import annotations

import re

_DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_SEP = r"[-. ]"
_PHONE = re.compile(
    r"(?<![\w.+-])"
    r"(?:(?P<plus>\+)?(?P<country>1)" + _SEP + r")?"
    r"(?:\((?P<area_p>\d{3})\)\s?|(?P<area>\d{3})" + _SEP + r")?"
    r"(?P<exchange>\d{3})" + r"(?P<sep>[-. ])" + r"(?P<line>\d{4})"
    r"(?![\w-]|\.\d)"
)
_EMERGENCY = re.compile(r"\b(?P<verb>dial|call|ring|phone|text)(?P<space>\s+)(?P<number>911|999|112)(?![\w,%-]|\.\d)",
                        re.IGNORECASE)


def _spell(digits: str) -> str:
    return " ".join(_DIGITS[int(d)] for d in digits)


def _phone(match: re.Match[str]) -> str:
    seven_digits_only = not (match["area"] or match["area_p"] or match["country"])
    if seven_digits_only and match["sep"] != "-":  # `555.1234` or `555 1234`: a decimal or two numbers
        return match.group(0)
    groups = [match["area"] or match["area_p"], match["exchange"], match["line"]]
    spoken = ", ".join(_spell(g) for g in groups if g)
    if match["country"]:
        spoken = ("plus one, " if match["plus"] else "one, ") + spoken
    return spoken


def spell_phone_numbers(text: str) -> str:
    """`text` with its phone numbers spelled digit by digit, the rest as it was."""
    text = _PHONE.sub(_phone, text)
    return _EMERGENCY.sub(lambda m: m["verb"] + m["space"] + _spell(m["number"]), text)
