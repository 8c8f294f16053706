"""The client against a hostile server (`hostile_server`): whatever a faulty or hostile
server sends, the client raises a `ChorusError` (never a raw `KeyError` or
`JSONDecodeError`), holds bounded memory, never waits forever, closes what it gives up on,
and ends only the requests a bad frame concerns."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from chorus_client import (
    BadResponseError,
    BufferFullError,
    ChorusClient,
    ChorusError,
    ConnectionLostError,
    HandshakeError,
    InvalidRequestError,
    ProtocolError,
    RequestTimeoutError,
)

from tests.clients.conftest import require_framework
from tests.clients.hostile_server import (
    READY,
    HttpAnswer,
    audio_frame,
    audio_header,
    hostile_http,
    hostile_server,
    speak,
)

MiB = 1024 * 1024


def run(coro, timeout: float = 20.0):
    """Run a test's coroutine; a client that hangs fails the test instead of the run."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def send_ready(ws) -> None:
    await ws.send(json.dumps(READY))


BAD_GREETINGS = {
    "not JSON": "<html>Welcome to nginx!</html>",
    "JSON but not an object": "[1, 2]",
    "no sample_rate": json.dumps({"type": "ready", "protocol": 1, "model": "m"}),
    "sample_rate a string": json.dumps({**READY, "sample_rate": "24000"}),
    "sample_rate zero": json.dumps({**READY, "sample_rate": 0}),
    "encodings a string": json.dumps({**READY, "encodings": "pcm_s16le"}),
    "limits a list": json.dumps({**READY, "limits": [1]}),
    "binary": b"\x00\x00\x00\x02{}",
    "another frame": json.dumps({"type": "accepted", "id": "r1"}),
}


@pytest.mark.parametrize("greeting", BAD_GREETINGS.values(), ids=BAD_GREETINGS.keys())
def test_a_malformed_ready_frame_raises_a_handshake_error_and_closes_the_socket(greeting):
    async def handler(ws, server):
        await ws.send(greeting)
        await server.until_closed(ws)

    async def go():
        async with hostile_server(handler) as server:
            client = ChorusClient(server.url, reconnect_attempts=3, reconnect_backoff_s=0.01)
            with pytest.raises(HandshakeError) as info:
                await client.connect()
            closed = await server.eventually(lambda: server.close_codes == [1002], timeout=2.0)
            await client.close()
            return info.value, closed, server.connections

    err, closed, connections = run(go())
    assert isinstance(err, ProtocolError) and err.code == "bad_handshake"
    assert closed, "the client must close the socket of a bad handshake (1002) before raising"
    assert connections == 1  # the same greeting would come again: no retry


def test_a_ping_given_up_on_leaves_its_late_pong_harmless():
    """A ping cancelled by `wait_for` gets its pong after the caller left: that pong is
    dropped, the request in flight and the connection go on, and the next ping is answered
    by its own pong."""

    async def handler(ws, server):
        await send_ready(ws)
        await ws.send(json.dumps({"type": "pong"}))  # a pong nobody asked for: dropped too
        pings = 0
        async for msg in server.frames(ws):
            if msg["type"] == "ping":
                pings += 1
                delay = 0.3 if pings == 1 else 0.0  # the first pong comes after its caller gave up

                async def pong(delay=delay):
                    await asyncio.sleep(delay)
                    await ws.send(json.dumps({"type": "pong"}))

                asyncio.get_running_loop().create_task(pong())
            elif msg["type"] == "synthesize":
                async def answer(rid=msg["id"]):
                    await asyncio.sleep(0.6)  # after the late pong
                    await speak(ws, rid)

                asyncio.get_running_loop().create_task(answer())

    async def go():
        async with hostile_server(handler) as server, ChorusClient(server.url) as client:
            request = client.synthesize("Hello.")
            await request.start()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(client.ping(), 0.05)
            result = await request.collect()
            await asyncio.wait_for(client.ping(), 2.0)
            return result, client.connections_opened

    result, opened = run(go())
    assert result.done is not None and result.audio
    assert opened == 1


