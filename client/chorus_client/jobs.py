"""Long-form jobs over HTTP (`/v1/jobs`): submit one long text, many items or a JSONL batch, follow
the job's progress, download each item's audio and a zip of them all, cancel.

A job runs in the background on the server (any replica sharing its database); the client only
asks: `submit*()` answers at once with the job (`queued`), `get()` says where it stands, and
`watch()` / `wait()` poll it until it ends. Every response is checked before it is used (a body
that is not what its route returns raises `BadResponseError`), and a job id goes into the path as
one quoted segment, as voice ids do.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import httpx

from .errors import (
    ChorusError,
    ConflictError,
    ConnectionLostError,
    InvalidRequestError,
    RequestTimeoutError,
    error_from,
)
from .voices import bad_response, http_error, json_body, send
from .wire import INT, NUMBER, TEXT, Malformed, Options, options_to_wire, typed

JOBS_PATH = "/v1/jobs"
JobStatus = Literal["queued", "running", "completed", "failed", "cancelled"]
FINISHED: frozenset[str] = frozenset({"completed", "failed", "cancelled"})
ITEMS_PAGE = 1000  # items one `GET /v1/jobs/{id}/items` lists at most


class JobNotFoundError(InvalidRequestError):
    """HTTP 404 on a job's route: no such job for this API key (never submitted, another key's,
    or removed after the server's `--job-retention-hours`)."""


class ItemNotReadyError(ConflictError):
    """HTTP 409: the item is still queued or being made (`retry_after_ms` from `Retry-After`)."""


class JobFailedError(ChorusError):
    """`wait()` on a job that failed: `job` is its last state, `error` the typed error of the item
    that failed it (`VoiceNotFoundError`, `InternalError`, ...) and `item` that item's number."""

    code = "job_failed"

    def __init__(self, job: Job):
        failure = job.error or {}
        self.error = error_from(failure) if failure else ChorusError("the job failed")
        self.item = failure.get("item") if isinstance(failure.get("item"), int) else None
        self.job = job
        super().__init__(f"job {job.id} failed: {self.error.message}", field=self.error.field,
                         payload=dict(failure))


@dataclass(frozen=True)
class JobItem:
    """One item of a job: a `/v1/audio/speech` body (`input`, `voice`, `instructions`, `language`,
    `response_format` over the job's, and the knobs of `options` at the top level)."""

    input: str
    voice: str | None = None
    instructions: str | None = None
    language: str | None = None
    response_format: str | None = None
    options: Options = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {"input": self.input}
        for name in ("voice", "instructions", "language", "response_format"):
            if (value := getattr(self, name)) is not None:
                body[name] = value
        body.update(options_to_wire(self.options) or {})
        body.update(self.extra)
        return body


@dataclass(frozen=True)
class Job:
    """A job as the server last said (`GET /v1/jobs/{id}`); right after submission only `id` and
    `status` are known. `error`, on a failed job: `{"item", "code", "message"}`."""

    id: str
    status: str
    items_total: int | None = None
    items_done: int = 0
    audio_seconds: float = 0.0
    eta_seconds: float | None = None
    attempts: int | None = None
    created_at: float | None = None
    error: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def finished(self) -> bool:
        """Completed, failed or cancelled: it will not change again."""
        return self.status in FINISHED

    @property
    def fraction(self) -> float:
        """Items done over items, 0..1 (1.0 once completed)."""
        if self.status == "completed":
            return 1.0
        return self.items_done / self.items_total if self.items_total else 0.0

    @classmethod
    def from_wire(cls, body: Any) -> Job:
        if not isinstance(body, dict):
            raise Malformed(f"a job is {type(body).__name__}, not an object")
        job_id = typed(body, "id", TEXT)
        if not job_id:
            raise Malformed("'id' is empty")
        error = typed(body, "error", (dict,), None)
        return cls(id=job_id, status=typed(body, "status", TEXT), items_total=typed(body, "items_total", INT, None),
                   items_done=typed(body, "items_done", INT, 0),
                   audio_seconds=typed(body, "audio_seconds", NUMBER, 0.0),
                   eta_seconds=typed(body, "eta_seconds", NUMBER, None), attempts=typed(body, "attempts", INT, None),
                   created_at=typed(body, "created_at", NUMBER, None), error=dict(error) if error else None, raw=body)


@dataclass(frozen=True)
class JobItemState:
    """One item as `GET /v1/jobs/{id}/items` lists it: `status` (`queued`, `running`, `done`,
    `failed`, `cancelled`) and, once done, its `format` and how long its audio plays."""

    n: int
    status: str
    format: str | None = None
    audio_seconds: float | None = None

    @property
    def ready(self) -> bool:
        """Done: `item(id, n)` has its audio."""
        return self.status == "done"

    @classmethod
    def from_wire(cls, body: Any) -> JobItemState:
        if not isinstance(body, dict):
            raise Malformed(f"an item is {type(body).__name__}, not an object")
        return cls(n=typed(body, "n", INT), status=typed(body, "status", TEXT),
                   format=typed(body, "format", TEXT, None), audio_seconds=typed(body, "audio_seconds", NUMBER, None))


