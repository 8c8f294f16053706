"""Server-level scenarios of `chorus bench`: a real `chorus serve` driven over a WebSocket.

What a listener gets is measured where the listener is: a `websockets` client on loopback
times each request from sending its frame to receiving its first audio frame and `done`,
and keeps the engine's own timings from `done` beside them (the difference is what the
server adds: parsing, the event loop, framing, the socket).

- `single`: one 10 s line at a time, nothing else running;
- `long`: a 60 s paragraph, chunk streaming, with default chunking and with fast start;
- `throughput`: the 256 mix spread over 16 connections, all sent at once;
- `loaded`: Poisson arrivals of 10 s lines at 70% of the measured throughput, with what the
  server's steps did meanwhile (`StepWatch`, below) and each request's wait for its first step.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

from bench.metrics import stats
from bench.mixes import FRAME_RATE, RequestSpec, long_paragraph, make_text, poisson_arrivals

# ---- what the server's steps did during a scenario ----------------------------------------
#
# What a running server's engines did during a window, from its `/metrics`.
#
# A server-level scenario sees requests from the client's side; this says what the steps looked
# like meanwhile: how many ran, how much of the window the device spent inside a step, a step's
# mean device time beside the mean launch-to-launch interval of back-to-back steps (the
# difference is host time between steps that the device waited for: scheduling, admission,
# settling, the interpreter shared with decoding and the event loop), their mean packed tokens,
# and the share of steps too large for a CUDA graph. `/metrics` copies each engine's recent step
# records into its histograms when it is read, and an engine keeps only the last 4096, so
# `StepWatch` reads it every couple of seconds.

GRAPH_MAX_TOKENS = 8192  # the largest CUDA graph bucket by default (server/engine/model/cuda_graphs.py)


@dataclass(frozen=True)
class StepTotals:
    """Cumulative step figures of all engines, at one reading."""

    at: float  # perf_counter seconds
    steps: float
    step_seconds: float  # summed device time of the steps observed so far
    observed: float  # steps observed into the histograms (lags `steps` by the unread log)
    tokens: float
    over_graph: float  # observed steps above the graph limit's packed tokens
    interval_seconds: float = 0.0  # summed launch-to-launch intervals of back-to-back steps
    intervals: float = 0.0


# `/metrics` samples summed into StepTotals' fields (besides the packed-tokens histogram's bucket)
SAMPLES = {
    "chorus_steps_total": "steps",
    "chorus_step_seconds_sum": "step_seconds",
    "chorus_step_seconds_count": "observed",
    "chorus_packed_tokens_per_step_sum": "tokens",
    "chorus_packed_tokens_per_step_count": "tokens_count",
    "chorus_step_interval_seconds_sum": "interval_seconds",
    "chorus_step_interval_seconds_count": "intervals",
}


def parse_totals(text: str, at: float, graph_max_tokens: int = GRAPH_MAX_TOKENS) -> StepTotals:
    """Sum the step counters and histograms over every `engine` label of a `/metrics` page
    (`graph_max_tokens`, the server's graph limit, must be a bucket of the tokens histogram)."""
    from prometheus_client.parser import text_string_to_metric_families

    sums = dict.fromkeys([*SAMPLES.values(), "within_graph"], 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in SAMPLES:
                sums[SAMPLES[sample.name]] += sample.value
            elif sample.name == "chorus_packed_tokens_per_step_bucket" and sample.labels.get("le") != "+Inf" \
                    and float(sample.labels["le"]) == graph_max_tokens:
                sums["within_graph"] += sample.value
    return StepTotals(at, sums["steps"], sums["step_seconds"], sums["observed"], sums["tokens"],
                      sums["tokens_count"] - sums["within_graph"], sums["interval_seconds"], sums["intervals"])


def window(first: StepTotals, last: StepTotals, graph_max_tokens: int = GRAPH_MAX_TOKENS) -> dict:
    """The steps between two readings: counts, device-busy share, mean size and duration."""
    wall = last.at - first.at
    observed = last.observed - first.observed
    steps = last.steps - first.steps
    busy = last.step_seconds - first.step_seconds
    intervals = last.intervals - first.intervals
    return {
        "wall_s": round(wall, 2),
        "steps": int(steps),
        "steps_per_s": round(steps / wall, 1) if wall > 0 else None,
        "in_step_share": round(busy / wall, 3) if wall > 0 else None,
        "mean_step_ms": round(1e3 * busy / observed, 2) if observed else None,
        "mean_interval_ms": round(1e3 * (last.interval_seconds - first.interval_seconds) / intervals, 2)
        if intervals else None,
        "mean_packed_tokens": round((last.tokens - first.tokens) / observed, 1) if observed else None,
        f"share_over_{graph_max_tokens}_tokens": round((last.over_graph - first.over_graph) / observed, 3)
        if observed else None,
    }


class StepWatch:
    """Read `/metrics` every `every` seconds while a scenario runs; `result()` is the window, or
    the part of it between two `perf_counter` times (a level's measured seconds without its ramp
    and the tail of turns still playing, which would dilute the busy share)."""

    def __init__(self, base_url: str, every: float = 2.0, graph_max_tokens: int = GRAPH_MAX_TOKENS):
        self.url = base_url.rstrip("/") + "/metrics"
        self.every = every
        self.graph_max_tokens = graph_max_tokens
        self.first: StepTotals | None = None
        self.last: StepTotals | None = None
        self.readings: list[StepTotals] = []
        self.error: str | None = None
        self._task: asyncio.Task | None = None

    async def _read(self, client) -> StepTotals:
        response = await client.get(self.url)
        response.raise_for_status()
        return parse_totals(response.text, time.perf_counter(), self.graph_max_tokens)

    async def _run(self, client) -> None:
        while True:
            await asyncio.sleep(self.every)
            self.last = await self._read(client)
            self.readings.append(self.last)

    async def __aenter__(self) -> StepWatch:
        import httpx

        self._client = httpx.AsyncClient(timeout=30)
        try:
            self.first = await self._read(self._client)
            self.readings.append(self.first)
            self._task = asyncio.create_task(self._run(self._client))
        except Exception as exc:  # noqa: BLE001 - the scenario runs on; the report says why
            self.error = f"{type(exc).__name__}: {exc}"
        return self

    async def __aexit__(self, *exc) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            except Exception as err:  # noqa: BLE001
                self.error = f"{type(err).__name__}: {err}"
        try:
            if self.first is not None and self.error is None:
                self.last = await self._read(self._client)
                self.readings.append(self.last)
        except Exception as err:  # noqa: BLE001
            self.error = f"{type(err).__name__}: {err}"
        finally:
            await self._client.aclose()

    def result(self, start: float | None = None, end: float | None = None) -> dict:
        if self.error is not None or self.first is None or self.last is None:
            return {"error": self.error or "no reading"}
        if start is None and end is None:
            return window(self.first, self.last, self.graph_max_tokens)
        inside = [r for r in self.readings if (start is None or r.at >= start) and (end is None or r.at <= end)]
        if len(inside) < 2:
            return {"error": "fewer than two readings inside the window"}
        return window(inside[0], inside[-1], self.graph_max_tokens)


# ---- the scenarios ------------------------------------------------------------------------------

MAX_FRAME = None  # audio frames of long requests are large; the client takes any size


@dataclass
class Timing:
    """One request as the client saw it (perf_counter seconds) and as the engine reported it."""

    sent: float
    first_audio: float | None = None
    done: float | None = None
    outcome: str | None = None
    samples: int = 0
    sample_rate: int = 24000
    engine: dict = field(default_factory=dict)  # done.timings

    @property
    def first_ms(self) -> float | None:
        return None if self.first_audio is None else (self.first_audio - self.sent) * 1e3

    @property
    def total_ms(self) -> float | None:
        return None if self.done is None else (self.done - self.sent) * 1e3


class Client:
    """One WebSocket connection with any number of requests in flight."""

    def __init__(self, ws):
        self.ws = ws
        self.timings: dict[str, Timing] = {}
        self._ended: dict[str, asyncio.Event] = {}
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, url: str) -> Client:
        import websockets

        ws = await websockets.connect(url, max_size=MAX_FRAME)  # a default client, as users run it
        ready = json.loads(await ws.recv())
        assert ready["type"] == "ready", ready
        return cls(ws)

    async def send(self, rid: str, text: str, **fields) -> Timing:
        return await self.send_message({"type": "synthesize", "id": rid, "text": text, "progress": False, **fields})

    async def send_message(self, frame: dict) -> Timing:
        """Any request frame (`synthesize`, `dialogue`): timed from just before it is sent."""
        rid = frame["id"]
        self._ended[rid] = asyncio.Event()
        timing = self.timings[rid] = Timing(sent=time.perf_counter())
        await self.ws.send(json.dumps(frame))
        return timing

    async def wait(self, rid: str, timeout: float = 300.0) -> Timing:
        await asyncio.wait_for(self._ended[rid].wait(), timeout)
        return self.timings[rid]

    async def _read(self) -> None:
        from server.wire.messages import split_audio_frame

        async for frame in self.ws:
            now = time.perf_counter()
            if isinstance(frame, bytes):
                header, _ = split_audio_frame(frame)
                t = self.timings[header["id"]]
                if t.first_audio is None:
                    t.first_audio = now
                t.samples += int(header["samples"])
                t.sample_rate = int(header["sample_rate"])
                continue
            msg = json.loads(frame)
            if msg["type"] in ("done", "cancelled", "error") and msg.get("id") in self.timings:
                t = self.timings[msg["id"]]
                t.done, t.outcome = now, msg["type"]
                t.engine = msg.get("timings") or {"message": msg.get("message")}
                self._ended[msg["id"]].set()

    async def close(self) -> None:
        await self.ws.close()
        self._reader.cancel()


def _options(spec: RequestSpec) -> dict:
    return {"duration": spec.seconds, "guidance_scale": spec.guidance_scale, "num_step": spec.num_step}


def _outcomes(timings) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in timings:
        out[t.outcome or "missing"] = out.get(t.outcome or "missing", 0) + 1
    return out


async def single(url: str, seconds: float = 10.0, runs: int = 7, warmup: int = 2, seed: int = 0,
                 fresh_lengths: bool = False, timestamps: str | None = None) -> dict:
    """One 10 s line at a time (the engine-level `single` scenario's request). With
    `fresh_lengths` every run is one frame longer than the last (`seconds` + 1/25 s per run),
    so each is a length the server has not decoded before, as a new text's usually is. With
    `timestamps` ("word"), every request asks for its words frames too (their cost)."""
    text = make_text(random.Random(seed + 3), seconds)
    extra = {"timestamps": timestamps} if timestamps else {}
    client = await Client.connect(url)
    rows = []
    frames = int(seconds * FRAME_RATE)
    try:
        for i in range(warmup + runs):
            # k frames and half of one more: int(duration * 25) is exactly k
            duration = (frames + i + 1.5) / FRAME_RATE if fresh_lengths else seconds
            await client.send(f"single{i}", text, options={"duration": duration, "seed": i}, **extra)
            t = await client.wait(f"single{i}")
            if i >= warmup and t.outcome == "done":
                rows.append(t)
    finally:
        await client.close()
    first = [t.first_ms for t in rows]
    engine_first = [t.engine["first_audio_ms"] for t in rows]
    return {
        "seconds": seconds, "runs": len(rows), "fresh_lengths": fresh_lengths, "timestamps": timestamps,
        "client_first_audio_ms": stats(first, 2), "client_done_ms": stats([t.total_ms for t in rows], 2),
        "engine_first_audio_ms": stats(engine_first, 2),
        "engine_total_ms": stats([t.engine["total_ms"] for t in rows], 2),
        "engine_queue_ms": stats([t.engine["queue_ms"] for t in rows], 2),
        "gap_first_audio_ms": stats([c - e for c, e in zip(first, engine_first)], 2),
    }


async def long(url: str, first_chunk_seconds: float | None = None, seconds: float = 60.0, runs: int = 7,
               seed: int = 0) -> dict:
    """A 60 s paragraph streamed chunk by chunk, one at a time (as many runs as the lone line
    has: a median of three moved with one slow run)."""
    text = long_paragraph(seed, seconds)
    options = {} if first_chunk_seconds is None else {"first_chunk_seconds": first_chunk_seconds}
    client = await Client.connect(url)
    rows = []
    try:
        for i in range(runs + 1):
            await client.send(f"long{i}", text, stream="chunk", options=options)
            t = await client.wait(f"long{i}")
            if i > 0:  # the first one warms up
                rows.append(t)
    finally:
        await client.close()
    return {"text_chars": len(text), "first_chunk_seconds": first_chunk_seconds, "outcomes": _outcomes(rows),
            "client_first_audio_ms": stats([t.first_ms for t in rows if t.first_ms is not None], 2),
            "engine_first_audio_ms": stats([t.engine.get("first_audio_ms") for t in rows
                                            if t.engine.get("first_audio_ms") is not None], 2),
            "client_done_ms": stats([t.total_ms for t in rows if t.total_ms is not None], 1),
            "audio_seconds": round(sum(t.samples / t.sample_rate for t in rows) / max(1, len(rows)), 2)}


async def throughput(url: str, specs: list[RequestSpec], connections: int = 16, timestamps: str | None = None) -> dict:
    """Every request of the mix sent at once over `connections` sockets; audio-s/s as received
    (with `timestamps`, each request also asks for its words frames)."""
    extra = {"timestamps": timestamps} if timestamps else {}
    clients = [await Client.connect(url) for _ in range(connections)]
    try:
        t0 = time.perf_counter()
        sent = [(clients[i % connections], spec) for i, spec in enumerate(specs)]
        await asyncio.gather(*(c.send(s.request_id, s.text, options=_options(s), **extra) for c, s in sent))
        rows = await asyncio.gather(*(c.wait(s.request_id, 600) for c, s in sent))
        wall = time.perf_counter() - t0
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    audio = sum(t.samples / t.sample_rate for t in rows if t.outcome == "done")
    return {"requests": len(specs), "connections": connections, "timestamps": timestamps,
            "outcomes": _outcomes(rows),
            "wall_s": round(wall, 3), "audio_seconds_received": round(audio, 2),
            "audio_s_per_s": round(audio / wall, 2),
            "client_first_audio_ms": stats([t.first_ms for t in rows if t.first_ms is not None], 1),
            "client_done_ms": stats([t.total_ms for t in rows if t.total_ms is not None], 1)}


async def loaded(url: str, max_audio_s_per_s: float, load: float = 0.7, duration_s: float = 60.0,
                 seconds: float = 10.0, connections: int = 16, seed: int = 0,
                 graph_max_tokens: int = GRAPH_MAX_TOKENS, num_step: int = 32) -> dict:
    """Poisson arrivals of 10 s lines at `load` x the measured throughput, spread over sockets
    (`num_step`: the steps that throughput was measured at)."""
    rate = load * max_audio_s_per_s / seconds
    arrivals = poisson_arrivals(rate, duration_s, seed)
    rng = random.Random(seed + 11)
    specs = [RequestSpec(f"load{i:05d}", make_text(rng, seconds), seconds, num_step=num_step)
             for i in range(len(arrivals))]
    clients = [await Client.connect(url) for _ in range(connections)]
    try:
        async with StepWatch(http_base(url), graph_max_tokens=graph_max_tokens) as steps:
            t0 = time.perf_counter()
            waits = []
            for i, (at, spec) in enumerate(zip(arrivals, specs)):
                delay = t0 + at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                client = clients[i % connections]
                await client.send(spec.request_id, spec.text, options=_options(spec))
                waits.append(client.wait(spec.request_id, 300))
            rows = await asyncio.gather(*waits)
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    done = [t for t in rows if t.outcome == "done"]
    return {"load": load, "rate_req_per_s": round(rate, 3), "duration_s": duration_s, "requests": len(specs),
            "outcomes": _outcomes(rows),
            "client_first_audio_ms": stats([t.first_ms for t in done], 1),
            "client_done_ms": stats([t.total_ms for t in done], 1),
            "engine_first_audio_ms": stats([t.engine["first_audio_ms"] for t in done], 1),
            # submission -> first step: waiting for admission, not running
            "engine_queue_ms": stats([t.engine["queue_ms"] for t in done], 1),
            "server_steps": steps.result()}


def http_base(ws_url: str) -> str:
    """ws://host:port/v1/stream -> http://host:port (wss -> https)."""
    base = ws_url.split("/v1/", 1)[0]
    return base.replace("wss://", "https://", 1).replace("ws://", "http://", 1)


def run(coro):
    return asyncio.run(coro)
