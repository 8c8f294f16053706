"""Graceful shutdown of a real `chorus serve` under load: on SIGTERM readiness goes false,
new work gets `busy` (HTTP 503 + Retry-After), requests in flight finish during the drain,
what outlasts it (its deadline, or a second signal) ends with `cancelled`, every WebSocket
is then closed (1001), and the process exits 0.

No time margin decides anything here: the work that must outlast the drain is held in the
engine until it is cancelled (`tests.support.held_server`, `tests.support.hold_gate`), so it can never
finish first, and the drain that must let short work finish is 600 s long and ended by the
test itself, with a second signal, once it has seen that work finish."""

from __future__ import annotations

import asyncio
import signal
import threading

import httpx
import pytest
import websockets

from tests.support.chorus_client import END_TYPES, Audio, Session
from tests.support.hold_gate import HOLD
from tests.support.serverproc import ChorusServer

HELD = {"options": {"num_step": 8}, "progress": False}  # its text carries HOLD: it never ends by itself
SHORT = {"options": {"num_step": 2}, "progress": False}
NO_HANG_S = 120  # a frame that does not come within this is a hang


class Client:
    """One connection that keeps sending until the server closes it, recording every end."""

    def __init__(self, index: int):
        self.index = index
        self.accepted: set[str] = set()
        self.ends: dict[str, dict] = {}
        self.refused: list[dict] = []
        self.close_code: int | None = None
        self.sent = 0
        self.held_accepted = asyncio.Event()
        self.refused_once = asyncio.Event()

    async def run(self, url: str, stop_sending: asyncio.Event) -> None:
        s = await Session.open(url)
        pending: set[str] = set()

        async def send(kind: str) -> None:
            self.sent += 1
            rid = f"{kind}{self.sent}"
            pending.add(rid)
            text = f"Hello there, {HOLD}." if kind == "h" else "Hello there."
            try:
                await s.send({"type": "synthesize", "id": rid, "text": text, **(HELD if kind == "h" else SHORT)})
            except websockets.ConnectionClosed:
                pending.discard(rid)  # closed meanwhile: read what is still buffered

        await send("h")
        await send("s")
        try:
            while True:
                frame = await asyncio.wait_for(s.next_frame(), timeout=NO_HANG_S)
                if isinstance(frame, Audio):
                    continue
                rid, kind = frame.get("id"), frame["type"]
                if kind == "accepted":
                    self.accepted.add(rid)
                    if rid.startswith("h"):
                        self.held_accepted.set()
                elif kind in END_TYPES and rid in pending:
                    pending.discard(rid)
                    if kind == "error" and rid not in self.accepted:
                        self.refused.append(frame)
                        self.refused_once.set()
                        await asyncio.sleep(0.2)  # refused during the drain: do not hammer
                    else:
                        assert rid not in self.ends, f"two ends for {rid}"
                        self.ends[rid] = frame
                    if rid.startswith("s") or stop_sending.is_set():
                        await send("s")  # keep short work coming, during the drain too
        except websockets.ConnectionClosed as exc:
            self.close_code = exc.rcvd.code if exc.rcvd else None


