"""Operations: liveness, readiness, Prometheus metrics (no API key: for probes and scrapers)."""

from __future__ import annotations

from litestar import MediaType, Response, get
from litestar.datastructures import State

from server.metrics import CONTENT_TYPE_LATEST


@get("/healthz", media_type=MediaType.JSON)
async def healthz() -> dict:
    """The process is up and serving HTTP."""
    return {"status": "ok"}


@get("/readyz", media_type=MediaType.JSON)
async def readyz(state: State) -> Response:
    """The model is loaded and every engine thread is stepping."""
    service = state.get("service")
    engines = service.engines if service is not None else []
    ready = bool(state.get("ready")) and bool(engines) and all(e.ready for e in engines)
    return Response({"ready": ready, "engines": len(engines)}, status_code=200 if ready else 503)


@get("/metrics")
async def metrics(state: State) -> Response:
    service = state.get("service")
    if service is not None:
        service.metrics.observe_engines(service.engines)
        service.metrics.observe_normalizer(*service.text.normalizer.counts())
        body = service.metrics.render()
    else:
        body = b""
    return Response(body, media_type=CONTENT_TYPE_LATEST)
