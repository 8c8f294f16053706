"""The value types of `chorus serve`'s flags: each refuses a bad value in one line."""

from __future__ import annotations

import argparse


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError("must be 0..65535")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be an integer >= 0")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError("must be a number > 0")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError("must be a number >= 0")
    return value


UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024**2, "mb": 1024**2, "mib": 1024**2,
          "g": 1024**3, "gb": 1024**3, "gib": 1024**3}


def size(text: str) -> int:
    """A byte count: `1048576`, `512K`, `16M`, `16MiB`, `1G` (binary units)."""
    digits = text.strip().lower()
    number = digits.rstrip("abgikm")
    unit = digits[len(number):]
    try:
        value = int(float(number) * UNITS[unit])
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 1048576, 512K, 16M, 1G)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be a positive size")
    return value
