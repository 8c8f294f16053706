"""The error a request's service raises: a protocol error code and a message naming the field."""

from __future__ import annotations


class ServiceError(Exception):
    """A request we cannot take; `code` is a protocol error code, the message names the field
    and `field` is that field (`options.num_step`) when one is at fault."""

    def __init__(self, code: str, message: str, field: str | None = None, retry_after_ms: int | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.retry_after_ms = retry_after_ms  # `busy`: when trying again may succeed
