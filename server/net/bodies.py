"""Budgets of request-body bytes held at once (`--max-bodies-bytes`), server-wide and per
client address (`--max-bodies-bytes-per-client`).

A body is charged as its bytes arrive, never on what its `Content-Length` declares (a
socket that declares 16 MiB and sends one byte holds one byte), and given back when its
handler returns. A chunk the budgets cannot fit ends its request with `503 busy` and
`Retry-After`, so stalled or slow uploads cannot add up to more memory than the budget, and
one client's uploads cannot take all of it.
"""

from __future__ import annotations

import logging
from collections import Counter

from litestar.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("chorus.net")


class BodyBudget:
    def __init__(self, max_bytes: int, max_per_client: int | None = None):
        self.max_bytes = max_bytes
        self.max_per_client = max_bytes if max_per_client is None else max_per_client
        self.held = 0
        self.by_client: Counter[str] = Counter()

    def take(self, n: int, client: str = "") -> bool:
        if self.held + n > self.max_bytes or self.by_client[client] + n > self.max_per_client:
            return False
        self.held += n
        self.by_client[client] += n
        return True

    def give(self, n: int, client: str = "") -> None:
        self.held -= n
        self.by_client[client] -= n
        if self.by_client[client] <= 0:
            del self.by_client[client]


class BodyBudgetExceeded(Exception):
    """A body grew past what the budgets had left (the handler answers 503)."""


BUSY = "the server is receiving too many request bodies at once; try again later"


def body_budget_middleware(budget: BodyBudget):
    """Litestar middleware factory charging every HTTP request body to `budget`."""

    def factory(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            client = scope["client"][0] if scope.get("client") else ""
            held = 0

            async def counted() -> Message:
                nonlocal held
                message = await receive()
                if message["type"] == "http.request" and (n := len(message.get("body", b""))):
                    if not budget.take(n, client):
                        log.warning("refusing a request body: the budget is spent",
                                    extra={"body_bytes": held + n, "held_bytes": budget.held,
                                           "client_bytes": budget.by_client[client], "limit": budget.max_bytes})
                        raise BodyBudgetExceeded(BUSY)
                    held += n
                return message

            try:
                await app(scope, counted, send)
            finally:
                budget.give(held, client)

        return middleware

    return factory
