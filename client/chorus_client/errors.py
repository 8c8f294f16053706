"""Errors that mirror the protocol's error codes, so callers catch what they can act on
(`BusyError` to retry later, `InvalidRequestError.field` to fix one input) instead of
parsing messages."""

from __future__ import annotations

import math
from typing import Any


class ChorusError(Exception):
    """An error the server sent (`code` is the protocol's), or one of the client's own."""

    code = "error"

    def __init__(self, message: str, *, request_id: str | None = None, field: str | None = None,
                 retry_after_ms: float | None = None, status: int | None = None,
                 payload: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.request_id = request_id
        self.field = field
        self.retry_after_ms = retry_after_ms
        self.status = status  # the HTTP status, for errors of the HTTP API
        self.payload = payload or {}

    def __str__(self) -> str:
        where = f" ({self.field})" if self.field and self.field not in self.message else ""
        return f"{self.code}: {self.message}{where}"


class BadMessageError(ChorusError):
    code = "bad_message"


class InvalidRequestError(ChorusError):
    code = "invalid_request"


class DuplicateIdError(ChorusError):
    code = "duplicate_id"


class VoiceNotFoundError(ChorusError):
    code = "voice_not_found"


class TextTooLongError(ChorusError):
    code = "text_too_long"


class TooManyRequestsError(ChorusError):
    """This connection already has the server's `max_inflight` requests in flight."""

    code = "too_many_requests"


class BusyError(ChorusError):
    """The server is full; try again after `retry_after_ms` (when the server says)."""

    code = "busy"


class UnauthorizedError(ChorusError):
    code = "unauthorized"


class InternalError(ChorusError):
    code = "internal"


class StreamIdleError(ChorusError):
    code = "stream_idle"


class StreamTooLongError(ChorusError):
    code = "stream_too_long"


class ConflictError(ChorusError):
    """HTTP 409: a voice name already taken."""

    code = "conflict"


class ConnectionLostError(ChorusError):
    """The WebSocket closed while this request was in flight; the next call reconnects."""

    code = "connection_lost"


class ProtocolError(ChorusError):
    """The server sent something this client cannot read: a frame or HTTP body that is not
    JSON, not an object, or has a field missing or of the wrong type. A server bug, or not a
    Chorus server at that URL; only the requests the bad frame concerns end with it."""

    code = "protocol_error"


class HandshakeError(ProtocolError):
    """The connection's first frame was not a readable `ready` greeting; the socket is
    closed and, since trying again would read the same, the client does not retry."""

    code = "bad_handshake"


class BadResponseError(ProtocolError):
    """An HTTP response of the voice library whose body is not the JSON its route returns
    (`status` is the response's; the message quotes the start of the body)."""

    code = "bad_response"


class RequestTimeoutError(ChorusError):
    """No frame of this request (or no `pong`) came for `request_idle_timeout` seconds while
    the caller waited: the request is cancelled on the server, the connection goes on."""

    code = "request_timeout"


class BufferFullError(ChorusError):
    """The request's unread events passed `max_buffered_bytes` (its caller reads slower than
    the server sends, or not at all): the request is cancelled on the server and what it
    held is dropped, so one request left unread cannot take the process's memory."""

    code = "buffer_full"


ERRORS_BY_CODE: dict[str, type[ChorusError]] = {
    cls.code: cls for cls in (BadMessageError, InvalidRequestError, DuplicateIdError, VoiceNotFoundError,
                              TextTooLongError, TooManyRequestsError, BusyError, UnauthorizedError,
                              InternalError, StreamIdleError, StreamTooLongError, ConflictError)
}


def error_from(payload: dict[str, Any], *, status: int | None = None) -> ChorusError:
    """The typed error for a WebSocket `error` frame or an HTTP error body's `error` object.
    Fields of the wrong type are left out rather than trusted: an error frame always ends
    its request with an error, however malformed."""
    code = _text(payload.get("code")) or "error"
    cls = ERRORS_BY_CODE.get(code, ChorusError)
    retry = payload.get("retry_after_ms")
    retry_after_ms = retry if is_number(retry) and retry >= 0 else None
    err = cls(_text(payload.get("message")) or code, request_id=_text(payload.get("id")),
              field=_text(payload.get("field")), retry_after_ms=retry_after_ms, status=status, payload=payload)
    if cls is ChorusError:
        err.code = code
    return err


def is_number(value: Any) -> bool:
    """A finite JSON number (a bool is not one, though Python counts it an int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