@dataclass(frozen=True)
class JobAudio:
    """One item's audio: the file's bytes in the item's format (`media_type`), how long it plays."""

    job_id: str
    item: int
    data: bytes
    media_type: str
    seconds: float | None
    filename: str

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_bytes(self.data)
        return path


@dataclass(frozen=True)
class JobArchive:
    """A job's zip, written to `path`: `items` of the job's `items_total` were in it (the items
    done when it was asked for; all of them once the job completed)."""

    job_id: str
    path: Path
    bytes: int
    items: int | None
    items_total: int | None


def job_path(job_id: str, rest: str = "") -> str:
    """`/v1/jobs/{id}` with the id as one percent-quoted path segment; an id that would name
    another route (empty, `.`, `..`) is refused before anything is sent."""
    if not isinstance(job_id, str) or job_id in ("", ".", ".."):
        raise InvalidRequestError(f"job id: {job_id!r} is not a job id", field="job_id")
    return f"{JOBS_PATH}/{quote(job_id, safe='')}{rest}"


ProgressCallback = Callable[[Job], Awaitable[None] | None]


class JobsAPI:
    """The `/v1/jobs` calls (`client.jobs`); `http` gives the client's HTTP client."""

    def __init__(self, http: Callable[[], httpx.AsyncClient]):
        self._http = http

    # ---- submit

    async def submit(self, items: Iterable[JobItem | dict[str, Any] | str], *, response_format: str | None = None,
                     voice: str | None = None) -> Job:
        """A job of many items, numbered from 0 in order: each a `JobItem`, a speech body (dict),
        or a text (said in `voice`). `response_format`: the items' format (default mp3)."""
        wire = [_item_to_wire(item, voice) for item in items]
        body: dict[str, Any] = {"items": wire}
        if response_format is not None:
            body["response_format"] = response_format
        return await self._submit(json=body)

    async def submit_text(self, text: str, *, voice: str | None = None, instructions: str | None = None,
                          language: str | None = None, response_format: str | None = None,
                          options: Options = None, extra: dict[str, Any] | None = None) -> Job:
        """One long text (a chapter, an article): the server cuts it into items at paragraphs,
        then sentences, each spoken in `voice` (or, with none, in the voice its first item gets)."""
        item = JobItem(text, voice=voice, instructions=instructions, language=language,
                       response_format=response_format, options=options, extra=dict(extra or {}))
        return await self._submit(json=item.to_wire())

    async def submit_jsonl(self, lines: bytes | str | Path | Iterable[dict[str, Any]], *,
                           response_format: str | None = None) -> Job:
        """A JSONL batch: one speech body a line, or OpenAI batch lines (`{"custom_id", "method",
        "url": "/v1/audio/speech", "body"}`). `lines`: the file's bytes or text, its path, or the
        lines as dicts."""
        if isinstance(lines, Path):
            data = lines.read_bytes()
        elif isinstance(lines, bytes):
            data = lines
        elif isinstance(lines, str):
            data = lines.encode()
        else:
            data = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode()
        params = {"response_format": response_format} if response_format is not None else None
        return await self._submit(content=data, params=params, headers={"Content-Type": "application/jsonl"})

    async def _submit(self, **kwargs: Any) -> Job:
        response = await self._request("POST", JOBS_PATH, **kwargs)
        return _job(response)

    # ---- follow

    async def get(self, job_id: str) -> Job:
        return _job(await self._request("GET", job_path(job_id)))

    async def cancel(self, job_id: str) -> Job:
        """Cancel the job: items not started never run, an item being made stops; items done stay."""
        return _job(await self._request("DELETE", job_path(job_id)))

    async def watch(self, job_id: str, *, poll_s: float = 1.0) -> AsyncIterator[Job]:
        """The job each time it changes (status, items done, audio made), from now until it ends;
        polled every `poll_s` seconds. `break` to stop watching (the job goes on)."""
        last: tuple[Any, ...] | None = None
        while True:
            job = await self.get(job_id)
            key = (job.status, job.items_done, job.items_total, job.audio_seconds)
            if key != last:
                last = key
                yield job
            if job.finished:
                return
            await asyncio.sleep(poll_s)

    async def wait(self, job_id: str, *, poll_s: float = 1.0, timeout: float | None = None,
                   on_progress: ProgressCallback | None = None) -> Job:
        """Poll until the job ends; `on_progress(job)` (a function or a coroutine function) on each
        change. Returns the completed or cancelled job; a failed one raises `JobFailedError`; past
        `timeout` seconds, `RequestTimeoutError` (the job goes on)."""
        job: Job | None = None
        try:
            async with asyncio.timeout(timeout):
                async for job in self.watch(job_id, poll_s=poll_s):
                    if on_progress is not None and inspect.isawaitable(result := on_progress(job)):
                        await result
        except TimeoutError:
            where = f" ({job.items_done} of {job.items_total} items done)" if job else ""
            raise RequestTimeoutError(f"job {job_id} did not finish in {timeout:g} s{where}; it goes on") from None
        assert job is not None
        if job.status == "failed":
            raise JobFailedError(job)
        return job

    # ---- results

    async def item(self, job_id: str, n: int) -> JobAudio:
        """Item `n`'s audio (`ItemNotReadyError` while it is queued or being made)."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise InvalidRequestError(f"item: {n!r} is not an item number", field="item")
        response = await self._request("GET", job_path(job_id, f"/items/{n}"))
        seconds = None
        with contextlib.suppress(ValueError, TypeError):
            seconds = float(response.headers.get("X-Chorus-Audio-Seconds"))
        media_type = response.headers.get("Content-Type", "application/octet-stream").split(";")[0].strip()
        return JobAudio(job_id, n, response.content, media_type, seconds,
                        _filename(response, f"{n:04d}"))

    async def items(self, job_id: str, *, offset: int = 0, limit: int = ITEMS_PAGE) -> list[JobItemState]:
        """The job's items from `offset` in order, at most `limit` (1..1000): which are done
        (`ready`), queued, running, failed or cancelled."""
        for name, value, least in (("offset", offset, 0), ("limit", limit, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise InvalidRequestError(f"{name}: {value!r} is not a whole number from {least}", field=name)
        response = await self._request("GET", job_path(job_id, "/items"),
                                       params={"offset": offset, "limit": min(limit, ITEMS_PAGE)})
        body = json_body(response)
        try:
            listed = typed(body if isinstance(body, dict) else {}, "items", (list,))
            return [JobItemState.from_wire(item) for item in listed]
        except Malformed as exc:
            raise bad_response(response, f"not a job's items ({exc})") from None

    async def archive(self, job_id: str, path: str | Path) -> JobArchive:
        """The job's zip (`0000.mp3`, `0001.mp3`, ... in item order) written to `path` as it
        arrives: every item once the job completed, the items done so far before."""
        path = Path(path)
        partial = path.with_name(path.name + ".part")
        written = 0
        try:
            async with self._http().stream("GET", job_path(job_id, "/archive")) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise _job_error(response)
                with partial.open("wb") as out:
                    async for chunk in response.aiter_bytes():
                        out.write(chunk)
                        written += len(chunk)
                have, total = _items_header(response.headers.get("X-Chorus-Items"))
            os.replace(partial, path)
        except httpx.TimeoutException as exc:
            raise RequestTimeoutError(f"GET archive of {job_id}: timed out ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise ConnectionLostError(f"GET archive of {job_id}: {type(exc).__name__}: {exc}") from exc
        finally:
            partial.unlink(missing_ok=True)
        return JobArchive(job_id, path, written, have, total)

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return await send(self._http(), method, path, error=_job_error, **kwargs)


def _item_to_wire(item: JobItem | dict[str, Any] | str, voice: str | None) -> dict[str, Any]:
    if isinstance(item, JobItem):
        return item.to_wire()
    if isinstance(item, str):
        return JobItem(item, voice=voice).to_wire()
    if isinstance(item, dict):
        return dict(item)
    raise TypeError(f"a job item is a JobItem, a speech body (dict) or a text, not {type(item).__name__}")


def _job_error(response: httpx.Response) -> ChorusError:
    """The typed error of a job route's error response (a missing job, an item not ready)."""
    err = http_error(response)
    if response.status_code == 404 and type(err) is InvalidRequestError:
        return JobNotFoundError(err.message, field=err.field, status=404, payload=err.payload)
    if response.status_code == 409:
        ready = ItemNotReadyError(err.message, field=err.field, status=409, payload=err.payload)
        ready.retry_after_ms = err.retry_after_ms
        return ready
    return err


def _job(response: httpx.Response) -> Job:
    body = json_body(response)
    try:
        return Job.from_wire(body)
    except Malformed as exc:
        raise bad_response(response, f"not a job ({exc})") from None


def _filename(response: httpx.Response, fallback: str) -> str:
    match = re.search(r'filename="?([^";]+)"?', response.headers.get("Content-Disposition", ""))
    return Path(match.group(1)).name if match else fallback


def _items_header(value: str | None) -> tuple[int | None, int | None]:
    """`X-Chorus-Items: done/total`."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", value or "")
    return (int(match.group(1)), int(match.group(2))) if match else (None, None)

