"""A hostile stand-in for `chorus serve`, to try the client against what a faulty or
hostile server can send: a real `websockets` server in the test's process whose every frame
the test scripts (malformed greetings and frames, late pongs, oversized frames, silence),
and a real HTTP server in a thread that answers the voice library's calls with the one
response a test sets (bodies that are not JSON, or JSON of the wrong shape)."""

from __future__ import annotations

import asyncio
import json
import struct
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

READY = {"type": "ready", "protocol": 1, "model": "hostile", "sample_rate": 24000, "encodings": ["pcm_s16le"],
         "sample_rates": [24000], "limits": {"max_inflight": 16}}


def audio_frame(header: dict[str, Any], payload: bytes) -> bytes:
    """A binary audio frame as the protocol lays it out: length, JSON header, samples."""
    head = json.dumps(header).encode()
    return struct.pack(">I", len(head)) + head + payload


def audio_header(rid: str, samples: int, **fields: Any) -> dict[str, Any]:
    return {"type": "audio", "id": rid, "chunk": 0, "final": True, "sample_rate": 24000, "encoding": "pcm_s16le",
            "samples": samples, **fields}


async def speak(ws: ServerConnection, rid: str, samples: int = 240) -> None:
    """A well-formed answer to one request: accepted, one audio frame, done."""
    await ws.send(json.dumps({"type": "accepted", "id": rid, "chunks": 1, "target_seconds": [0.01]}))
    await ws.send(audio_frame(audio_header(rid, samples), b"\x00\x00" * samples))
    await ws.send(json.dumps({"type": "done", "id": rid, "chunks": 1, "audio_seconds": samples / 24000,
                              "timings": {}}))


@dataclass
class HostileServer:
    """What the scripted server saw: its connections, the client's frames, close codes."""

    url: str = ""
    connections: int = 0
    received: list[dict[str, Any]] = field(default_factory=list)
    close_codes: list[int | None] = field(default_factory=list)

    def cancels(self) -> list[str]:
        return [msg.get("id") for msg in self.received if msg.get("type") == "cancel"]

    async def frames(self, ws: ServerConnection) -> AsyncIterator[dict[str, Any]]:
        """The client's frames on one connection, decoded and recorded, until it closes."""
        try:
            async for message in ws:
                msg = json.loads(message)
                self.received.append(msg)
                yield msg
        except ConnectionClosed:
            return

    async def until_closed(self, ws: ServerConnection) -> None:
        """Wait for the client to close this connection and record the code it sent."""
        await ws.wait_closed()
        self.close_codes.append(ws.close_code)

    async def eventually(self, condition: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Whether `condition` holds within `timeout` seconds (checked as the loop runs)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not condition():
            if loop.time() > deadline:
                return False
            await asyncio.sleep(0.01)
        return True


Handler = Callable[[ServerConnection, HostileServer], Awaitable[None]]


@asynccontextmanager
async def hostile_server(handler: Handler) -> AsyncIterator[HostileServer]:
    """A WebSocket server on loopback running `handler` for each connection (the server's
    base URL in `.url`) while the block runs."""
    server = HostileServer()

    async def connection(ws: ServerConnection) -> None:
        server.connections += 1
        try:
            await handler(ws, server)
        except ConnectionClosed:
            pass

    async with serve(connection, "127.0.0.1", 0) as ws_server:
        port = next(iter(ws_server.sockets)).getsockname()[1]
        server.url = f"http://127.0.0.1:{port}"
        yield server


@dataclass
class HttpAnswer:
    """The response every request gets, and the (method, raw path) of each request seen."""

    status: int = 200
    body: bytes = b"{}"
    content_type: str = "application/json"
    delay: float = 0.0  # seconds before answering
    seen: list[tuple[str, str]] = field(default_factory=list)


@contextmanager
def hostile_http(answer: HttpAnswer) -> Iterator[str]:
    """A real HTTP server on loopback, in a thread, answering everything with `answer`."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            answer.seen.append((self.command, self.path))
            time.sleep(answer.delay)
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            self.wfile.write(answer.body)

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # a client that gave up on a slow answer: nothing to report

    server = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
