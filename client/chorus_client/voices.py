"""The voice library over HTTP (`/v1/voices`): list, get, upload, delete.

Every response is checked before it is used: a body that is not the JSON its route returns
raises `BadResponseError` with the status and the start of the body, and an id goes into
the path as one quoted segment, so no id can name another route.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from .errors import (
    BadResponseError,
    ChorusError,
    ConflictError,
    ConnectionLostError,
    InvalidRequestError,
    RequestTimeoutError,
    error_from,
)
from .wire import NUMBER, TEXT, Malformed, typed

VOICES_PATH = "/v1/voices"


@dataclass(frozen=True)
class Voice:
    id: str
    name: str | None
    text: str | None
    seconds: float | None
    created_at: Any = None
    builtin: bool = False  # one of OpenAI's names (alloy...): made by the server, not deletable
    kept: bool = False  # made by a request's `keep_voice`
    expires_at: Any = None  # unix seconds, when a kept voice goes (None for the others)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_wire(cls, body: Any) -> Voice:
        """A voice object of the API; `Malformed` when it is not one (no id, a field of the wrong type)."""
        if not isinstance(body, dict):
            raise Malformed(f"a voice is {type(body).__name__}, not an object")
        voice_id = typed(body, "id", TEXT)
        if not voice_id:
            raise Malformed("'id' is empty")
        return cls(id=voice_id, name=typed(body, "name", TEXT, None), text=typed(body, "text", TEXT, None),
                   seconds=typed(body, "seconds", NUMBER, None), created_at=body.get("created_at"),
                   builtin=typed(body, "builtin", (bool,), False), kept=typed(body, "kept", (bool,), False),
                   expires_at=body.get("expires_at"), raw=body)


def voice_path(voice_id: str) -> str:
    """`/v1/voices/{id}` with the id as one percent-quoted path segment: `../x` or `a/b` stay
    inside the voice's own route. An id that would resolve to another path (empty, `.`,
    `..`) is refused before anything is sent."""
    if not isinstance(voice_id, str) or voice_id in ("", ".", ".."):
        raise InvalidRequestError(f"voice id: {voice_id!r} is not a voice id", field="voice_id")
    return f"{VOICES_PATH}/{quote(voice_id, safe='')}"


def excerpt(text: str, limit: int = 160) -> str:
    """The start of a body on one line, for an error message."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def bad_response(response: httpx.Response, problem: str) -> BadResponseError:
    """The error of a response whose body is not what its route returns."""
    try:
        where = f" {response.request.method} {response.request.url.path}"
    except RuntimeError:  # a response made without its request
        where = ""
    return BadResponseError(f"HTTP {response.status_code}{where}: {problem}; body: {excerpt(response.text)!r}",
                            status=response.status_code)


def http_error(response: httpx.Response) -> ChorusError:
    """The typed error of an HTTP error response (`{"error": {"code", "message", "field"}}`);
    a body of another shape still gives a `ChorusError` with the status and its start."""
    try:
        body = response.json()
    except (ValueError, RecursionError):
        body = None
    payload = body.get("error") if isinstance(body, dict) else None
    if not isinstance(payload, dict) or not isinstance(payload.get("code"), str) or not payload["code"]:
        message = payload.get("message") if isinstance(payload, dict) else None
        payload = {"code": "conflict" if response.status_code == 409 else "error",
                   "message": message if isinstance(message, str) and message
                   else excerpt(response.text) or response.reason_phrase}
    err = error_from(payload, status=response.status_code)
    if response.status_code == 409 and not isinstance(err, ConflictError):
        err = ConflictError(err.message, field=err.field, status=409, payload=payload)
    retry_after = response.headers.get("Retry-After")
    if retry_after and err.retry_after_ms is None:
        with contextlib.suppress(ValueError):  # an HTTP date: no hint
            seconds = float(retry_after)
            if math.isfinite(seconds) and seconds >= 0:
                err.retry_after_ms = seconds * 1000
    return err


class VoicesAPI:
    """The `/v1/voices` calls; `http` gives the client's HTTP client (made on first use)."""

    def __init__(self, http: Callable[[], httpx.AsyncClient]):
        self._http = http

    async def list(self) -> list[Voice]:
        response = await self._request("GET", VOICES_PATH)
        body = json_body(response)
        items = body.get("voices", body.get("data")) if isinstance(body, dict) else body
        if not isinstance(items, list):
            raise bad_response(response, "not a list of voices")
        return [_voice(response, item) for item in items]

    async def get(self, voice_id: str) -> Voice:
        response = await self._request("GET", voice_path(voice_id))
        return _voice(response, json_body(response))

    async def upload(self, audio: bytes | str | Path, text: str, *, name: str | None = None,
                     filename: str | None = None) -> Voice:
        """Save a voice from an audio file (wav, flac, ogg or mp3) and its transcript."""
        if isinstance(audio, (str, Path)):
            filename = filename or Path(audio).name
            audio = Path(audio).read_bytes()
        data = {"text": text} if name is None else {"text": text, "name": name}
        files = {"audio": (filename or "voice.wav", audio, "application/octet-stream")}
        response = await self._request("POST", VOICES_PATH, data=data, files=files)
        return _voice(response, json_body(response))

    async def delete(self, voice_id: str) -> None:
        await self._request("DELETE", voice_path(voice_id))

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return await send(self._http(), method, path, **kwargs)


async def send(http: httpx.AsyncClient, method: str, path: str, *,
               error: Callable[[httpx.Response], ChorusError] | None = None, **kwargs: Any) -> httpx.Response:
    """One HTTP call; its failures as `ChorusError`s: the server's error (`error(response)`, else
    `http_error`), a timeout (`RequestTimeoutError`), an unreachable server (`ConnectionLostError`)."""
    try:
        response = await http.request(method, path, **kwargs)
    except httpx.TimeoutException as exc:
        raise RequestTimeoutError(f"{method} {path}: timed out ({type(exc).__name__})") from exc
    except httpx.TransportError as exc:
        raise ConnectionLostError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
    if response.status_code >= 400:
        raise (error or http_error)(response)
    return response


def json_body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except (ValueError, RecursionError):  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise bad_response(response, "not JSON") from None


def _voice(response: httpx.Response, body: Any) -> Voice:
    try:
        return Voice.from_wire(body)
    except Malformed as exc:
        raise bad_response(response, f"not a voice ({exc})") from None

