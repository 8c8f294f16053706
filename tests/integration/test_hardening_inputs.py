"""Text a client controls never breaks what the server builds from it: the
ignored-instructions header stays a valid header whatever the instructions (the finished
audio is never dropped by it), a `Host` with a bad port is refused (400), never a 500, an
unknown route answers an evil `Host` 403 (it learns no route), and ids are matched whole
(an id ending in a newline would split the server's log lines)."""

from __future__ import annotations

import asyncio
import json
import socket
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.chorus_client import Session

NO_HANG_S = 120


@pytest.mark.parametrize("instructions", ["a" * 999 + " b", "female, " * 500, "x\x01y, tab\there, é, " * 40])
def test_the_ignored_instructions_header_is_always_valid(chorus_server, instructions):
    r = httpx.post(chorus_server.url + "/v1/audio/speech", timeout=NO_HANG_S,
                   json={"input": "Hi.", "instructions": instructions, "num_step": 2, "response_format": "pcm"})
    assert r.status_code == 200 and len(r.content) > 0, r.text[:300]
    value = r.headers["x-chorus-ignored-instructions"]
    assert value and value == value.strip() and len(value) <= 1000
    assert all(32 <= ord(c) < 127 for c in value), value


def _raw_get(url: str, path: str, host: bytes) -> tuple[int, dict]:
    addr = urlsplit(url)
    with socket.create_connection((addr.hostname, addr.port), timeout=NO_HANG_S) as s:
        s.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body) if body.startswith(b"{") else {}


@pytest.mark.parametrize("path", ["/no-such-route", "/healthz", "/v1/voices"])
@pytest.mark.parametrize("host", [b"localhost:evil", b"127.0.0.1:99999", b"[::1", b"localhost:80:80"])
def test_a_host_with_a_bad_port_is_refused_not_a_failure(chorus_server, host, path):
    before = len(chorus_server.log())  # the shared server's log: only what this request wrote
    status, body = _raw_get(chorus_server.url, path, host)
    assert status == 400 and body["error"]["code"] == "bad_message", (status, body)
    assert "Traceback" not in chorus_server.log()[before:]


def test_an_evil_host_learns_no_route(chorus_server):
    port = urlsplit(chorus_server.url).port
    status, body = _raw_get(chorus_server.url, "/no-such-route", f"attacker.example:{port}".encode())
    assert status == 403 and body["error"]["code"] == "unauthorized", (status, body)
    status, body = _raw_get(chorus_server.url, "/no-such-route", f"localhost:{port}".encode())
    assert status == 404 and "no such route" in body["error"]["message"]


@pytest.mark.parametrize("kind", ["synthesize", "stream_open", "cancel", "stream_append"])
@pytest.mark.parametrize("bad_id", ["a\n", "a\r\n", "a\nb"])
def test_an_id_is_matched_whole(chorus_server, kind, bad_id):
    frame = {"type": kind, "id": bad_id}
    if kind == "synthesize":
        frame.update(text="Hi.", options={"num_step": 2})
    if kind == "stream_append":
        frame.update(text="Hi.")

    async def go():
        s = await Session.open(chorus_server.ws_url)
        await s.send(frame)
        await s.send({"type": "ping"})
        seen = []
        while not seen or seen[-1]["type"] != "pong":
            got = await asyncio.wait_for(s.next_frame(), NO_HANG_S)
            if isinstance(got, dict):
                seen.append(got)
        await s.close()
        return seen

    seen = asyncio.run(go())
    assert [(f["type"], f.get("code"), f.get("field")) for f in seen] == [
        ("error", "invalid_request", "id"), ("pong", None, None)], seen
