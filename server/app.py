"""Litestar app factory: routes, error shape, dependencies, and the engines' lifespan.

Every route checks the `Host` (an app guard); the API lives in one `/v1` Router whose guard
checks the Origin and the key (the WebSocket checks them itself, to answer with a frame).

The lifespan loads one engine per device (in threads: loading is slow and touches torch),
starts their step threads, and stops them on shutdown, which ends every request still in
flight with `cancelled`. Before that, `drain` (run by `server.cli.run` on SIGTERM/SIGINT) lets
in-flight requests finish. Handlers get the service and config by dependency injection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version

from litestar import Litestar, Router
from litestar.config.cors import CORSConfig
from litestar.datastructures import State
from litestar.di import Provide
from litestar.exceptions import HTTPException, NotFoundException

from server.api import dialogue, jobs, models, ops, pronunciations, speech, stream, voices
from server.api.auth import require_api_key, require_known_host, unknown_route_handler
from server.api.errors import (
    ApiError,
    api_error_handler,
    error_response,
    http_exception_handler,
    internal_error_handler,
)
from server.api.pages import template_config, web_route_handlers
from server.api.schema_page import openapi_config
from server.audio.files import AudioLimits
from server.config import ServerConfig
from server.jobs import open_job_store
from server.jobs.runner import JobRunner, RunnerSettings
from server.memtrim import trim_when_idle
from server.metrics import Metrics
from server.net.bodies import BodyBudget, BodyBudgetExceeded, body_budget_middleware
from server.text import normalize
from server.text.prepare import TextLimits
from server.timestamps.clock import Aligner
from server.turns.service import Engine, SynthesisService
from server.voices import open_voice_library
from server.voices.builtin import model_key
from server.voices.kept import KeepPolicy

log = logging.getLogger("chorus.app")
ENCODES_PER_ENGINE = 2  # --max-voice-encodes' default: each engine's voice encoder runs two workers


def _package_version() -> str:
    try:
        return version("chorus-tts")
    except PackageNotFoundError:
        return "unknown"


async def load_aligner(cfg: ServerConfig) -> Aligner | None:
    """`--aligner`'s CTC checkpoint, loaded in a thread (it is torch: imported only here)."""
    if not cfg.aligner:
        return None
    from server.engine.model.aligner import CtcAligner  # lazy: torch, kept out of the web layer

    return await asyncio.to_thread(CtcAligner, cfg.aligner)


async def load_engines(cfg: ServerConfig) -> Engine:
    """One started engine per device of `--device` (`cuda`: every visible GPU), as a pool."""
    from server.engine.runtime.pool import EnginePool  # lazy: keeps torch out of the web layer

    assert cfg.model, "the model is resolved before the app starts"
    pool = await asyncio.to_thread(EnginePool.load, cfg.model, cfg.engine, cfg.asr_model)
    pool.start()
    log.info("engines ready", extra={"engines": len(pool.engines), "device": cfg.engine.device, "model": cfg.model})
    return pool