def test_a_ping_never_answered_times_out():
    async def handler(ws, server):
        await send_ready(ws)
        async for _ in server.frames(ws):
            pass  # no pong, ever

    async def go():
        async with hostile_server(handler) as server, ChorusClient(server.url, request_idle_timeout=0.3) as client:
            await client.connect()
            started = time.monotonic()
            with pytest.raises(RequestTimeoutError):
                await client.ping()
            return time.monotonic() - started

    assert run(go(), timeout=5.0) < 3.0


def test_a_frame_over_max_frame_bytes_ends_the_connection_and_the_next_call_reconnects():
    """A frame over the bound is refused (close 1009), never taken into memory. The default
    bound holds the largest frame a server with default limits sends (1800 s of 24 kHz f32le);
    here a client with a 1 MiB bound meets a frame of 1 MiB and 2 bytes of samples."""
    assert ChorusClient().bounds.max_frame_bytes == 192 * MiB >= 1800 * 24000 * 4
    samples = MiB // 2 + 1

    async def handler(ws, server):
        await send_ready(ws)
        first = server.connections == 1
        async for msg in server.frames(ws):
            if msg["type"] == "synthesize" and first:
                await ws.send(audio_frame(audio_header(msg["id"], samples), b"\x00\x00" * samples))
            elif msg["type"] == "synthesize":
                await speak(ws, msg["id"])

    async def go():
        async with hostile_server(handler) as server, ChorusClient(server.url, max_frame_bytes=MiB) as client:
            with pytest.raises(ConnectionLostError) as lost:
                await client.synthesize("A huge frame.").collect()
            after = await client.synthesize("A small one.").collect()
            return lost.value, after, client.connections_opened

    lost, after, opened = run(go())
    assert "max_frame_bytes" in str(lost) and "1009" in str(lost)
    assert after.done is not None and opened == 2


def test_a_request_nobody_reads_is_ended_at_max_buffered_bytes_and_the_others_go_on():
    """A request whose caller does not read is ended (`BufferFullError`), cancelled on the
    server and its unread audio dropped; another request on the connection is untouched."""
    frames, frame_samples = 24, 128 * 1024  # 24 frames of 256 KiB: 6 MiB against a 1 MiB bound

    async def handler(ws, server):
        await send_ready(ws)
        async for msg in server.frames(ws):
            if msg["type"] == "synthesize" and msg["id"] == "flood":
                for chunk in range(frames):
                    header = audio_header("flood", frame_samples, chunk=chunk, final=chunk == frames - 1)
                    await ws.send(audio_frame(header, b"\x00\x00" * frame_samples))
                await ws.send(json.dumps({"type": "done", "id": "flood", "chunks": frames, "audio_seconds": 1.0}))
            elif msg["type"] == "synthesize":
                await speak(ws, msg["id"])

    async def go():
        async with hostile_server(handler) as server, ChorusClient(server.url, max_buffered_bytes=MiB) as client:
            flood = client.synthesize("Never read until it is too late.", request_id="flood")
            await flood.start()  # sent; nobody reads it
            cancelled = await server.eventually(lambda: server.cancels() == ["flood"])
            other = await client.synthesize("Read as it comes.").collect()
            with pytest.raises(BufferFullError) as full:
                await flood.collect()
            return cancelled, other, full.value, dict(client._conn.routes), client.connections_opened

    cancelled, other, full, routes, opened = run(go())
    assert cancelled, "the flooded request must be cancelled on the server"
    assert full.request_id == "flood" and "max_buffered_bytes" in str(full)
    assert other.done is not None and opened == 1
    assert routes == {}


