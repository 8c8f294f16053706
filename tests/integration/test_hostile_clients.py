"""Clients that hold the server's resources without using them, against a real `chorus serve`
with a lowered file-descriptor limit: idle sockets past the fd limit, request lines, headers
and bodies that never finish, stalled uploads, and WebSocket clients that stop reading (also
through a shutdown). Each must cost a bounded amount for a bounded time, be refused cleanly,
and never flood the log."""

from __future__ import annotations

import json
import signal
import socket
import time

import httpx
import pytest

from tests.support.chorus_client import metric_value
from tests.support.raw_ws import connect_ws, masked_text_frame
from tests.support.serverproc import ChorusServer

FD_LIMIT = 512  # the connection cap becomes 512 - 64 (reserve) - 128 (accept burst) = 320
SAFETY_S = 120  # a socket that shows nothing within this is a hang
LONG = {"encoding": "f32le", "options": {"num_step": 2, "duration": 30.0}}  # 2.9 MB of audio


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    server = ChorusServer(tiny_checkpoint, tmp_path_factory.mktemp("hostile"),
                          "--header-timeout", "2", "--body-timeout", "3", "--send-timeout", "3",
                          "--max-bodies-bytes", "4M", "--max-outbox-bytes", "1M", "--drain-seconds", "2",
                          fd_limit=FD_LIMIT).start()
    yield server
    server.stop()


def _port(server: ChorusServer) -> int:
    return int(server.url.rsplit(":", 1)[1])


def _open(server: ChorusServer, payload: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", _port(server)), timeout=SAFETY_S)
    if payload:
        s.sendall(payload)
    return s


def _response(s: socket.socket) -> bytes:
    """Everything the server sends until it closes (raises on a hang or a reset)."""
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    s.close()
    return data


def _status(response: bytes) -> tuple[int, dict]:
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_idle_sockets_cannot_exhaust_file_descriptors(server):
    sockets = [_open(server) for _ in range(2 * FD_LIMIT)]  # bare connections, nothing sent
    r = httpx.get(server.url + "/healthz", timeout=SAFETY_S)  # while they are held: served, or a clean 503
    assert r.status_code == 200 or (r.status_code, r.json()["error"]["code"], r.headers["retry-after"]) == (
        503, "busy", "1")
    outcomes = [_status(_response(s)) for s in sockets]
    refused = [body for status, body in outcomes if status == 503]
    timed_out = [body for status, body in outcomes if status == 408]
    assert len(refused) + len(timed_out) == len(sockets)  # every one answered, none reset or hung
    assert refused and timed_out  # past the cap refused at once; the rest cut off at the header deadline
    assert all(b["error"]["code"] == "busy" for b in refused)
    assert "headers not received" in timed_out[0]["error"]["message"]
    assert httpx.get(server.url + "/healthz", timeout=SAFETY_S).status_code == 200
    log = server.log()
    assert log.count("out of system resource") + log.count("Too many open files") <= 3, log[-3000:]
    assert log.count("refusing connections") <= 3 and "Traceback" not in log


@pytest.mark.parametrize("payload", [b"GET /hea", b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: ab"])
def test_request_lines_and_headers_that_never_finish(server, payload):
    s = _open(server, payload)
    for _ in range(3):  # a header trickled a byte at a time only adds to the same deadline
        time.sleep(0.5)
        s.sendall(b"c")
    status, body = _status(_response(s))
    assert status == 408 and body["error"]["code"] == "bad_message"


def test_a_body_that_never_finishes(server):
    head = (b"POST /v1/audio/speech HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{\"input\": \"")
    status, body = _status(_response(_open(server, head)))
    assert status == 408 and "body not received" in body["error"]["message"]


def test_stalled_bodies_share_one_budget(server):
    head = ("POST /v1/voices HTTP/1.1\r\nHost: localhost\r\nContent-Type: multipart/form-data; boundary=x\r\n"
            f"Content-Length: {4 * 1024 * 1024}\r\n\r\n--x\r\n"
            'Content-Disposition: form-data; name="audio"; filename="a.wav"\r\n\r\n').encode()
    part = b"x" * (3 * 1024 * 1024)  # bodies are charged as their bytes arrive
    first = _open(server, head + part)  # holds 3 MiB of the 4 MiB budget until it finishes or times out
    time.sleep(0.5)
    second = _open(server)
    try:
        second.sendall(head + part)
    except OSError:
        pass  # refused (and closed) while it was sending
    status, body = _status(_response(second))
    assert status == 503 and body["error"]["code"] == "busy" and "request bodies" in body["error"]["message"]
    assert _status(_response(first))[0] == 408  # the stalled one ends at its body deadline...
    r = httpx.post(server.url + "/v1/audio/speech", json={"input": "Hi.", "num_step": 2}, timeout=SAFETY_S)
    assert r.status_code == 200  # ...and gives its share back


def test_a_websocket_client_that_stops_reading_is_given_up(server):
    def ended() -> float:
        return sum(metric_value(server.url, "chorus_requests_total", endpoint="stream", outcome=outcome)
                   for outcome in ("done", "cancelled", "error"))

    before = ended()
    s = connect_ws(_port(server), rcvbuf=4096)
    for i in range(6):
        s.sendall(masked_text_frame(json.dumps({"type": "synthesize", "id": f"r{i}", "text": "Hello there.",
                                                **LONG})))
    server.wait_for(lambda: "does not read what it is sent" in server.log() or "took nothing we sent" in server.log(),
                    "the server giving up on a client that does not read", timeout=SAFETY_S)
    # each of its requests ended once: done if its audio was all made and queued before the
    # server gave up, else cancelled then; none is left in flight
    server.wait_for(lambda: ended() == before + 6, "its requests ended", timeout=SAFETY_S)
    assert metric_value(server.url, "chorus_inflight_requests") == 0
    s.settimeout(SAFETY_S)
    try:  # the server closed it: reading what is left ends (in a reset or an end of stream), no hang
        while s.recv(1 << 20):
            pass
    except ConnectionResetError:
        pass
    assert httpx.get(server.url + "/healthz", timeout=SAFETY_S).status_code == 200


def test_an_http_client_that_stops_reading_is_dropped(server):
    def ended() -> float:
        return sum(metric_value(server.url, "chorus_requests_total", endpoint="speech", outcome=outcome)
                   for outcome in ("done", "cancelled", "error"))

    before = ended()
    body = json.dumps({"input": "Hello there.", "response_format": "pcm", "num_step": 2, "duration": 150.0})
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", _port(server)))  # 7 MB of audio streamed to a client that reads none of it
    s.sendall(f"POST /v1/audio/speech HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
    server.wait_for(lambda: "took nothing we sent" in server.log().rsplit("disconnected", 1)[-1],
                    "the server dropping it", timeout=SAFETY_S)
    server.wait_for(lambda: ended() == before + 1, "its request ended", timeout=SAFETY_S)
    s.close()


def test_shutdown_finishes_while_a_client_never_reads(server):
    s = connect_ws(_port(server), rcvbuf=4096)
    for i in range(6):
        s.sendall(masked_text_frame(json.dumps({"type": "synthesize", "id": f"r{i}", "text": "Hello there.",
                                                **LONG})))
    server.wait_for(lambda: "accepted request_id" in server.log().rsplit("connected", 1)[-1], "accepted")
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=SAFETY_S) == 0  # one signal is enough, whoever is connected
    assert "drained" in server.log()
    s.close()
