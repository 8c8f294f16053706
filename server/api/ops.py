"""Operations: liveness, readiness, Prometheus metrics (no API key: for probes and scrapers)."""

from __future__ import annotations

from litestar import MediaType, Response, get
from litestar.datastructures import State
from litestar.openapi.datastructures import ResponseSpec

from server.api.schema_parts import ErrorBody, Health, Readiness, documented
from server.metrics import CONTENT_TYPE_LATEST

TAGS = ["operations"]
# Prometheus's text type without its charset: the response adds `charset=utf-8` to `text/*` itself
PROMETHEUS_TEXT = CONTENT_TYPE_LATEST.split("; charset")[0]


@get("/healthz", media_type=MediaType.JSON, operation_id="healthz", tags=TAGS,
     **documented(keyed=False, specs={200: ResponseSpec(Health, description="up", generate_examples=False)}))
async def healthz() -> dict:
    """The process is up and serving HTTP."""
    return {"status": "ok"}


@get("/readyz", media_type=MediaType.JSON, operation_id="readyz", tags=TAGS, **documented(
    keyed=False, retry_after=False, specs={
    200: ResponseSpec(Readiness, description="ready", generate_examples=False),
    503: ResponseSpec(Readiness | ErrorBody, generate_examples=False,
                      description="not ready (`\"ready\": false`), or `busy` (the error envelope)")}))
async def readyz(state: State) -> Response:
    """The model is loaded and every engine thread is stepping."""
    service = state.get("service")
    engines = service.engines if service is not None else []
    ready = bool(state.get("ready")) and bool(engines) and all(e.ready for e in engines)
    return Response({"ready": ready, "engines": len(engines)}, status_code=200 if ready else 503)


@get("/metrics", operation_id="metrics", tags=TAGS, **documented(keyed=False, specs={
    200: ResponseSpec(str, media_type=CONTENT_TYPE_LATEST, generate_examples=False,
                      description="Prometheus's text format (docs/protocol.md lists the metrics)")}))
async def metrics(state: State) -> Response:
    """Prometheus metrics: requests, queues, steps, audio, first-audio times, stream timing."""
    service = state.get("service")
    if service is not None:
        service.metrics.observe_engines(service.engines)
        service.metrics.observe_normalizer(*service.text.normalizer.counts())
        body = service.metrics.render()
    else:
        body = b""
    return Response(body, media_type=PROMETHEUS_TEXT)
