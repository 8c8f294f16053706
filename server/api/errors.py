"""HTTP errors in the protocol's one shape: `{"error": {"code": CODE, "message": TEXT}}`,
plus `"field"` (as the request spells it) when one field is at fault.

Codes are the WebSocket's; the status follows from the code (or is given, e.g. 415).
Litestar's own errors (unknown route, body too large, ...) are rewritten into the same shape.
Every `busy` (503) carries `Retry-After`.
"""

from __future__ import annotations

import logging

from litestar import Request, Response
from litestar.exceptions import HTTPException

log = logging.getLogger("chorus.http")

STATUS = {
    "bad_message": 400,
    "invalid_request": 422,
    "unauthorized": 401,
    "voice_not_found": 404,
    "text_too_long": 413,
    "duplicate_id": 409,
    "name_taken": 409,
    "too_many_requests": 429,
    "busy": 503,
    "internal": 500,
}
RETRY_AFTER_S = 1  # a full queue drains in about a request's time


class ApiError(Exception):
    def __init__(self, code: str, message: str, status: int | None = None,
                 headers: dict[str, str] | None = None, field: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status or STATUS.get(code, 400)
        self.headers = headers
        self.field = field


def error_response(code: str, message: str, status: int, headers: dict[str, str] | None = None,
                   field: str | None = None) -> Response:
    if status == 503 and not (headers and "Retry-After" in headers):
        headers = {**(headers or {}), "Retry-After": str(RETRY_AFTER_S)}
    body: dict[str, str] = {"code": code, "message": message}
    if field is not None:
        body["field"] = field
    return Response({"error": body}, status_code=status, headers=headers)


def api_error_handler(_: Request, exc: ApiError) -> Response:
    return error_response(exc.code, exc.message, exc.status, exc.headers, exc.field)


def http_exception_handler(request: Request, exc: HTTPException) -> Response:
    status = exc.status_code
    code = {401: "unauthorized", 503: "busy"}.get(status, "internal" if status >= 500 else "invalid_request")
    message = exc.detail or "error"
    if status == 404 and message == "Not Found":
        message = f"no such route: {request.method} {request.scope['path']}"
    elif status == 405:  # say which method this route takes: GET /v1/audio/speech is a POST route
        allowed = {k.lower(): v for k, v in (exc.headers or {}).items()}.get("allow", "")
        methods = " or ".join(m.strip() for m in allowed.split(",") if m.strip() not in ("", "OPTIONS", "HEAD"))
        message = (f"{request.method} {request.scope['path']}: this route takes {methods or 'another method'}"
                   + (" (see /schema for its body)" if "POST" in methods else ""))
    return error_response(code, message, status, headers=getattr(exc, "headers", None))


def internal_error_handler(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.scope["path"])
    return error_response("internal", "the server failed on this request", 500)
