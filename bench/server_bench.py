"""What the server adds on top of the engine: the same request, engine level and over a WebSocket.

`python -m bench.server_bench --model DIR [--device cpu|cuda] [--runs 20]` measures, one
request at a time (nothing else running), submit -> first audio and submit -> done:

- engine level: `EngineLoop.submit` in this process, timed by the sink's events;
- server level: a `websockets` client on loopback against `chorus serve` (a subprocess),
  timed from sending `synthesize` to receiving the first audio frame and `done`.

Both use the same seeded requests; the difference is the server's overhead (protocol,
event loop, framing, loopback). Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import threading
import time

from bench.metrics import emit_report, stats

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Streaming speech, one sentence at a time.",
    "Numbers like forty two and names like Ada Lovelace.",
]


def _engine_request(engine, i: int, num_step: int) -> tuple[float, float]:
    from server.engine.types import ChunkAudio, Finished, GenerationOptions, SynthesisRequest

    done = threading.Event()
    marks: dict[str, float] = {}

    def sink(event):
        if isinstance(event, ChunkAudio):
            marks.setdefault("first", time.perf_counter())
        elif isinstance(event, Finished):
            marks["done"] = time.perf_counter()
            done.set()

    t0 = time.perf_counter()
    engine.submit(SynthesisRequest(f"e{i}", TEXTS[i % len(TEXTS)], options=GenerationOptions(num_step=num_step,
                                                                                          seed=i)), sink)
    done.wait(120)
    return (marks["first"] - t0) * 1e3, (marks["done"] - t0) * 1e3


async def _server_request(client, i: int, num_step: int) -> tuple[float, float]:
    rid = f"s{i}"
    await client.send(rid, TEXTS[i % len(TEXTS)], options={"num_step": num_step, "seed": i})
    timing = await client.wait(rid, 120)
    if timing.outcome != "done":
        raise RuntimeError(f"{rid}: {timing.outcome} {timing.engine}")
    return timing.first_ms, timing.total_ms


async def _interleaved(engine, url: str, runs: int, num_step: int) -> dict:
    """Engine and server requests alternate, so drift on a shared machine hits both alike."""
    from bench.ws_bench import Client

    out = {"engine": ([], []), "server": ([], [])}
    client = await Client.connect(url)
    try:
        for i in range(runs + 2):
            e = await asyncio.to_thread(_engine_request, engine, i, num_step)
            s = await _server_request(client, i, num_step)
            if i >= 2:  # warm-up first
                for key, (first, total) in (("engine", e), ("server", s)):
                    out[key][0].append(first)
                    out[key][1].append(total)
    finally:
        await client.close()
    return {key: {"first_audio_ms": stats(f), "total_ms": stats(t)} for key, (f, t) in out.items()}


def measure(model: str, device: str, dtype: str, runs: int, num_step: int) -> dict:
    from server.config import EngineSettings
    from server.engine.runtime.loop import EngineLoop

    proc = subprocess.Popen([sys.executable, "-m", "server", "serve", "--model", model, "--device", device,
                             "--dtype", dtype, "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    engine = None
    try:
        match = re.search(r"Chorus listening on (http://\S+)", proc.stdout.readline())
        if not match:
            raise RuntimeError("the server did not start")
        url = match.group(1).replace("http://", "ws://") + "/v1/stream"
        engine = EngineLoop.load(model, EngineSettings(device=device, dtype=dtype))
        engine.start()
        return asyncio.run(_interleaved(engine, url, runs, num_step))
    finally:
        if engine is not None:
            engine.stop()
        proc.terminate()
        proc.wait(timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--num-step", type=int, default=32)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    measured = measure(args.model, args.device, dtype, args.runs, args.num_step)
    engine, server = measured["engine"], measured["server"]
    result = {
        "command": "python -m bench.server_bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "device": args.device, "dtype": dtype, "num_step": args.num_step,
        "engine": engine, "server": server,
        "server_overhead_ms": {
            "first_audio_median": round(server["first_audio_ms"]["median"] - engine["first_audio_ms"]["median"], 2),
            "total_median": round(server["total_ms"]["median"] - engine["total_ms"]["median"], 2),
        },
    }
    emit_report(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