def sigterm_mid_load(server: ChorusServer, clients: int = 6) -> tuple[list[Client], dict, dict]:
    seen: dict = {}

    async def go():
        stop = asyncio.Event()
        crowd = [Client(i) for i in range(clients)]
        tasks = [asyncio.create_task(c.run(server.ws_url, stop)) for c in crowd]
        await asyncio.wait_for(asyncio.gather(*(c.held_accepted.wait() for c in crowd)), NO_HANG_S)
        # an HTTP request streaming when the signal comes (its first chunk is out): it finishes
        speech: dict = {}
        streaming = threading.Event()

        def call() -> None:
            body = {"input": " ".join(["One more. And two. And three."] * 4), "num_step": 4,
                    "chunk_threshold": 0, "chunk_seconds": 1, "response_format": "pcm"}
            try:
                with httpx.stream("POST", server.url + "/v1/audio/speech", json=body, timeout=NO_HANG_S) as r:
                    speech["status"] = r.status_code
                    streaming.set()
                    speech["body"] = r.read()
            except Exception as exc:  # noqa: BLE001 - a body cut short shows here
                speech["error"] = repr(exc)
            finally:
                streaming.set()

        thread = threading.Thread(target=call)
        thread.start()
        assert await asyncio.to_thread(streaming.wait, NO_HANG_S)
        server.send_signal(signal.SIGTERM)
        stop.set()
        async with httpx.AsyncClient(timeout=30) as http:
            for _ in range(200):  # readiness goes false at once; wait until it has
                seen["readyz"] = (await http.get(server.url + "/readyz")).status_code
                if seen["readyz"] == 503:
                    break
                await asyncio.sleep(0.05)
            late = await http.post(server.url + "/v1/audio/speech", json={"input": "Too late."})
            seen["late"] = (late.status_code, late.headers.get("retry-after"), late.json()["error"]["code"])
        # The drain lasts until the second signal: every client is refused new work, and the
        # HTTP stream (no work is held that it waits on) finishes, all during the drain.
        await asyncio.wait_for(asyncio.gather(*(c.refused_once.wait() for c in crowd)), NO_HANG_S)
        await asyncio.to_thread(thread.join, NO_HANG_S)
        seen["running_after_stream"] = server.running()
        server.send_signal(signal.SIGINT)  # what is left (the held requests) is cancelled now
        await asyncio.wait_for(asyncio.gather(*tasks), NO_HANG_S)
        return crowd, speech

    crowd, speech = asyncio.run(go())
    seen["exit"] = server.wait(timeout=NO_HANG_S)
    return crowd, seen, speech


@pytest.fixture
def server(tiny_checkpoint, tmp_path, request):
    s = ChorusServer(tiny_checkpoint, tmp_path, *request.param, module="tests.support.held_server").start()
    yield s
    s.stop()


@pytest.mark.parametrize("server", [("--drain-seconds", "600")], indirect=True)
def test_sigterm_mid_load_every_request_ends_and_the_process_exits_0(server):
    crowd, seen, speech = sigterm_mid_load(server)
    assert seen["exit"] == 0, server.log()[-3000:]
    assert seen["readyz"] == 503
    assert seen["late"] == (503, "1", "busy")
    assert seen["running_after_stream"]  # the stream finished inside the drain, not after it
    assert "error" not in speech and speech["status"] == 200 and len(speech["body"]) > 0, speech
    outcomes: dict[str, dict[str, int]] = {"h": {}, "s": {}}
    for c in crowd:
        assert c.close_code == 1001, c.index
        assert set(c.ends) == c.accepted, f"client {c.index}: accepted but never ended: {c.accepted - set(c.ends)}"
        for rid, end in c.ends.items():
            assert end["type"] in ("done", "cancelled"), end
            kind = outcomes[rid[0]]
            kind[end["type"]] = kind.get(end["type"], 0) + 1
        assert c.refused and all(f["code"] == "busy" for f in c.refused), c.refused
    # the held requests outlast the drain and are cancelled; short ones finish, during the drain too
    assert outcomes["h"] == {"cancelled": len(crowd)}
    assert outcomes["s"].get("done", 0) >= len(crowd) and outcomes["s"].get("cancelled", 0) == 0
    log = server.log()
    assert "SIGTERM: shutting down" in log and "SIGINT again: cancelling what is left" in log
    assert "Traceback" not in log


@pytest.mark.parametrize("server", [("--drain-seconds", "1")], indirect=True)
def test_the_drain_deadline_cancels_what_is_left(server):
    async def go():
        s = await Session.open(server.ws_url)
        await s.synthesize("h", f"Hello there, {HOLD}.", **HELD)
        await s.wait_for("h", "accepted")
        await s.synthesize("s", "Hello there.", **SHORT)
        done = await asyncio.wait_for(s.collect(["s"]), NO_HANG_S)
        server.send_signal(signal.SIGTERM)  # a 1 s drain: the held request cannot finish in it
        out = await asyncio.wait_for(s.collect(["h"]), NO_HANG_S)
        with pytest.raises(websockets.ConnectionClosed) as info:
            await asyncio.wait_for(s.next_frame(), NO_HANG_S)
        return done["s"].end["type"], out["h"].end, info.value.rcvd.code

    short, end, code = asyncio.run(go())
    assert short == "done"
    assert (end["type"], end["id"], code) == ("cancelled", "h", 1001)
    assert end["reason"].startswith("shutdown: ")  # the client did not ask for it: told why
    assert server.wait(timeout=NO_HANG_S) == 0
    log = server.log()
    assert "drain deadline passed" in log and "SIGINT" not in log and "Traceback" not in log
