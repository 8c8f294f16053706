"""First-audio overhead of `chorus-client` and its framework plugins against a raw
`websockets` client, on one running server.

Each round runs the same text stream once per kind (raw socket, `ChorusClient.stream`,
`ChorusClient.synthesize` against a raw `synthesize`, Pipecat's `ChorusTTSService` in a
pipeline, LiveKit's `TTS.stream()`), in a rotated order so no kind always goes first;
every kind keeps one warm connection, as an agent does. First audio is timed from handing
the text over to the first audio reaching the caller. The JSON's `summary` gives each
kind's median and its overhead over the raw client's median for the same request type.

    chorus serve --model DIR --device cuda &
    python -m bench.client_overhead --url http://127.0.0.1:8000 --rounds 50 --out overhead.json

Needs the client environment (`pip install ./client[pipecat,livekit]`); a framework
that is not installed is left out and named in the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import statistics
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import websockets
from chorus_client import AudioChunk, ChorusClient  # the checkout's when not installed: bench/__init__.py

TEXT = "Sure, I can help with that. Which day works best for you?"
Measure = Callable[[str], Awaitable[float]]


@dataclass
class Options:
    num_step: int
    seed: int = 7

    def wire(self) -> dict:
        return {"num_step": self.num_step, "seed": self.seed}


class RawSocket:
    """The baseline: the protocol by hand on one `websockets` connection."""

    def __init__(self, ws_url: str, options: Options):
        self.ws_url, self.options, self.ws, self.n = ws_url, options, None, 0

    async def open(self) -> None:
        self.ws = await websockets.connect(self.ws_url, max_size=None)
        await self.ws.recv()  # ready

    async def close(self) -> None:
        await self.ws.close()

    async def run(self, frames: list[dict], rid: str) -> float:
        start = time.perf_counter()
        for frame in frames:
            await self.ws.send(json.dumps(frame))
        first = None
        while True:
            msg = await self.ws.recv()
            if isinstance(msg, bytes):
                (n,) = struct.unpack(">I", msg[:4])
                if first is None and json.loads(msg[4:4 + n])["id"] == rid:
                    first = time.perf_counter() - start
                continue
            body = json.loads(msg)
            if body.get("id") == rid and body["type"] in ("done", "cancelled", "error"):
                if body["type"] != "done" or first is None:
                    raise RuntimeError(f"raw request ended without audio: {body}")
                return first

    async def stream(self, text: str) -> float:
        self.n += 1
        rid = f"raw-s{self.n}"
        return await self.run([{"type": "stream_open", "id": rid, "text": text, "progress": False,
                                "options": self.options.wire()}, {"type": "stream_close", "id": rid}], rid)

    async def synthesize(self, text: str) -> float:
        self.n += 1
        rid = f"raw-r{self.n}"
        return await self.run([{"type": "synthesize", "id": rid, "text": text, "progress": False,
                                "options": self.options.wire()}], rid)


async def first_audio(events, start: float) -> float:
    first = None
    async for event in events:
        if first is None and isinstance(event, AudioChunk):
            first = time.perf_counter() - start
    if first is None:
        raise RuntimeError("the request ended without audio")
    return first


def client_kinds(client: ChorusClient, options: Options) -> dict[str, Measure]:
    async def stream(text: str) -> float:
        start = time.perf_counter()
        handle = client.stream(text=text, options=options.wire())
        await handle.start()
        await handle.close()
        return await first_audio(handle, start)

    async def synthesize(text: str) -> float:
        start = time.perf_counter()
        return await first_audio(client.synthesize(text, options=options.wire()), start)

    return {"client_stream": stream, "client_synthesize": synthesize}


async def pipecat_kind(url: str, options: Options, sample_rate: int, stack: list) -> Measure:
    """A running Pipecat pipeline (ChorusTTSService -> a sink); a `TTSSpeakFrame` per run."""
    from chorus_client.pipecat import ChorusTTSService
    from pipecat.frames.frames import Frame, StartFrame, TTSAudioRawFrame, TTSSpeakFrame, TTSStoppedFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.workers.runner import WorkerRunner

    class Sink(FrameProcessor):
        """The pipeline's end: it is running once the StartFrame gets here."""

        def __init__(self):
            super().__init__()
            self.started = asyncio.Event()
            self.first = asyncio.Event()
            self.stopped = asyncio.Event()

        async def process_frame(self, frame: Frame, direction: FrameDirection):
            await super().process_frame(frame, direction)
            if isinstance(frame, StartFrame):
                self.started.set()
            elif isinstance(frame, TTSAudioRawFrame):
                self.first.set()
            elif isinstance(frame, TTSStoppedFrame):
                self.stopped.set()
            await self.push_frame(frame, direction)

    sink = Sink()
    worker = PipelineWorker(Pipeline([ChorusTTSService(url=url, options=options.wire()), sink]),
                            params=PipelineParams(audio_out_sample_rate=sample_rate), cancel_on_idle_timeout=False)
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    task = asyncio.create_task(runner.run())
    await asyncio.wait_for(sink.started.wait(), 60)

    async def stop() -> None:
        await worker.stop_when_done()
        await task

    stack.append(stop)

    async def measure(text: str) -> float:
        sink.first.clear()
        sink.stopped.clear()
        start = time.perf_counter()
        await worker.queue_frame(TTSSpeakFrame(text))
        await sink.first.wait()
        elapsed = time.perf_counter() - start
        await sink.stopped.wait()
        return elapsed

    return measure