def create_app(cfg: ServerConfig, engine: Engine | None = None, owns_engine: bool = False) -> Litestar:
    """The app; `engine` (already started) replaces loading the model named by `cfg`, and is
    stopped with the app when `owns_engine` (`chorus serve` loads it first, to report a model
    that fails to load in one line)."""

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        store = await asyncio.to_thread(open_voice_library, cfg.voices_dir, cfg.voices_db,
                                        max_voices=cfg.max_voices, max_bytes=cfg.max_voices_bytes)
        running = engine if engine is not None else await load_engines(cfg)
        aligner = await load_aligner(cfg)
        app.state.service = SynthesisService(
            running, store, Metrics(), max_queue=cfg.max_queue, asr_available=bool(cfg.asr_model),
            audio_limits=AudioLimits(max_bytes=cfg.max_reference_bytes, max_seconds=cfg.max_reference_seconds),
            max_references_bytes=cfg.max_references_bytes,
            max_voice_encodes=cfg.max_voice_encodes or ENCODES_PER_ENGINE * len(running.engines),
            keep=KeepPolicy(cfg.kept_voice_ttl, cfg.max_kept_voices, cfg.max_kept_voices_per_owner), aligner=aligner,
            normalize_workers=cfg.normalize_workers, voice_cache_seconds=cfg.voice_cache_seconds,
            text_limits=TextLimits(max_spoken_chars=cfg.spoken_chars, normalize_seconds=cfg.normalize_seconds),
        )
        app.state.service.builtins.model_key = await asyncio.to_thread(model_key, cfg.model, running.model_name)
        app.state.ready = True
        service = app.state.service
        trimmer = asyncio.create_task(trim_when_idle(lambda: service.inflight))
        job_store = await asyncio.to_thread(open_job_store, cfg.jobs_folder, cfg.voices_db)
        app.state.jobs = JobRunner(service, job_store, RunnerSettings(
            cfg.job_concurrency, cfg.job_lease_seconds, cfg.job_retention_hours * 3600.0)).start()
        normalize.report_availability()
        try:
            yield
        finally:
            trimmer.cancel()
            app.state.ready = False
            await app.state.jobs.stop()  # items in flight go back to the queue
            job_store.close()
            if engine is None or owns_engine:  # ends what is left with `cancelled`
                await asyncio.to_thread(running.stop)
            service.text.close()
            store.close()
            if aligner is not None:
                aligner.close()

    def provide_service(state: State) -> SynthesisService:
        return state.service

    def provide_config(state: State) -> ServerConfig:
        return state.config

    # Browsers on the allowed other origins may call the HTTP API too (the WebSocket checks
    # the Origin itself: `server.api.auth`).
    cors = None
    if cfg.allowed_origins:
        cors = CORSConfig(allow_origins=["*"] if "*" in cfg.allowed_origins else list(cfg.allowed_origins),
                          allow_methods=["GET", "POST", "DELETE"], allow_headers=["Authorization", "Content-Type"],
                          expose_headers=["X-Request-Id", "X-Sample-Rate", "Retry-After",
                                          "X-Chorus-Instructions", "X-Chorus-Ignored-Instructions",
                                          "X-Chorus-Voice-Id"])

    return Litestar(
        route_handlers=[
            ops.healthz, ops.readyz, ops.metrics,
            Router("/v1", guards=[require_api_key], security=[{"bearer": []}], route_handlers=[
                stream.stream,
                speech.speech, dialogue.dialogue, models.list_models, models.retrieve_model,
                voices.create_voice, voices.list_voices, voices.get_voice, voices.delete_voice,
                pronunciations.list_pronunciations, pronunciations.add_pronunciation,
                pronunciations.delete_pronunciation,
                jobs.create_job, jobs.get_job, jobs.list_job_items, jobs.get_job_item, jobs.get_job_archive,
                jobs.cancel_job,
            ]),
            *web_route_handlers(cfg),
        ],
        guards=[require_known_host],
        template_config=template_config(),
        dependencies={
            "service": Provide(provide_service, sync_to_thread=False),
            "config": Provide(provide_config, sync_to_thread=False),
        },
        exception_handlers={
            ApiError: api_error_handler,
            NotFoundException: unknown_route_handler,
            HTTPException: http_exception_handler,
            BodyBudgetExceeded: lambda _, exc: error_response("busy", str(exc), 503),
            Exception: internal_error_handler,
        },
        lifespan=[lifespan],
        state=State({"config": cfg, "ready": False, "connections": set()}),
        cors_config=cors,
        middleware=[body_budget_middleware(BodyBudget(cfg.max_bodies_bytes, cfg.bodies_bytes_per_client))],
        request_max_body_size=cfg.max_body_bytes,
        openapi_config=openapi_config("Chorus", _package_version(), cfg.max_text_chars, cfg.max_instructions_chars),
        logging_config=None,  # logging is configured once, by the command line
    )


async def drain(app: Litestar, seconds: float, hurry: asyncio.Event | None = None) -> None:
    """Graceful shutdown, before the server stops: readiness goes false, new work is refused
    (`busy`, HTTP 503 + Retry-After), job items in flight go back to the queue at once (they
    are not a client's to wait for), requests in flight get up to `seconds` (or until
    `hurry` is set) to finish, the rest are cancelled, and once every request has sent its
    end, each WebSocket is closed (1001) after its queued frames reach a client that reads
    them, till the same window ends (what is still queued then is replaced by `cancelled`)."""
    state = app.state
    state.ready = False
    service: SynthesisService | None = state.get("service")
    if service is None:  # still starting
        return
    window_ends = asyncio.get_running_loop().time() + seconds  # queued audio may reach its readers till then
    service.start_draining()
    log.info("shutting down: not ready, taking no new work", extra={"inflight": service.inflight,
                                                                      "drain_s": seconds})
    if (jobs := state.get("jobs")) is not None:  # job items are not waited for: any server makes them again
        await jobs.give_back()
    if not await service.wait_idle(seconds, hurry):
        log.warning("drain deadline passed: cancelling what is left", extra={"inflight": service.inflight})
        service.cancel_all()
        if not await service.wait_idle(10.0):
            log.error("requests still in flight after cancelling", extra={"inflight": service.inflight})
    until = None if hurry is not None and hurry.is_set() else window_ends
    await stream.close_all(state.get("connections") or set(), until=until)
    log.info("drained")
