"""`/v1/jobs`: long-form work in the background (audiobooks, courses, batches of lines).

A job is many speech bodies, or one long text the server cuts into items, submitted at once and
answered at once with its id; the servers' job runners (`server.jobs.runner`) speak its items
behind interactive requests. Its state and audio live with the voice library (SQLite, or the
PostgreSQL database replicas share), so any replica answers for any job and the job outlives
the server that took it. Everything a job will need is checked here, before it is stored: its
body's size (before it is read), every item's fields by the speech endpoint's rules, the caps,
and every voice it names.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
from litestar import Request, Response, delete, get, post
from litestar.datastructures import State
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import OpenAPIMediaType, OpenAPIResponse, Reference, RequestBody, Schema
from litestar.params import Parameter
from litestar.response import Stream

from server.api.auth import owner_of
from server.api.errors import ApiError
from server.api.schema_parts import REF, ErrorBody, binary, documented, header
from server.audio.encoders import MEDIA_TYPES
from server.config import ServerConfig
from server.engine.types import SHUTTING_DOWN
from server.errors import ServiceError
from server.jobs.body import FORMATS, JSONL_TYPES, JobLimits, ParsedJob, parse_json, parse_jsonl
from server.jobs.results import ZipStream, entry_name
from server.jobs.runner import ENDPOINT, JobRunner
from server.jobs.store import JobItems, JobStatus, JobView, NewJob, TooManyJobs
from server.turns.service import SynthesisService
from server.voices.store import Owner
from server.wire.messages import ProtocolError

log = logging.getLogger("chorus.jobs")
TAGS = ["jobs"]
NOT_READY_RETRY_S = 2
ITEMS_PAGE = 1000  # items one `GET /v1/jobs/{id}/items` lists at most


class JobCreated(msgspec.Struct, frozen=True):
    """The job's id (`GET /v1/jobs/{id}` follows it) and its status, `queued`."""

    id: str
    status: JobStatus


_FORMAT = Schema(one_of=[Schema(type="string", enum=list(FORMATS)), Schema(type="null")],
                 description="the items' audio format (an item's own over it; default mp3)")
_BODY = RequestBody(required=True, description=(
    "JSON: `{\"items\": [SPEECH_BODY, ...], \"response_format\"?}`, or one long text as a speech body whose "
    "`input` is cut into items at paragraph and sentence ends (`--job-item-chars`). JSONL "
    "(`application/jsonl` or `application/x-ndjson`): one speech body, or one OpenAI batch request line "
    "(`{\"custom_id\", \"method\", \"url\": \"/v1/audio/speech\", \"body\"}`), a line; `?response_format=` sets "
    "the job's format. At most `--max-job-bytes` (413 before it is read)."), content={
    "application/json": OpenAPIMediaType(schema=Schema(one_of=[
        Schema(type="object", required=["items"], additional_properties=False, properties={
            "items": Schema(type="array", min_items=1, items=Reference(REF.format(name="SpeechRequest"))),
            "response_format": _FORMAT, "model": Schema(description="ignored")}),
        Schema(type="object", required=["input"], description="one long text, with a speech body's other fields",
               properties={"input": Schema(type="string", min_length=1)})])),
    **{media: OpenAPIMediaType(schema=Schema(type="string", description="one speech body a line"))
       for media in JSONL_TYPES[:2]}})
_NOT_READY = ResponseSpec(ErrorBody, generate_examples=False,
                          description="`invalid_request`: the item is not done yet (`Retry-After` says when to ask "
                                      "again)")
_TOO_MANY = ResponseSpec(ErrorBody, generate_examples=False,
                        description="`too_many_requests`: the caller has `--max-active-jobs` jobs not yet finished")
_ITEM = ("200", OpenAPIResponse(
    description="The item's audio in its format", content={media: binary(media) for media in MEDIA_TYPES.values()},
    headers={"X-Chorus-Audio-Seconds": header("how long the item plays", required=True)}))
_ARCHIVE = ("200", OpenAPIResponse(
    description="A zip of every item done (all of them once the job is completed), named by item number",
    content={"application/zip": binary("application/zip")},
    headers={"X-Chorus-Items": header("items in the archive / items of the job", required=True)}))


def _runner(state: State) -> JobRunner:
    runner = state.get("jobs")
    if runner is None:
        raise ApiError("busy", "jobs are not available yet: the server is starting")
    return runner