def test_a_cancelled_request_left_unread_is_forgotten_when_it_ends():
    """A framework that cancels a turn and stops reading it (a barge-in) leaves nothing
    behind once the server's `cancelled` comes: turn after turn, no route piles up."""

    async def handler(ws, server):
        await send_ready(ws)
        async for msg in server.frames(ws):
            if msg["type"] == "stream_open":
                await ws.send(json.dumps({"type": "accepted", "id": msg["id"], "chunks": None, "target_seconds": []}))
            elif msg["type"] == "cancel":
                await ws.send(audio_frame(audio_header(msg["id"], 240), b"\x00\x00" * 240))  # already on the wire
                await ws.send(json.dumps({"type": "cancelled", "id": msg["id"]}))

    async def go():
        async with hostile_server(handler) as server, ChorusClient(server.url) as client:
            for _ in range(5):
                stream = client.stream()
                await stream.append("An answer the user talks over. ")
                await stream.cancel()  # and never read again
            await server.eventually(lambda: len(server.cancels()) == 5)
            await asyncio.sleep(0.1)
            return dict(client._conn.routes)

    assert run(go()) == {}


def test_a_silent_request_times_out_and_is_cancelled_on_the_server():
    async def handler(ws, server):
        await send_ready(ws)
        async for msg in server.frames(ws):
            if msg["type"] == "synthesize" and msg["id"] == "silent":
                await ws.send(json.dumps({"type": "accepted", "id": "silent", "chunks": 1, "target_seconds": [1.0]}))
            elif msg["type"] == "synthesize":
                await speak(ws, msg["id"])  # then nothing more, ever

    async def go():
        async with hostile_server(handler) as server, ChorusClient(server.url, request_idle_timeout=0.5) as client:
            started = time.monotonic()
            with pytest.raises(RequestTimeoutError) as timed_out:
                await client.synthesize("Hello?", request_id="silent").collect()
            waited = time.monotonic() - started
            cancelled = await server.eventually(lambda: server.cancels() == ["silent"])
            after = await client.synthesize("Still there.").collect()
            return timed_out.value, waited, cancelled, after, client.connections_opened

    err, waited, cancelled, after, opened = run(go(), timeout=10.0)
    assert err.request_id == "silent" and 0.4 < waited < 3.0
    assert cancelled, "a timed-out request must be cancelled on the server"
    assert after.done is not None and opened == 1


def test_a_stream_whose_writer_keeps_sending_does_not_time_out():
    """The idle timeout counts frames of the request either way: a stream whose text keeps
    coming is not idle while the server waits for a sentence to end."""

    async def handler(ws, server):
        await send_ready(ws)
        async for msg in server.frames(ws):
            if msg["type"] == "stream_open":
                await ws.send(json.dumps({"type": "accepted", "id": msg["id"], "chunks": None, "target_seconds": []}))
            elif msg["type"] == "stream_close":
                await speak(ws, msg["id"])

    async def go():
        async with (hostile_server(handler) as server, ChorusClient(server.url, request_idle_timeout=0.5) as client,
                    client.stream() as stream):
            reading = asyncio.create_task(stream.collect())  # waits from the start
            for word in "one two three four five six seven".split():
                await stream.append(word + " ")
                await asyncio.sleep(0.2)  # 1.4 s in all, no frame from the server
            await stream.close()
            return await reading

    assert run(go()).done is not None


def test_connecting_to_a_server_that_never_greets_times_out():
    async def handler(ws, server):
        await ws.wait_closed()  # the WebSocket opens; no ready frame

    async def go():
        async with hostile_server(handler) as server:
            client = ChorusClient(server.url, open_timeout=0.3, reconnect_attempts=1, reconnect_backoff_s=0.01)
            started = time.monotonic()
            with pytest.raises(ConnectionLostError):
                await client.connect()
            await client.close()
            return time.monotonic() - started

    assert run(go(), timeout=10.0) < 3.0


# each a frame of request "bad" that the protocol does not allow, and what "bad" then raises
BAD_FRAMES = {
    "progress without its fields": ('{"type":"progress","id":"bad"}', ProtocolError),
    "audio samples a string": (audio_frame(audio_header("bad", 2) | {"samples": "many"}, b"\x00" * 4), ProtocolError),
    "audio sample_rate zero": (audio_frame(audio_header("bad", 2, sample_rate=0), b"\x00" * 4), ProtocolError),
    "done chunks a string": ('{"type":"done","id":"bad","chunks":"two"}', ProtocolError),
    "words not a list": ('{"type":"words","id":"bad","words":{"text":"hi"}}', ProtocolError),
    "segment without samples": ('{"type":"segment","id":"bad","segment":0,"offset_samples":0}', ProtocolError),
    "type a number": ('{"type":7,"id":"bad"}', ProtocolError),
    "error with mistyped fields": ('{"type":"error","id":"bad","code":5,"message":["x"],"retry_after_ms":"soon"}',
                                   ChorusError),
}


