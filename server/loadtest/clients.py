"""The load test's clients: each keeps a few mixed requests in flight on one WebSocket,
cancels some, and checks the protocol as frames arrive (see `server.loadtest`).

Closed loop by default (the next request goes when one ends, so the load is whatever the
server saturates at); with a rate, open loop: requests go at seeded Poisson times, so a
soak can hold a chosen share of capacity."""

from __future__ import annotations

import asyncio
import json
import random
import re
import struct
import time
from dataclasses import dataclass
from urllib.parse import quote

from server.loadtest.report import Report, rss_mb

TEXTS = [
    "Hello there.",
    "The quick brown fox jumps over the lazy dog.",
    "Streaming speech, one sentence at a time. Here is the second sentence.",
    "Numbers like 42 and names like Ada Lovelace.",
    "A longer paragraph follows. It has several sentences! Does it chunk? It may, with a low threshold.",
]
END_TYPES = ("done", "cancelled", "error")


def request_frame(rid: str, rng: random.Random, num_steps: list[int]) -> dict:
    opts: dict = {"num_step": rng.choice(num_steps), "seed": rng.randrange(1 << 32)}
    if rng.random() < 0.25:
        opts["guidance_scale"] = 0.0
    if rng.random() < 0.25:
        opts["chunk_threshold"] = 1.0
        opts["chunk_seconds"] = 2.0
    if rng.random() < 0.2:
        opts["class_temperature"] = 0.5
    msg = {"type": "synthesize", "id": rid, "text": rng.choice(TEXTS), "options": opts,
           "encoding": rng.choice(["pcm_s16le", "f32le"]), "progress": rng.random() < 0.5}
    if rng.random() < 0.3:
        msg["stream"] = "whole"
    return msg


@dataclass
class _Pending:
    t0: float
    accepted: bool = False
    next_chunk: int = 0
    final_seen: bool = False
    first_audio: float | None = None


