"""The command line's value types: each refusal says what was given and the form expected.

argparse prefixes the option (`argument --max-queue: ...`); the text here says the rest, so a
mistake reads `argument --max-queue: 'abc' is not a whole number (expected a positive integer,
e.g. 256)`, never argparse's `invalid _positive_int value`.
"""

from __future__ import annotations

import argparse
import math

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


def port(text: str) -> int:
    expected = "a port number 0..65535, e.g. 8000"
    value = _whole(text, expected)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is out of range (expected {expected})")
    return value


def integer(text: str) -> int:
    """Any whole number (a seed)."""
    return _whole(text, "a whole number, e.g. 0")


def positive_int(text: str) -> int:
    expected = "a positive integer, e.g. 16"
    value = _whole(text, expected)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive (expected {expected})")
    return value


def non_negative_int(text: str) -> int:
    expected = "an integer >= 0, e.g. 0"
    value = _whole(text, expected)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative (expected {expected})")
    return value


def positive_float(text: str) -> float:
    expected = "a number > 0, e.g. 2.5"
    value = _real(text, expected)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text.strip()} is out of range (expected {expected})")
    return value


def non_negative_float(text: str) -> float:
    expected = "a number >= 0, e.g. 0.5"
    value = _real(text, expected)
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"{text.strip()} is out of range (expected {expected})")
    return value


def share(text: str) -> float:
    """A share of a whole: 0..1."""
    expected = "a share 0..1, e.g. 0.15"
    value = _real(text, expected)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text.strip()} is out of range (expected {expected})")
    return value


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
