"""The voice library over HTTP (`/v1/voices`): list, get, upload, delete."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .errors import ChorusError, ConflictError, error_from


@dataclass(frozen=True)
class Voice:
    id: str
    name: str | None
    text: str | None
    seconds: float | None
    created_at: Any = None
    kept: bool = False  # made by a request's `keep_voice`
    expires_at: Any = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> Voice:
        return cls(id=body["id"], name=body.get("name"), text=body.get("text"), seconds=body.get("seconds"),
                   created_at=body.get("created_at"), kept=bool(body.get("kept", False)),
                   expires_at=body.get("expires_at"), raw=body)


def http_error(response: httpx.Response) -> ChorusError:
    """The typed error of an HTTP error response (`{"error": {"code", "message", "field"}}`)."""
    try:
        payload = response.json().get("error") or {}
    except ValueError:
        payload = {}
    if not payload.get("code"):
        payload = {"code": "conflict" if response.status_code == 409 else "error",
                   "message": payload.get("message") or response.text or response.reason_phrase}
    err = error_from(payload, status=response.status_code)
    if response.status_code == 409 and not isinstance(err, ConflictError):
        err = ConflictError(err.message, field=err.field, status=409, payload=payload)
    retry_after = response.headers.get("Retry-After")
    if retry_after and err.retry_after_ms is None:
        with contextlib.suppress(ValueError):  # an HTTP date: no hint
            err.retry_after_ms = float(retry_after) * 1000
    return err


class VoicesAPI:
    """The `/v1/voices` calls; `http` gives the client's HTTP client (made on first use)."""

    def __init__(self, http: Callable[[], httpx.AsyncClient]):
        self._http = http

    async def list(self) -> list[Voice]:
        body = await self._json("GET", "/v1/voices")
        items = body.get("voices", body.get("data", [])) if isinstance(body, dict) else body
        return [Voice.from_wire(v) for v in items]

    async def get(self, voice_id: str) -> Voice:
        return Voice.from_wire(await self._json("GET", f"/v1/voices/{voice_id}"))

    async def upload(self, audio: bytes | str | Path, text: str, *, name: str | None = None,
                     filename: str | None = None) -> Voice:
        """Save a voice from an audio file (wav, flac, ogg or mp3) and its transcript."""
        if isinstance(audio, (str, Path)):
            filename = filename or Path(audio).name
            audio = Path(audio).read_bytes()
        data = {"text": text} if name is None else {"text": text, "name": name}
        files = {"audio": (filename or "voice.wav", audio, "application/octet-stream")}
        return Voice.from_wire(await self._json("POST", "/v1/voices", data=data, files=files))

    async def delete(self, voice_id: str) -> None:
        response = await self._http().delete(f"/v1/voices/{voice_id}")
        if response.status_code >= 400:
            raise http_error(response)

    async def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = await self._http().request(method, path, **kwargs)
        if response.status_code >= 400:
            raise http_error(response)
        return response.json()
