"""The optional API key: `Authorization: Bearer KEY` or `?api_key=KEY`."""

from __future__ import annotations

import hmac

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from server.api.errors import ApiError


def presented_key(connection: ASGIConnection) -> str | None:
    header = connection.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return connection.query_params.get("api_key")


def is_authorized(connection: ASGIConnection, api_key: str | None) -> bool:
    if not api_key:
        return True
    given = presented_key(connection)
    return given is not None and hmac.compare_digest(given.encode(), api_key.encode())


def require_api_key(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """Litestar guard for the HTTP API routes."""
    if not is_authorized(connection, connection.app.state.config.api_key):
        raise ApiError("unauthorized", "a valid API key is required (Authorization: Bearer KEY)")