@pytest.mark.parametrize("frame,raised", BAD_FRAMES.values(), ids=BAD_FRAMES.keys())
def test_a_malformed_frame_ends_only_its_own_request(frame, raised):
    async def handler(ws, server):
        await send_ready(ws)
        async for msg in server.frames(ws):
            if msg["type"] == "synthesize" and msg["id"] == "bad":
                await ws.send(json.dumps({"type": "accepted", "id": "bad", "chunks": 1, "target_seconds": [1.0]}))
                await ws.send(frame)
            elif msg["type"] == "synthesize":
                async def answer(rid=msg["id"]):
                    await asyncio.sleep(0.2)  # after the bad frame
                    await speak(ws, rid)

                asyncio.get_running_loop().create_task(answer())

    async def go():
        async with hostile_server(handler) as server, ChorusClient(server.url) as client:
            good = client.synthesize("Fine.", request_id="good")
            await good.start()
            outcomes = await asyncio.gather(client.synthesize("Doomed.", request_id="bad").collect(), good.collect(),
                                            return_exceptions=True)
            await asyncio.sleep(0.05)
            return outcomes, server.cancels(), client.connections_opened

    (bad, good), cancels, opened = run(go())
    assert isinstance(bad, raised) and bad.request_id == "bad", bad
    assert not isinstance(good, BaseException) and good.done is not None, good
    assert opened == 1
    if raised is ProtocolError:
        assert cancels == ["bad"]  # the client gave up on it: the server stops too


# frames that name no request (or none that can be read): nobody can tell whose they are
UNATTRIBUTED = {
    "not JSON": "{oops",
    "JSON but not an object": '["done"]',
    "done naming no request": '{"type":"done","chunks":1}',
    "audio header naming no request": audio_frame({"type": "audio", "samples": 1}, b"\x00\x00"),
    "audio header not JSON": b"\x00\x00\x00\x03{{{",
    "audio header longer than the frame": b"\x00\x00\x01\x00{}",
    "binary shorter than its length prefix": b"\x00",
}


@pytest.mark.parametrize("frame", UNATTRIBUTED.values(), ids=UNATTRIBUTED.keys())
def test_a_frame_naming_no_request_ends_the_connection_with_a_clear_error(frame):
    async def handler(ws, server):
        await send_ready(ws)
        first = server.connections == 1
        async for msg in server.frames(ws):
            if msg["type"] == "synthesize" and first:
                await ws.send(json.dumps({"type": "accepted", "id": msg["id"], "chunks": 1, "target_seconds": [1]}))
                await ws.send(frame)
                await server.until_closed(ws)
                return
            if msg["type"] == "synthesize":
                await speak(ws, msg["id"])

    async def go():
        async with hostile_server(handler) as server, ChorusClient(server.url) as client:
            with pytest.raises(ConnectionLostError) as lost:
                await client.synthesize("Whose frame is this?").collect()
            after = await client.synthesize("A fresh connection.").collect()
            return lost.value, server.close_codes, after, client.connections_opened

    lost, codes, after, opened = run(go())
    assert "cannot read" in str(lost), lost
    assert codes == [1002]
    assert after.done is not None and opened == 2


MALFORMED_BODIES = {
    "list: HTML": ("list", 200, b"<html><body>502 Bad Gateway</body></html>"),
    "list: voices not a list": ("list", 200, b'{"voices": "none"}'),
    "list: a voice without an id": ("list", 200, b'{"voices": [{"name": "x"}]}'),
    "get: a list": ("get", 200, b"[1, 2]"),
    "get: id a number": ("get", 200, b'{"id": 5, "name": "x"}'),
    "get: seconds a string": ("get", 200, b'{"id": "v1", "seconds": "long"}'),
    "upload: empty body": ("upload", 201, b""),
    "get: error page of 5000 bytes": ("get", 500, b"<html>" + b"x" * 5000 + b"</html>"),
    "delete: error a string": ("delete", 404, b'{"error": "nope"}'),
    "delete: error body a list": ("delete", 400, b"[]"),
    "delete: error body not UTF-8": ("delete", 502, b"\xff\xfe\x00garbage"),
}


