"""`/healthz` while a real `chorus serve` is attacked the ways the lexicon and the normaliser once
stalled it: a thousand lexicon entries under concurrent requests, expansions past the spoken-text
limit flooding one WebSocket, and texts the normaliser's grammars take seconds on (two clients
sending them, then leaving; a WebSocket cancelling one). A thread probes `/healthz` back to back
the whole time; the report gives its latency per attack (and what each attack's requests got).
Runs on any machine (the CPU and the tiny checkpoint are what the attacks were found on).

    python -m bench.hostile --checkpoint ckpt-tiny --out bench/results/DATE-cpu-hostile.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import websockets

from bench.metrics import emit_report, percentile
from server.cli.checkout import git_commit
from server.cli.launcher import ServerProcess

FAST = {"num_step": 2, "seed": 1}


class Probe:
    """`GET /healthz` back to back on a thread: every answer's latency, in seconds. It holds the
    attack until its first answer, and ends one answer after it, so even an attack quicker than
    one probe has probes that ran through it."""

    def __init__(self, url: str):
        self.url, self.latencies = url, []
        self._stop = threading.Event()
        self._answered = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=120) as http:
            while not self._stop.is_set():
                began = time.perf_counter()
                http.get(self.url + "/healthz")
                with self._answered:
                    self.latencies.append(time.perf_counter() - began)
                    self._answered.notify_all()
                time.sleep(0.005)

    def _await_answers(self, count: int) -> None:
        with self._answered:
            self._answered.wait_for(lambda: len(self.latencies) >= count or not self._thread.is_alive(), 120)

    def __enter__(self) -> Probe:
        self._thread.start()
        self._await_answers(1)
        return self

    def __exit__(self, *exc) -> None:
        self._await_answers(len(self.latencies) + 1)
        self._stop.set()
        self._thread.join(120)

    def summary(self) -> dict:
        ms = [1000.0 * s for s in self.latencies]
        return {"probes": len(ms), "p50_ms": round(percentile(ms, 50), 2), "p99_ms": round(percentile(ms, 99), 2),
                "max_ms": round(max(ms), 2)}


async def _ws_requests(url: str, texts: list[str], options: dict, cancel_after: float | None = None) -> list[str]:
    """Each text as a `synthesize` on one socket; the end each got (`cancel_after`: cancel them then)."""
    async with websockets.connect(url.replace("http", "ws") + "/v1/stream", max_size=None) as ws:
        await ws.recv()  # ready
        for i, text in enumerate(texts):
            await ws.send(json.dumps({"type": "synthesize", "id": f"r{i}", "text": text, "progress": False,
                                      "options": options}))
        if cancel_after is not None:
            await asyncio.sleep(cancel_after)
            for i in range(len(texts)):
                await ws.send(json.dumps({"type": "cancel", "id": f"r{i}"}))
        ends: dict[str, str] = {}
        while len(ends) < len(texts):
            frame = await ws.recv()
            if isinstance(frame, str) and (msg := json.loads(frame))["type"] in ("done", "cancelled", "error"):
                ends[msg["id"]] = msg["type"] if msg["type"] != "error" else msg["code"]
        return [ends[f"r{i}"] for i in range(len(texts))]


def lexicon_crowd(url: str) -> dict:
    """A thousand entries, one more (compiled again), then eight short requests and a voice list."""
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: httpx.post(url + "/v1/pronunciations", timeout=120,
                                           json={"text": f"Word{i} phrase{i}", "say": f"say {i}"}), range(1000)))
    httpx.post(url + "/v1/pronunciations", json={"text": "Hello", "say": "Howdy"}, timeout=120)
    began = time.perf_counter()
    ends = asyncio.run(_ws_requests(url, ["Hello. Word7 phrase7 too."] * 8, FAST))
    httpx.get(url + "/v1/voices", timeout=120)
    return {"ends": ends, "seconds": round(time.perf_counter() - began, 2)}


def expansion_flood(url: str) -> dict:
    """An entry saying 150 words for one, and sixteen texts of it on one WebSocket."""
    httpx.post(url + "/v1/pronunciations", json={"text": "zq", "say": " ".join(["b"] * 150)}, timeout=120)
    return {"ends": asyncio.run(_ws_requests(url, [" ".join(["zq"] * 1666)] * 16, FAST))}


def hard_normalisation(url: str) -> dict:
    """Two clients send a run of digits to normalise and leave after 2 s; a WebSocket cancels one."""
    def leave(body: dict) -> str:
        try:
            return str(httpx.post(url + "/v1/audio/speech", json=body, timeout=2.0).status_code)
        except httpx.TimeoutException:
            return "left"

    body = {"input": "1" * 1500, "response_format": "pcm", **FAST}
    with ThreadPoolExecutor(2) as pool:
        left = list(pool.map(leave, [body, body]))
    began = time.perf_counter()
    small = httpx.post(url + "/v1/audio/speech", json={"input": "Hello there, 3 apples.", "response_format": "pcm",
                                                        **FAST}, timeout=120)
    small_s = time.perf_counter() - began
    cancelled = asyncio.run(_ws_requests(url, ["1" * 3000], {**FAST, "normalize_text": True}, cancel_after=1.0))
    return {"http_clients": left, "short_text_status": small.status_code, "short_text_seconds": round(small_s, 2),
            "ws_cancel": cancelled}


def idle(url: str) -> dict:
    """No attack: the probe's own latency on this machine, to read the others against."""
    time.sleep(3.0)
    return {}


ATTACKS: dict[str, Callable[[str], dict]] = {
    "idle": idle, "lexicon_crowd": lexicon_crowd, "expansion_flood": expansion_flood,
    "hard_normalisation": hard_normalisation,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="a checkpoint folder (`chorus make-checkpoint`)")
    parser.add_argument("--out", default=None, help="write the JSON report here")
    parser.add_argument("--attacks", default=",".join(ATTACKS), help="which, comma-separated")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    report: dict = {"meta": {"command": shlex.join(["python", "-m", "bench.hostile", *argv]), "commit": git_commit()},
                    "attacks": {}}
    with tempfile.TemporaryDirectory(prefix="chorus-hostile-") as work:
        server = ServerProcess(["--model", args.checkpoint, "--voices-dir", str(Path(work) / "voices")],
                               Path(work) / "server.log").start()
        try:
            for name in args.attacks.split(","):
                with Probe(server.url) as probe:
                    outcome = ATTACKS[name](server.url)
                report["attacks"][name] = {"healthz": probe.summary(), **outcome}
        finally:
            server.stop()
    report["summary"] = {f"{name}_healthz_max_ms": a["healthz"]["max_ms"] for name, a in report["attacks"].items()}
    emit_report(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