async def livekit_kind(url: str, options: Options, sample_rate: int, stack: list) -> Measure:
    """LiveKit's TTS stream API: push_text, end_input, the first `SynthesizedAudio`."""
    from chorus_client import livekit as chorus

    tts = chorus.TTS(url=url, sample_rate=sample_rate, options=options.wire())
    await tts.client.connect()
    stack.append(tts.aclose)

    async def measure(text: str) -> float:
        start = time.perf_counter()
        stream = tts.stream()
        stream.push_text(text)
        stream.end_input()
        first = None
        async for _ in stream:
            if first is None:
                first = time.perf_counter() - start
        await stream.aclose()
        if first is None:
            raise RuntimeError("the LiveKit stream ended without audio")
        return first

    return measure


@dataclass
class Report:
    url: str
    rounds: int
    num_step: int
    text: str
    samples_ms: dict[str, list[float]] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)

    def summary(self) -> dict:
        medians = {k: statistics.median(v) for k, v in self.samples_ms.items() if v}
        baseline = {k: medians.get("raw_synthesize" if k.endswith("synthesize") else "raw_stream")
                    for k in medians}
        return {k: {"first_audio_ms_median": round(m, 3),
                    "overhead_ms": None if baseline[k] is None else round(m - baseline[k], 3),
                    "runs": len(self.samples_ms[k])} for k, m in medians.items()}

    def to_json(self) -> dict:
        return {"benchmark": "client_overhead", "url": self.url, "rounds": self.rounds, "num_step": self.num_step,
                "text": self.text, "summary": self.summary(), "left_out": self.left_out, "samples_ms": self.samples_ms}


async def run(url: str, rounds: int, num_step: int, text: str, warmup: int = 2) -> Report:
    options = Options(num_step)
    client = ChorusClient(url)
    ready = await client.connect()
    raw = RawSocket(client.ws_url, options)
    await raw.open()
    stack: list = [raw.close, client.close]
    kinds: dict[str, Measure] = {"raw_stream": raw.stream, "raw_synthesize": raw.synthesize,
                                 **client_kinds(client, options)}
    report = Report(url, rounds, num_step, text)
    for name, module, build in (("pipecat", "pipecat", pipecat_kind), ("livekit", "livekit.agents", livekit_kind)):
        if importlib.util.find_spec(module.split(".")[0]) is None:
            report.left_out[name] = f"{module} is not installed"
            continue
        kinds[name] = await build(url, options, ready.sample_rate, stack)
    try:
        names = list(kinds)
        for r in range(warmup + rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                elapsed = await kinds[name](text)
                if r >= warmup:
                    report.samples_ms.setdefault(name, []).append(elapsed * 1000)
    finally:
        for close in reversed(stack):
            await close()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="a running Chorus server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--num-step", type=int, default=32)
    parser.add_argument("--text", default=TEXT)
    parser.add_argument("--out", default=None, help="write the JSON here (default: print it)")
    args = parser.parse_args(argv)
    report = asyncio.run(run(args.url, args.rounds, args.num_step, args.text))
    body = json.dumps(report.to_json(), indent=2)
    if args.out:
        Path(args.out).write_text(body + "\n")
    print(json.dumps(report.to_json()["summary"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