@pytest.mark.parametrize("call,status,body", MALFORMED_BODIES.values(), ids=MALFORMED_BODIES.keys())
def test_a_malformed_voice_library_body_raises_a_chorus_error_with_its_status(call, status, body):
    answer = HttpAnswer(status=status, body=body)

    async def go(url):
        async with ChorusClient(url) as client:
            calls = {"list": client.list_voices, "get": lambda: client.voices.get("v1"),
                     "upload": lambda: client.upload_voice(b"RIFF", "A clip."),
                     "delete": lambda: client.delete_voice("v1")}
            with pytest.raises(ChorusError) as info:
                await calls[call]()
            return info.value

    with hostile_http(answer) as url:
        err = run(go(url))
    assert err.status == status
    assert len(str(err)) < 400  # a short excerpt, not the body
    if status < 400:
        assert isinstance(err, BadResponseError), err


def test_a_voice_library_that_is_slow_or_gone_raises_chorus_errors():
    """An HTTP call over `http_timeout` raises `RequestTimeoutError`, a server that is not
    there `ConnectionLostError`: the voice library raises no raw `httpx` error either."""

    async def slow(url):
        async with ChorusClient(url, http_timeout=0.2) as client:
            with pytest.raises(RequestTimeoutError):
                await client.list_voices()

    with hostile_http(HttpAnswer(delay=1.0)) as url:
        run(slow(url))
        gone = url
    # the server is shut down: its port now refuses connections

    async def refused():
        async with ChorusClient(gone) as client:
            with pytest.raises(ConnectionLostError):
                await client.voices.get("v1")

    run(refused())


def test_voice_ids_go_into_the_path_as_one_quoted_segment():
    answer = HttpAnswer(status=204, body=b"")

    async def go(url):
        async with ChorusClient(url) as client:
            await client.delete_voice("../../v1/pronunciations/say-1234")
            await client.delete_voice("a b?c#d%")

    with hostile_http(answer) as url:
        run(go(url))
    assert answer.seen == [("DELETE", "/v1/voices/..%2F..%2Fv1%2Fpronunciations%2Fsay-1234"),
                           ("DELETE", "/v1/voices/a%20b%3Fc%23d%25")]


@pytest.mark.parametrize("voice_id", ["", ".", ".."])
def test_a_voice_id_that_is_no_path_segment_is_refused_before_sending(voice_id):
    """An empty id would name the list, `.` and `..` the list or the API's root."""
    answer = HttpAnswer(status=204, body=b"")

    async def go(url):
        async with ChorusClient(url) as client:
            refused = []
            for call in (client.delete_voice, client.voices.get):
                with pytest.raises(InvalidRequestError) as info:
                    await call(voice_id)
                refused.append(info.value.field)
            return refused

    with hostile_http(answer) as url:
        assert run(go(url)) == ["voice_id", "voice_id"]
    assert answer.seen == []


def test_the_plugins_map_the_new_errors():
    """Pipecat's category and LiveKit's error type for the client's own errors."""
    require_framework("pipecat")
    from chorus_client.pipecat import error_category
    from pipecat.utils.errors import ErrorCategory

    assert error_category(HandshakeError("x")) is ErrorCategory.SERVER
    assert error_category(RequestTimeoutError("x")) is ErrorCategory.CONNECTIVITY
    assert error_category(BufferFullError("x")) is ErrorCategory.APPLICATION
    require_framework("livekit")
    from chorus_client.livekit import api_error
    from livekit.agents import APITimeoutError

    assert isinstance(api_error(RequestTimeoutError("x")), APITimeoutError)
    assert api_error(BadResponseError("x")).status_code == 502