def _limits(config: ServerConfig) -> JobLimits:
    return JobLimits(max_text_chars=config.max_text_chars, max_instructions_chars=config.max_instructions_chars,
                     max_items=config.max_job_items, max_chars=config.max_job_chars,
                     max_audio_seconds=config.max_job_audio_seconds, item_chars=config.job_item_chars)


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) past `limit` bytes: on its declared length before a byte is read,
    else as it arrives."""
    declared = request.headers.get("content-length", "")
    too_big = f"over the limit of {limit} bytes (--max-job-bytes): send fewer or shorter items, or several jobs"
    if declared.isdigit() and int(declared) > limit:
        raise ApiError("text_too_long", f"the body is {int(declared)} bytes, {too_big}", status=413)
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise ApiError("text_too_long", f"the body is more than {limit} bytes, {too_big}", status=413)
        parts.append(part)
    return b"".join(parts)


async def _parse(request: Request, body: bytes, limits: JobLimits) -> ParsedJob:
    media = (request.headers.get("content-type") or "application/json").split(";")[0].strip().lower()
    if media in JSONL_TYPES:
        return await asyncio.to_thread(parse_jsonl, body, request.query_params.get("response_format"), limits)
    if media == "application/json" or media.endswith("+json"):
        return await asyncio.to_thread(parse_json, body, limits)
    raise ApiError("invalid_request", f"Content-Type {media}: send application/json (items, or one long text as "
                   "input) or application/jsonl (one speech body a line)", status=415)


async def _check_voices(service: SynthesisService, job: ParsedJob, owner: Owner) -> None:
    """Every voice the job names exists for its owner now: a job is refused for a voice, not
    failed later (a voice deleted meanwhile fails the item that needs it)."""
    for name, field in job.voices.items():
        try:
            await service.voices.named(name, owner)
        except ServiceError as exc:
            prefix = field.removesuffix("voice")
            raise ApiError(exc.code, f"{prefix}{exc.message}", field=field if exc.field else None) from None


@post("/jobs", status_code=202, operation_id="createJob", tags=TAGS,
      **documented(404, 413, 415, 422, body=_BODY, specs={429: _TOO_MANY}))
async def create_job(request: Request, state: State, service: SynthesisService, config: ServerConfig) -> JobCreated:
    """Submit a job: many speech bodies as `items` (JSON or JSONL), or one long text as `input`;
    answered at once with its id. 404 for a voice that does not exist, 413 for a body or text over
    its limit, 422 for anything else wrong, each naming its field (`items[3].voice`); 429 when the
    caller has `--max-active-jobs` jobs not yet finished."""
    runner = _runner(state)
    if service.draining:
        raise ApiError("busy", SHUTTING_DOWN)
    try:
        parsed = await _parse(request, await _read_body(request, config.max_job_bytes), _limits(config))
    except ProtocolError as exc:
        service.reject(ENDPOINT, exc.code)
        raise ApiError(exc.code, exc.message, field=exc.field) from None
    owner = owner_of(request, config.api_keys)
    await _check_voices(service, parsed, owner)
    try:
        job_id = await asyncio.to_thread(runner.store.create, NewJob(owner, parsed.items, parsed.chained),
                                         config.max_active_jobs)
    except TooManyJobs as exc:
        raise ApiError("too_many_requests", str(exc)) from None
    runner.wake()
    log.info("job submitted", extra={"job": job_id, "items": len(parsed.items), "chained": parsed.chained,
                                     "audio_s": round(sum(item.seconds for item in parsed.items), 1)})
    return JobCreated(job_id, "queued")


def _no_job(job_id: str) -> ApiError:
    return ApiError("invalid_request", f"no job {job_id!r} (finished jobs are removed after --job-retention-hours; "
                    "a job is seen only with the API key that submitted it)", status=404)


async def _view(state: State, request: Request, config: ServerConfig, job_id: str) -> JobView:
    view = await asyncio.to_thread(_runner(state).store.view, job_id, owner_of(request, config.api_keys))
    if view is None:
        raise _no_job(job_id)
    return view


@get("/jobs/{job_id:str}", operation_id="getJob", tags=TAGS, **documented(404))
async def get_job(job_id: str, request: Request, state: State, config: ServerConfig) -> JobView:
    """A job's progress: `status` (queued, running, completed, failed, cancelled), `items_total`,
    `items_done`, `audio_seconds` made, `eta_seconds` (null until an item is done); `error` when it
    failed (the item and its error); `attempts`: claims of its items (items_total when no server
    stopped while making one)."""
    return await _view(state, request, config, job_id)


@get("/jobs/{job_id:str}/items", operation_id="listJobItems", tags=TAGS, **documented(404))
async def list_job_items(job_id: str, request: Request, state: State, config: ServerConfig,
                         offset: int = Parameter(default=0, ge=0, description="the first item listed"),
                         limit: int = Parameter(default=ITEMS_PAGE, ge=1, le=ITEMS_PAGE,
                                                description="items listed at most")) -> JobItems:
    """The job's items in order from `offset`: each one's `status` (queued, running, done, failed,
    cancelled) and, once done, its `audio_seconds`: which items `GET /v1/jobs/{id}/items/{n}`
    has ready."""
    view = await _view(state, request, config, job_id)
    items = await asyncio.to_thread(_runner(state).store.items, job_id, offset, limit)
    return JobItems(job_id, view.items_total, offset, items)


@get("/jobs/{job_id:str}/items/{n:int}", operation_id="getJobItem", tags=TAGS,
     **documented(404, ok=_ITEM, specs={409: _NOT_READY}))
async def get_job_item(job_id: str, n: int, request: Request, state: State, config: ServerConfig) -> Response:
    """Item `n`'s audio (items count from 0), in its format; 409 while it is not done yet."""
    view = await _view(state, request, config, job_id)
    if not 0 <= n < view.items_total:
        raise ApiError("invalid_request", f"items[{n}]: the job has {view.items_total} items "
                       f"(0..{view.items_total - 1})", status=404)
    store = _runner(state).store
    audio = await asyncio.to_thread(store.item_audio, job_id, n)
    if audio is None:
        listed = await asyncio.to_thread(store.items, job_id, n, 1)
        item_state = listed[0].status if listed else None
        if item_state in ("queued", "running"):
            raise ApiError("invalid_request", f"items[{n}]: not done yet ({item_state}; {view.items_done} of "
                           f"{view.items_total} done)", status=409, headers={"Retry-After": str(NOT_READY_RETRY_S)})
        raise ApiError("invalid_request", f"items[{n}]: not made (the job is {view.status})", status=404)
    name = entry_name(n, view.items_total, audio.format)
    return Response(audio.data, media_type=MEDIA_TYPES[audio.format],
                    headers={"X-Chorus-Audio-Seconds": str(audio.seconds),
                             "Content-Disposition": f'attachment; filename="{name}"'})


