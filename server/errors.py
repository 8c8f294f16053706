"""The error a request's service raises (a protocol error code and a message naming the
field), and the one way every message names what is close to a name it does not know."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ServiceError(Exception):
    """A request we cannot take; `code` is a protocol error code, the message names the field
    and `field` is that field (`options.num_step`) when one is at fault."""

    def __init__(self, code: str, message: str, field: str | None = None, retry_after_ms: int | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.retry_after_ms = retry_after_ms  # `busy`: when trying again may succeed


def did_you_mean(name: str, choices: Iterable[str], cutoff: float = 0.6) -> str:
    """` (did you mean 'alloy'?)` when one of `choices` is close to `name` (difflib's ratio,
    case-blind), else an empty string: every "no such name" message says what is close."""
    by_fold: dict[str, str] = {}
    for choice in choices:
        by_fold.setdefault(choice.casefold(), choice)
    close = difflib.get_close_matches(name.casefold(), list(by_fold), n=1, cutoff=cutoff)
    return f" (did you mean {by_fold[close[0]]!r}?)" if close else ""
