"""`ChorusClient`: one object for the WebSocket (synthesize, text streams, dialogues, ping),
the HTTP voice library and the long-form jobs (`client.jobs`) of one Chorus server.

The WebSocket opens on first use and is shared by every request and stream (the HTTP client
is made on the first voice-library call); if it closes, the requests in flight fail with
`ConnectionLostError` and the next call opens a new one (`reconnect_attempts` tries,
`reconnect_backoff_s` doubling between them).

What a server can make the client hold or wait for is bounded (`max_frame_bytes`,
`max_buffered_bytes`, `open_timeout`, `request_idle_timeout`: docs/clients.md, "Limits and
timeouts"), so a faulty or hostile server fails requests with typed errors instead of
hanging them or filling memory.

A request or stream turn the server refuses `busy` with `retry_after_ms` is sent again after
the hint plus jitter, within a total wait (`busy_retry`, a `BusyRetry`; None: never), before
any of its audio reached the caller (docs/clients.md, "Retries").
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from websockets.exceptions import InvalidHandshake, InvalidStatus

from .connection import Bounds, Connection
from .errors import ChorusError, ConnectionLostError, ProtocolError, UnauthorizedError
from .events import Ready
from .jobs import JobsAPI
from .requests import Dialogue, Synthesis, TextStream
from .retry import DEFAULT_BUSY_RETRY, BusyRetry
from .voices import Voice, VoicesAPI
from .wire import LineSpec, Options, Reference, dialogue_frame, request_frame

STREAM_PATH = "/v1/stream"


def split_url(url: str) -> tuple[str, str]:
    """(http base, WebSocket URL) from either form: `http://host:8000`, `ws://host:8000/v1/stream`."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    secure = parts.scheme in ("https", "wss")
    path = parts.path.rstrip("/")
    if path.endswith(STREAM_PATH):
        path = path[: -len(STREAM_PATH)]
    http = urlunsplit(("https" if secure else "http", parts.netloc, path, "", ""))
    ws = urlunsplit(("wss" if secure else "ws", parts.netloc, path + STREAM_PATH, "", ""))
    return http, ws