@get("/jobs/{job_id:str}/archive", operation_id="getJobArchive", tags=TAGS, **documented(404, ok=_ARCHIVE))
async def get_job_archive(job_id: str, request: Request, state: State, config: ServerConfig) -> Stream:
    """A zip of the job's items done so far (every item once it is completed), `0000.mp3` and on,
    written as it is sent."""
    view = await _view(state, request, config, job_id)
    store = _runner(state).store
    done = await asyncio.to_thread(store.done_items, job_id)

    async def body():
        archive = ZipStream()
        for n, fmt in done:
            audio = await asyncio.to_thread(store.item_audio, job_id, n)
            if audio is not None:  # else removed since (retention)
                yield await asyncio.to_thread(archive.add, entry_name(n, view.items_total, fmt), audio.data)
        yield archive.close()

    return Stream(body(), media_type="application/zip",
                  headers={"Content-Disposition": f'attachment; filename="{job_id}.zip"',
                           "X-Chorus-Items": f"{len(done)}/{view.items_total}"})


@delete("/jobs/{job_id:str}", status_code=200, operation_id="cancelJob", tags=TAGS, **documented(404))
async def cancel_job(job_id: str, request: Request, state: State, config: ServerConfig) -> JobView:
    """Cancel a job: items not started never run, items being made stop (on this server at once,
    on other replicas within a few seconds); items done stay. A finished job is answered as it is."""
    runner = _runner(state)
    view = await asyncio.to_thread(runner.store.cancel, job_id, owner_of(request, config.api_keys))
    if view is None:
        raise _no_job(job_id)
    runner.cancel_job(job_id)
    if view.status == "cancelled":
        log.info("job cancelled", extra={"job": job_id, "items_done": view.items_done})
    return view
