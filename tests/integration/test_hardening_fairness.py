"""One client cannot take what every client shares: connection slots are capped per client
address (and a health probe is answered past every cap), and the request-body budget is
charged as bytes arrive (a declared `Content-Length` reserves nothing) and capped per client
address. Clients at other addresses go on being served. Other addresses are other loopback
addresses (127.0.0.2, 127.0.0.3), as a Linux loopback interface routes all of 127/8."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest
import websockets

from tests.support.raw_ws import upgrade

SAFETY_S = 120
CAP = 40  # --max-connections; a quarter of it per client address by default


def _port(server) -> int:
    return urlsplit(server.url).port


def _connect(server, source: str, timeout: float = SAFETY_S) -> socket.socket:
    s = socket.socket()
    s.bind((source, 0))
    s.settimeout(timeout)
    s.connect(("127.0.0.1", _port(server)))
    return s


def _http(source: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=SAFETY_S)


@pytest.fixture(scope="module")
def server(start_inproc, tmp_path_factory):
    s = start_inproc(tmp_path_factory.mktemp("fairness"), "--max-connections", str(CAP),
                     "--max-bodies-bytes", "32M")
    yield s
    s.stop()


def test_one_client_cannot_take_every_connection_slot(server):
    # more idle WebSockets than the cap
    held = [upgrade(_port(server), "127.0.0.2", timeout=SAFETY_S) for _ in range(CAP + 20)]
    try:
        opened = [s for s, line in held if b" 101 " in line]
        refused = [line for _, line in held if b" 503 " in line]
        assert opened and refused and len(opened) + len(refused) == len(held), [line for _, line in held][:3]
        assert len(opened) < CAP  # its own cap, below the server's
        for source in ("127.0.0.1", "127.0.0.2"):  # a probe is answered, from its address too
            with _http(source) as http:
                assert http.get(server.url + "/healthz").status_code == 200
                assert http.get(server.url + "/readyz").status_code == 200

        async def another_client() -> dict:
            async with websockets.connect(server.ws_url, host="127.0.0.1", port=_port(server),
                                          local_addr=("127.0.0.3", 0)) as ws:
                return json.loads(await ws.recv())

        assert asyncio.run(another_client())["type"] == "ready"  # a new client is served
        with _http("127.0.0.2") as http:  # past its cap, the flooding address gets only health
            r = http.post(server.url + "/v1/audio/speech", json={"input": "Hi.", "num_step": 2})
            assert r.status_code == 503 and r.json()["error"]["code"] == "busy" and r.headers["retry-after"]
    finally:
        for s, _ in held:
            s.close()
    server.wait_for(lambda: _healthy_post(server, "127.0.0.2"), "its slots given back")


def _healthy_post(server, source: str) -> bool:
    with _http(source) as http:
        return http.post(server.url + "/v1/audio/speech", json={"input": "Hi.", "num_step": 2,
                                                                 "response_format": "pcm"}).status_code == 200


def _speech_head(length: int) -> bytes:
    return (f"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def test_a_declared_length_reserves_nothing(server):
    stalled = [_connect(server, "127.0.0.2") for _ in range(8)]  # 8 x 16 MiB declared, one byte sent
    try:
        for s in stalled:
            s.sendall(_speech_head(16 * 1024 * 1024) + b"{")
        time.sleep(0.5)  # (they are read; nothing is awaited from them)
        assert _healthy_post(server, "127.0.0.1")
        with _http("127.0.0.3") as http:
            wav = http.get(server.url + "/v1/voices")  # and any other route
            assert wav.status_code == 200
    finally:
        for s in stalled:
            s.close()


def test_one_client_cannot_hold_the_whole_body_budget(server):
    """Bodies really sent and stalled: one address holds at most its share (a quarter of 32M,
    at least one largest body: 17M); another address's upload still fits."""
    ten_mib = 10 * 1024 * 1024
    first, second = _connect(server, "127.0.0.2"), _connect(server, "127.0.0.2")
    try:
        first.sendall(_speech_head(12 * 1024 * 1024) + b" " * ten_mib)  # 10 MiB held, never finished
        refused = threading.Event()

        def second_upload() -> None:  # 7 MiB more would pass the address's share
            try:
                second.sendall(_speech_head(12 * 1024 * 1024) + b" " * ten_mib)
            except OSError:
                pass  # the server answered and closed while we sent
            head = second.recv(4096)
            if b" 503 " in head.split(b"\r\n", 1)[0]:
                refused.set()

        t = threading.Thread(target=second_upload)
        t.start()
        t.join(SAFETY_S)
        assert refused.is_set()
        body = json.dumps({"input": "Hi.", "num_step": 2, "response_format": "pcm"}) + " " * ten_mib
        with _http("127.0.0.1") as http:  # 10 MiB from another address: within the budget's rest
            r = http.post(server.url + "/v1/audio/speech", content=body.encode(),
                          headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text[:300]
    finally:
        first.close()
        second.close()