async def run_client(index: int, url: str, deadline: float, inflight: int, cancel_rate: float,
                     num_steps: list[int], report: Report, rng: random.Random,
                     rate_per_s: float | None = None, arrivals: random.Random | None = None) -> int:
    """One client until `deadline`, then until its requests end. Closed loop without `rate_per_s`;
    with it, a sender task sends at Poisson times (`arrivals` draws the gaps) while this task
    stays the socket's only reader, at most `inflight` outstanding. Returns how many paced
    sends had to wait for a free slot (the server fell behind the rate)."""
    import websockets  # lazy: `chorus` starts without the client libraries

    pending: dict[str, _Pending] = {}
    counter = 0
    cancels: set[asyncio.Task] = set()
    sender: asyncio.Task | None = None
    recv: asyncio.Task | None = None
    freed = asyncio.Event()  # a request ended: a paced send waiting at the cap may go
    delayed = 0
    try:
        async with websockets.connect(url, max_size=None, open_timeout=60) as ws:
            ready = json.loads(await asyncio.wait_for(ws.recv(), 60))
            if ready.get("type") != "ready":
                report.violation(f"client {index}: first frame {ready.get('type')!r}, not ready")
                return delayed

            async def cancel_later(rid: str) -> None:
                await asyncio.sleep(rng.random() * 0.3)
                if rid in pending:
                    report.cancels_sent += 1
                    await ws.send(json.dumps({"type": "cancel", "id": rid}))

            async def send_one() -> None:
                nonlocal counter
                counter += 1
                rid = f"c{index}-{counter}"
                pending[rid] = _Pending(time.perf_counter())
                report.sent += 1
                await ws.send(json.dumps(request_frame(rid, rng, num_steps)))
                if rng.random() < cancel_rate:
                    task = asyncio.create_task(cancel_later(rid))
                    cancels.add(task)
                    task.add_done_callback(cancels.discard)

            async def send_paced() -> None:
                nonlocal delayed
                assert rate_per_s is not None and arrivals is not None
                loop = asyncio.get_running_loop()
                due = loop.time()
                while True:
                    due += arrivals.expovariate(rate_per_s)
                    if time.time() + (due - loop.time()) >= deadline:
                        return  # the next send time is past the deadline: stop now, not then
                    await asyncio.sleep(max(0.0, due - loop.time()))
                    if len(pending) >= inflight:
                        delayed += 1
                        while len(pending) >= inflight:
                            freed.clear()
                            try:
                                await asyncio.wait_for(freed.wait(), timeout=max(0.0, deadline - time.time()))
                            except TimeoutError:
                                return
                    if time.time() >= deadline:
                        return
                    await send_one()

            async def next_frame() -> str | bytes | None:
                """The next frame; paced, None when the sender stopped or nothing is in flight
                yet (an idle gap between sends is no hang), and the caller looks again."""
                nonlocal recv
                timeout = max(60.0, deadline + 120 - time.time())
                if sender is None:
                    try:
                        return await asyncio.wait_for(ws.recv(), timeout=timeout)
                    except TimeoutError:
                        raise TimeoutError(f"nothing for {timeout:.0f} s") from None
                if recv is None:
                    recv = asyncio.create_task(ws.recv())
                waiting = {recv} if sender.done() else {recv, sender}
                done, _ = await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if recv in done:
                    frame, recv = recv.result(), None
                    return frame
                if sender in done:
                    sender.result()  # a failed send is the connection's failure
                    return None
                if pending:
                    raise TimeoutError(f"nothing for {timeout:.0f} s")
                return None

            if rate_per_s is None:
                for _ in range(inflight):
                    await send_one()
            else:
                sender = asyncio.create_task(send_paced())
            while pending or (sender is not None and not sender.done()):
                frame = await next_frame()
                if frame is None:
                    continue
                if isinstance(frame, bytes):
                    (n,) = struct.unpack(">I", frame[:4])
                    header = json.loads(frame[4 : 4 + n])
                    state = pending.get(header["id"])
                    if state is None or not state.accepted:
                        report.violation(f"audio for {header['id']}, not an accepted request in flight")
                        continue
                    width = 2 if header["encoding"] == "pcm_s16le" else 4
                    if len(frame) - 4 - n != header["samples"] * width:
                        report.violation(f"{header['id']}: header samples != payload")
                    if header["chunk"] != state.next_chunk or state.final_seen:
                        report.violation(f"{header['id']}: chunk {header['chunk']} out of order")
                    state.next_chunk = header["chunk"] + 1
                    state.final_seen = bool(header["final"])
                    if state.first_audio is None:
                        state.first_audio = time.perf_counter()
                    continue
                msg = json.loads(frame)
                rid, kind = msg.get("id"), msg.get("type")
                state = pending.get(rid) if rid is not None else None
                if kind == "accepted":
                    if state is None or state.accepted:
                        report.violation(f"accepted for {rid}: unknown or accepted twice")
                        continue
                    state.accepted = True
                    report.accepted += 1
                elif kind == "progress":
                    if state is None or not state.accepted:
                        report.violation(f"progress for {rid} before accepted or after its end")
                elif kind in END_TYPES:
                    if state is None:
                        report.violation(f"{kind} for {rid}: not in flight (a second end?)")
                        continue
                    del pending[rid]
                    if kind == "error" and not state.accepted:
                        code = msg.get("code", "?")
                        report.refused[code] = report.refused.get(code, 0) + 1
                    else:
                        if not state.accepted:
                            if kind == "cancelled":  # cancelled before the server got to accept it
                                report.cancelled_before_accept += 1
                            else:
                                report.violation(f"{kind} for {rid} before accepted")
                        report.outcomes[kind] += 1
                        if kind == "error":
                            code = msg.get("code", "?")
                            report.errors_after_accept[code] = report.errors_after_accept.get(code, 0) + 1
                    if kind == "done":
                        if msg.get("chunks") != state.next_chunk or not state.final_seen:
                            report.violation(f"{rid}: done.chunks {msg.get('chunks')} but {state.next_chunk} "
                                             f"audio frames (final seen: {state.final_seen})")
                        report.latencies_ms.append((time.perf_counter() - state.t0) * 1000)
                        report.audio_seconds += msg.get("audio_seconds", 0.0)
                        if state.first_audio is not None:
                            report.first_audio_ms.append((state.first_audio - state.t0) * 1000)
                    if sender is not None:
                        freed.set()
                    elif time.time() < deadline:
                        await send_one()
                elif kind == "error" and rid is None:
                    report.violation(f"client {index}: an error without an id: {msg}")
                elif kind not in ("pong",):
                    report.violation(f"client {index}: unexpected frame {kind!r}")
    except Exception as exc:  # noqa: BLE001 - a dropped or hung connection is a finding: reported
        waiting = f" (waiting on {', '.join(sorted(pending))})" if pending else ""
        report.connection_errors.append(f"client {index}: {type(exc).__name__}: {exc}{waiting}"[:300])
    finally:
        for task in list(cancels):
            task.cancel()
        for task in (sender, recv):
            if task is not None:
                task.cancel()
                if task.done() and not task.cancelled():
                    task.exception()  # seen here, so not logged as never retrieved
        report.unfinished += sum(1 for s in pending.values() if s.accepted)
    return delayed