class ChorusClient:
    def __init__(self, url: str = "http://127.0.0.1:8000", *, api_key: str | None = None,
                 open_timeout: float = Bounds.open_timeout, http_timeout: float = 120.0, reconnect_attempts: int = 3,
                 reconnect_backoff_s: float = 0.2, request_idle_timeout: float | None = Bounds.request_idle_timeout,
                 max_frame_bytes: int = Bounds.max_frame_bytes, max_buffered_bytes: int = Bounds.max_buffered_bytes,
                 busy_retry: BusyRetry | None = DEFAULT_BUSY_RETRY):
        """`url`: the server's base URL or its WebSocket URL. `open_timeout`: seconds to connect
        and get `ready`; `request_idle_timeout`: seconds a request may go without a frame of
        its own while its caller waits (None: no limit); `max_frame_bytes`: the largest frame
        taken from the server; `max_buffered_bytes`: a request's unread events held at most;
        `http_timeout`: each voice-library and jobs call; `busy_retry`: how a request refused `busy`
        with `retry_after_ms` is tried again (None: `BusyError` at once)."""
        self.http_url, self.ws_url = split_url(url)
        self.api_key = api_key if api_key is not None else os.environ.get("CHORUS_API_KEY")
        self.bounds = Bounds(max_frame_bytes=max_frame_bytes, max_buffered_bytes=max_buffered_bytes,
                             request_idle_timeout=request_idle_timeout, open_timeout=open_timeout)
        self.reconnect_attempts = reconnect_attempts
        self.reconnect_backoff_s = reconnect_backoff_s
        self.busy_retry = busy_retry
        self._rng = random.Random()  # the retries' jitter
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._headers = headers
        self._http_timeout = http_timeout
        self._http: httpx.AsyncClient | None = None
        self.voices = VoicesAPI(self._http_client)
        self.jobs = JobsAPI(self._http_client)  # long-form work: submit, watch, wait, item, archive, cancel
        self._conn: Connection | None = None
        self._connect_lock = asyncio.Lock()
        self._ids = itertools.count(1)
        self.connections_opened = 0

    async def __aenter__(self) -> ChorusClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    @property
    def open_timeout(self) -> float:
        """Seconds to connect and get the server's `ready` (each attempt)."""
        return self.bounds.open_timeout

    @open_timeout.setter
    def open_timeout(self, seconds: float) -> None:
        self.bounds = replace(self.bounds, open_timeout=seconds)

    @property
    def ready(self) -> Ready | None:
        """The server's `ready` greeting of the current connection (None before connecting)."""
        return self._conn.ready if self._conn else None

    async def connect(self) -> Ready:
        """Open the WebSocket now (otherwise the first request does); returns `ready`."""
        return (await self._connection()).ready

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def ping(self) -> None:
        """Send a `ping` and wait for its `pong` (`RequestTimeoutError` after
        `request_idle_timeout`). Cancelling it is safe: its late pong is dropped."""
        await (await self._connection()).ping()

    def synthesize(self, text: str, *, voice: str | None = None, reference: Reference | dict | None = None,
                   instruct: str | None = None, language: str | None = None, encoding: str | None = None,
                   sample_rate: int | None = None, stream: str | None = None, progress: bool = False,
                   options: Options = None, timestamps: str | None = None, keep_voice: bool | None = None,
                   request_id: str | None = None, extra: dict[str, Any] | None = None) -> Synthesis:
        """One utterance. Iterate the result (`async for event in ...`) for `Accepted`,
        `Progress`, `AudioChunk`, `Words`, then `Done` or `Cancelled`; a server error raises
        its `ChorusError`. `await ....collect()` gathers it all."""
        rid = request_id or f"r{next(self._ids)}"
        frame = request_frame("synthesize", rid, text=text, voice=voice, reference=reference, instruct=instruct,
                              language=language, encoding=encoding, sample_rate=sample_rate, stream=stream,
                              progress=progress, options=options, timestamps=timestamps, keep_voice=keep_voice,
                              extra=extra)
        return Synthesis(self._connection, rid, frame, sample_rate, self.busy_retry, self._rng)

    def stream(self, *, text: str | None = None, voice: str | None = None, reference: Reference | dict | None = None,
               instruct: str | None = None, language: str | None = None, encoding: str | None = None,
               sample_rate: int | None = None, progress: bool = False, options: Options = None,
               timestamps: str | None = None, keep_voice: bool | None = None, request_id: str | None = None,
               extra: dict[str, Any] | None = None) -> TextStream:
        """A text stream: `async with client.stream(...) as s: await s.append(...)`."""
        rid = request_id or f"s{next(self._ids)}"
        frame = request_frame("stream_open", rid, text=text, voice=voice, reference=reference, instruct=instruct,
                              language=language, encoding=encoding, sample_rate=sample_rate, progress=progress,
                              options=options, timestamps=timestamps, keep_voice=keep_voice, extra=extra)
        return TextStream(self._connection, rid, frame, sample_rate, self.busy_retry, self._rng)

    def dialogue(self, lines: list[LineSpec], *, pause_ms: int | None = None, language: str | None = None,
                 encoding: str | None = None, sample_rate: int | None = None, progress: bool = False,
                 options: Options = None, timestamps: str | None = None, request_id: str | None = None,
                 extra: dict[str, Any] | None = None) -> Dialogue:
        """A script of several speakers as one request: `lines` of `DialogueLine(text, voice=,
        instruct=, options=)` (or `(voice, text)` pairs, or the protocol's dicts), every line
        synthesised at once and heard in order with `pause_ms` of silence between lines
        (the server's default: 300). Iterate it for `Line`, `Progress`, `AudioChunk`, `Words`,
        then `Done` or `Cancelled`; `await ....collect()` gathers it all."""
        rid = request_id or f"d{next(self._ids)}"
        frame = dialogue_frame(rid, list(lines), pause_ms=pause_ms, language=language, encoding=encoding,
                               sample_rate=sample_rate, progress=progress, options=options, timestamps=timestamps,
                               extra=extra)
        return Dialogue(self._connection, rid, frame, sample_rate, self.busy_retry, self._rng)

    async def list_voices(self) -> list[Voice]:
        return await self.voices.list()

    async def upload_voice(self, audio: bytes | str | Path, text: str, *, name: str | None = None) -> Voice:
        return await self.voices.upload(audio, text, name=name)

    async def delete_voice(self, voice_id: str) -> None:
        await self.voices.delete(voice_id)

    def _http_client(self) -> httpx.AsyncClient:
        """The HTTP client, made on first use: a caller that only streams (an agent, each of
        the agents benchmark's hundreds) never builds its connection pool and TLS context."""
        if self._http is None:
            self._http = httpx.AsyncClient(base_url=self.http_url, headers=self._headers, timeout=self._http_timeout)
        return self._http

    async def _connection(self) -> Connection:
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn
        async with self._connect_lock:
            if self._conn is not None and not self._conn.closed:
                return self._conn
            self._conn = await self._open()
            self.connections_opened += 1
            return self._conn

    async def _open(self) -> Connection:
        delay = self.reconnect_backoff_s
        for attempt in range(self.reconnect_attempts + 1):
            try:
                return await Connection.open(self.ws_url, self._headers, self.bounds)
            except InvalidStatus as exc:
                if exc.response.status_code in (401, 403):
                    raise UnauthorizedError(f"the server refused the connection ({exc.response.status_code})",
                                            status=exc.response.status_code) from exc
                failure: Exception = exc
            except (UnauthorizedError, ProtocolError):  # the same answer again: no retry
                raise
            except (OSError, TimeoutError, InvalidHandshake, ChorusError) as exc:
                failure = exc
            if attempt < self.reconnect_attempts:
                await asyncio.sleep(delay)
                delay *= 2
        raise ConnectionLostError(f"could not connect to {self.ws_url}: {failure}")
