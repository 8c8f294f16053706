"""The command line's value types: each refusal says what was given and the form expected.

argparse prefixes the option (`argument --max-queue: ...`); the text here says the rest, so a
mistake reads `argument --max-queue: 'abc' is not a whole number (expected a positive integer,
e.g. 256)`, never argparse's `invalid _positive_int value`.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar

Number = TypeVar("Number", int, float)
_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024**2, "mb": 1024**2, "mib": 1024**2,
          "g": 1024**3, "gb": 1024**3, "gib": 1024**3}


def _whole(text: str, expected: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (expected {expected})") from None


def _real(text: str, expected: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (expected {expected})") from None
    if math.isnan(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (expected {expected})")
    return value


def _bounded(parse: Callable[[str, str], Number], expected: str, within: Callable[[Number], bool],
             refusal: str) -> Callable[[str], Number]:
    """A value type: `parse` reads the text, `within` says whether the value is accepted;
    `refusal` says why not, from the `value` read or the `text` as given (stripped)."""

    def value_type(text: str) -> Number:
        value = parse(text, expected)
        if not within(value):
            raise argparse.ArgumentTypeError(f"{refusal.format(value=value, text=text.strip())} "
                                             f"(expected {expected})")
        return value

    return value_type


def integer(text: str) -> int:
    """Any whole number (a seed)."""
    return _whole(text, "a whole number, e.g. 0")


port = _bounded(_whole, "a port number 0..65535, e.g. 8000", lambda v: 0 <= v <= 65535, "{value} is out of range")
positive_int = _bounded(_whole, "a positive integer, e.g. 16", lambda v: v > 0, "{value} is not positive")
non_negative_int = _bounded(_whole, "an integer >= 0, e.g. 0", lambda v: v >= 0, "{value} is negative")
positive_float = _bounded(_real, "a number > 0, e.g. 2.5", lambda v: 0 < v < math.inf, "{text} is out of range")
non_negative_float = _bounded(_real, "a number >= 0, e.g. 0.5", lambda v: 0 <= v < math.inf,
                              "{text} is out of range")
share = _bounded(_real, "a share 0..1, e.g. 0.15", lambda v: 0 <= v <= 1, "{text} is out of range")  # of a whole


def size(text: str) -> int:
    """A byte count: `1048576`, `512K`, `16M`, `16MiB`, `1G` (binary units)."""
    expected = "a size in bytes, e.g. 1048576, 512K, 16M, 1G"
    digits = text.strip().lower()
    number = digits.rstrip("abgikm")
    unit = digits[len(number):]
    try:
        value = int(float(number) * _UNITS[unit])
    except (KeyError, ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (expected {expected})") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive size (expected {expected})")
    return value


# The value types by name, for a table that names them (server/cli/serve_flags.toml).
VALUE_TYPES: dict[str, Callable[[str], int | float]] = {
    "port": port, "integer": integer, "positive_int": positive_int, "non_negative_int": non_negative_int,
    "positive_float": positive_float, "non_negative_float": non_negative_float, "share": share, "size": size,
}