async def sample_rss(pid: int | None, report: Report, start: float, stop: asyncio.Event, every: float) -> None:
    while pid is not None and not stop.is_set():
        mb = rss_mb(pid)
        if mb is not None:
            report.rss_mb.append((time.perf_counter() - start, mb))
        try:
            await asyncio.wait_for(stop.wait(), timeout=every)
        except TimeoutError:
            pass


async def server_inflight(base_url: str, headers: dict[str, str]) -> float | None:
    """The server's `chorus_inflight_requests` gauge (None when it cannot be read)."""
    import httpx  # lazy: `chorus` starts without the client libraries

    try:
        async with httpx.AsyncClient(timeout=30) as client:
            text = (await client.get(base_url + "/metrics", headers=headers)).text
    except Exception:  # noqa: BLE001 - reported as unknown
        return None
    match = re.search(r"^chorus_inflight_requests (\S+)$", text, re.M)
    return float(match.group(1)) if match else None


async def run_load(url: str, clients: int, seconds: float, inflight: int = 2, cancel_rate: float = 0.15,
                   server_pid: int | None = None, seed: int = 0, rss_every: float = 1.0,
                   num_steps: list[int] | None = None, api_key: str | None = None,
                   rate_per_s: float | None = None) -> dict:
    """Run the load against `url` (http://HOST:PORT) and return the report. `rate_per_s`
    (requests per second over all clients) paces the clients open loop; None saturates."""
    if rate_per_s is not None and not rate_per_s > 0:
        raise ValueError(f"rate_per_s must be positive, not {rate_per_s}")
    base = url.rstrip("/")
    ws_url = base.replace("http://", "ws://").replace("https://", "wss://") + "/v1/stream"
    headers = {}
    if api_key:
        ws_url += f"?api_key={quote(api_key)}"
        headers["Authorization"] = f"Bearer {api_key}"
    num_steps = num_steps or [4, 8, 16]
    report = Report()
    start = time.perf_counter()
    deadline = time.time() + seconds
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_rss(server_pid, report, start, stop, rss_every))
    rng = random.Random(seed)
    per_client = rate_per_s / clients if rate_per_s is not None else None
    delayed = await asyncio.gather(*[
        run_client(i, ws_url, deadline, inflight, cancel_rate, num_steps, report, random.Random(rng.random()),
                   per_client, random.Random(f"{seed}/arrivals/{i}") if per_client is not None else None)
        for i in range(clients)
    ])
    duration = time.perf_counter() - start
    # the server's view: once every client has gone, nothing may be left in flight there
    left = await server_inflight(base, headers)
    for _ in range(50):
        if left is None or left == 0:
            break
        await asyncio.sleep(0.2)  # the last cancellations land at the next step
        left = await server_inflight(base, headers)
    stop.set()
    await sampler
    settings = {"clients": clients, "seconds": seconds, "inflight_per_client": inflight,
                "cancel_rate": cancel_rate, "num_steps": num_steps, "seed": seed}
    if rate_per_s is not None:
        settings["rate_per_s"] = rate_per_s
    result = report.summary(duration, settings)
    result["server_inflight_after"] = left
    if rate_per_s is not None:
        result["sends_delayed_at_cap"] = sum(delayed)
    return result
