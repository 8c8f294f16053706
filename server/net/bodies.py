"""A server-wide budget of request-body bytes held at once (`--max-bodies-bytes`).

Each HTTP request reserves its `Content-Length` before a byte of it is read (a body sent
chunked reserves as it arrives) and gives it back when its handler returns. A request the
budget cannot fit gets `503 busy` with `Retry-After`, so stalled or slow uploads cannot add
up to more memory than the budget, whoever sends them.
"""

from __future__ import annotations

import json
import logging

from litestar.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("chorus.net")


class BodyBudget:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.held = 0

    def take(self, n: int) -> bool:
        if self.held + n > self.max_bytes:
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        self.held -= n


class BodyBudgetExceeded(Exception):
    """A chunked body grew past what the budget had left (the handler answers 503)."""


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return max(int(value), 0)
            except ValueError:
                return None
    return None


async def _send_busy(send: Send, message: str) -> None:
    body = json.dumps({"error": {"code": "busy", "message": message}}).encode()
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1"),
                            (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


BUSY = "the server is receiving too many request bodies at once; try again later"


def body_budget_middleware(budget: BodyBudget):
    """Litestar middleware factory charging every HTTP request body to `budget`."""

    def factory(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            declared = _content_length(scope)
            held = declared or 0
            if held and not budget.take(held):
                log.warning("refusing a request body: the budget is spent",
                            extra={"body_bytes": held, "held_bytes": budget.held, "limit": budget.max_bytes})
                await _send_busy(send, BUSY)
                return

            async def counted() -> Message:
                nonlocal held
                message = await receive()
                if declared is None and message["type"] == "http.request" and (n := len(message.get("body", b""))):
                    if not budget.take(n):
                        raise BodyBudgetExceeded(BUSY)
                    held += n
                return message

            try:
                await app(scope, counted, send)
            finally:
                budget.give(held)

        return middleware

    return factory
