"""Litestar app factory: routes and lifespan."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import AsyncIterator

from litestar import Litestar, MediaType, get
from litestar.datastructures import State
from litestar.response import Response

from server.config import ServerConfig

log = logging.getLogger("chorus.app")


def create_app(cfg: ServerConfig) -> Litestar:
    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        from server.checkpoint import load_omnivoice

        app.state.ready = False
        app.state.model = await asyncio.to_thread(load_omnivoice, cfg.model, cfg.engine.device, cfg.engine.dtype)
        app.state.ready = True
        try:
            yield
        finally:
            app.state.ready = False

    @get("/healthz", media_type=MediaType.JSON)
    async def healthz() -> dict:
        return {"status": "ok"}

    @get("/readyz", media_type=MediaType.JSON)
    async def readyz(state: State) -> Response:
        ready = bool(state.get("ready"))
        return Response({"ready": ready}, status_code=200 if ready else 503)

    return Litestar(
        route_handlers=[healthz, readyz],
        lifespan=[lifespan],
        state=State({"config": cfg, "ready": False}),
    )
