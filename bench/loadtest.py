"""`chorus loadtest`: many WebSocket clients against a Chorus server for a fixed time, then a report.

Each client keeps a few requests in flight with mixed texts and knobs (step counts,
guidance 0, chunked text, whole or chunk streaming, both encodings, sampling), cancels
some of them, and checks the protocol as it goes: `accepted` before any event of a request,
audio chunks in order with `final` on the last, header sample counts equal to the payload,
`done.chunks` equal to the audio frames sent, and exactly one end (done, cancelled or error)
per accepted request. When the time is up clients stop sending and wait for what they have
in flight.

The report (JSON) counts requests by outcome, refusals by code, accepted-but-unfinished
(must be 0), protocol violations (must be none), latency percentiles, the server's resident
memory over time (sampled from /proc when the server runs on this machine) and the server's
own count of requests in flight once every client has left (must be 0). Exit status 0 only
when nothing was lost and nothing violated the protocol.

Traffic goes only to the given URL (by default a server this command starts on 127.0.0.1).

    chorus loadtest --clients 50 --seconds 240 --out report.json -- --model ckpt-tiny
    chorus loadtest --url http://127.0.0.1:8000 --server-pid 1234 --clients 20 --seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

TEXTS = [
    "Hello there.",
    "The quick brown fox jumps over the lazy dog.",
    "Streaming speech, one sentence at a time. Here is the second sentence.",
    "Numbers like 42 and names like Ada Lovelace.",
    "A longer paragraph follows. It has several sentences! Does it chunk? It may, with a low threshold.",
]
END_TYPES = ("done", "cancelled", "error")


@dataclass
class Report:
    sent: int = 0
    accepted: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: {"done": 0, "cancelled": 0, "error": 0})
    errors_after_accept: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)
    cancels_sent: int = 0
    cancelled_before_accept: int = 0
    protocol_violations: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    first_audio_ms: list[float] = field(default_factory=list)
    audio_seconds: float = 0.0
    rss_mb: list[tuple[float, float]] = field(default_factory=list)
    unfinished: int = 0
    connection_errors: list[str] = field(default_factory=list)

    def violation(self, text: str) -> None:
        self.protocol_violations.append(text)

    def summary(self, duration: float, settings: dict) -> dict:
        def pct(values: list[float], q: float) -> float | None:
            if not values:
                return None
            ordered = sorted(values)
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)

        return {
            "settings": settings,
            "duration_s": round(duration, 1),
            "sent": self.sent,
            "accepted": self.accepted,
            "outcomes": self.outcomes,
            "errors_after_accept": self.errors_after_accept,
            "refused": self.refused,
            "cancels_sent": self.cancels_sent,
            "cancelled_before_accept": self.cancelled_before_accept,
            "accepted_but_unfinished": self.unfinished,
            "protocol_violations": len(self.protocol_violations),
            "protocol_violation_examples": self.protocol_violations[:20],
            "connection_errors": len(self.connection_errors),
            "connection_error_examples": self.connection_errors[:20],
            "done_per_second": round(self.outcomes["done"] / duration, 2) if duration else None,
            "latency_ms": {"p50": pct(self.latencies_ms, 0.5), "p90": pct(self.latencies_ms, 0.9),
                           "p95": pct(self.latencies_ms, 0.95), "p99": pct(self.latencies_ms, 0.99),
                           "max": round(max(self.latencies_ms), 1) if self.latencies_ms else None},
            "first_audio_ms": {"p50": pct(self.first_audio_ms, 0.5), "p95": pct(self.first_audio_ms, 0.95),
                               "p99": pct(self.first_audio_ms, 0.99)},
            "audio_seconds": round(self.audio_seconds, 1),
            "server_rss_mb": rss_summary(self.rss_mb),
        }


def rss_summary(samples: list[tuple[float, float]]) -> dict:
    """First, last and peak RSS, and its growth after warm-up: the median of the last
    quarter of the run minus the median of its second quarter."""
    if not samples:
        return {"samples": []}
    values = [m for _, m in samples]
    n = len(values)
    early = values[n // 4 : max(n // 4 + 1, n // 2)]
    late = values[-max(1, n // 4):]
    return {
        "first": values[0], "last": values[-1], "max": max(values),
        "after_warmup": round(statistics.median(early), 1),
        "end": round(statistics.median(late), 1),
        "growth_after_warmup": round(statistics.median(late) - statistics.median(early), 1),
        "samples": [[round(t, 1), m] for t, m in samples],
    }


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


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
                     num_steps: list[int], report: Report, rng: random.Random) -> None:
    import websockets

    pending: dict[str, _Pending] = {}
    counter = 0
    cancels: set[asyncio.Task] = set()
    try:
        async with websockets.connect(url, max_size=None, open_timeout=60) as ws:
            ready = json.loads(await asyncio.wait_for(ws.recv(), 60))
            if ready.get("type") != "ready":
                report.violation(f"client {index}: first frame {ready.get('type')!r}, not ready")
                return

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

            for _ in range(inflight):
                await send_one()
            while pending:
                frame = await asyncio.wait_for(ws.recv(), timeout=max(60.0, deadline + 120 - time.time()))
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
                    if time.time() < deadline:
                        await send_one()
                elif kind == "error" and rid is None:
                    report.violation(f"client {index}: an error without an id: {msg}")
                elif kind not in ("pong",):
                    report.violation(f"client {index}: unexpected frame {kind!r}")
    except Exception as exc:  # noqa: BLE001 - a dropped or hung connection is a finding: reported
        report.connection_errors.append(f"client {index}: {type(exc).__name__}: {exc}"[:200])
    finally:
        for task in list(cancels):
            task.cancel()
        report.unfinished += sum(1 for s in pending.values() if s.accepted)


async def sample_rss(pid: int | None, report: Report, start: float, stop: asyncio.Event, every: float) -> None:
    while pid is not None and not stop.is_set():
        mb = rss_mb(pid)
        if mb is not None:
            report.rss_mb.append((time.perf_counter() - start, mb))
        try:
            await asyncio.wait_for(stop.wait(), timeout=every)
        except asyncio.TimeoutError:
            pass


async def server_inflight(base_url: str, headers: dict[str, str]) -> float | None:
    """The server's `chorus_inflight_requests` gauge (None when it cannot be read)."""
    import httpx

    try:
        async with httpx.AsyncClient(timeout=30) as client:
            text = (await client.get(base_url + "/metrics", headers=headers)).text
    except Exception:  # noqa: BLE001 - reported as unknown
        return None
    match = re.search(r"^chorus_inflight_requests (\S+)$", text, re.M)
    return float(match.group(1)) if match else None


async def run_load(url: str, clients: int, seconds: float, inflight: int = 2, cancel_rate: float = 0.15,
                   server_pid: int | None = None, seed: int = 0, rss_every: float = 1.0,
                   num_steps: list[int] | None = None, api_key: str | None = None) -> dict:
    """Run the load against `url` (http://HOST:PORT) and return the report."""
    base = url.rstrip("/")
    ws_url = base.replace("http://", "ws://").replace("https://", "wss://") + "/v1/stream"
    headers = {}
    if api_key:
        from urllib.parse import quote

        ws_url += f"?api_key={quote(api_key)}"
        headers["Authorization"] = f"Bearer {api_key}"
    num_steps = num_steps or [4, 8, 16]
    report = Report()
    start = time.perf_counter()
    deadline = time.time() + seconds
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_rss(server_pid, report, start, stop, rss_every))
    rng = random.Random(seed)
    await asyncio.gather(*[
        run_client(i, ws_url, deadline, inflight, cancel_rate, num_steps, report, random.Random(rng.random()))
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
    result = report.summary(duration, settings)
    result["server_inflight_after"] = left
    return result


def passed(result: dict) -> bool:
    return (result["accepted_but_unfinished"] == 0 and result["protocol_violations"] == 0
            and result["connection_errors"] == 0 and result.get("server_inflight_after") in (0, 0.0, None))


def spawn_server(serve_args: list[str], log_path: Path, voices_dir: Path) -> tuple[subprocess.Popen, str]:
    """`chorus serve` on 127.0.0.1 with a free port; returns it and its URL once it listens."""
    args = ["--host", "127.0.0.1", "--port", "0", "--voices-dir", str(voices_dir), "--log-level", "warning",
            *serve_args]
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "server", "serve", *args], stdout=subprocess.PIPE,
                            stderr=log, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    match = re.search(r"Chorus listening on (http://\S+)", line)
    if not match:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the server did not start (printed {line!r}); its log: {log_path}")
    return proc, match.group(1)


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip() or None
    except Exception:  # noqa: BLE001 - not a git checkout
        return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chorus loadtest", description=__doc__.splitlines()[0],
        epilog="Arguments after `--` go to the `chorus serve` this command starts (without --url).")
    parser.add_argument("--url", default=None, help="a running server's base URL (default: start one on loopback)")
    parser.add_argument("--server-pid", type=int, default=None, help="PID whose RSS to sample (with --url)")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=30.0, help="how long clients send (then they drain)")
    parser.add_argument("--inflight", type=int, default=2, help="requests each client keeps in flight")
    parser.add_argument("--cancel-rate", type=float, default=0.15, help="share of requests cancelled soon after")
    parser.add_argument("--num-steps", default="4,8,16", help="step counts to pick from (comma-separated)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rss-every", type=float, default=1.0, help="seconds between RSS samples")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--server-log", default=None, help="the started server's log (default: a temporary file)")
    parser.add_argument("--out", default=None, help="also write the JSON report here")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    serve_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, serve_args = argv[:cut], argv[cut + 1:]
    args = build_parser().parse_args(argv)
    num_steps = [int(x) for x in args.num_steps.split(",") if x.strip()]

    proc = None
    url, pid = args.url, args.server_pid
    scratch = tempfile.TemporaryDirectory(prefix="chorus-loadtest-")
    if url is None:
        if args.api_key:
            serve_args = ["--api-key", args.api_key, *serve_args]
        log_path = Path(args.server_log) if args.server_log else Path(scratch.name) / "server.log"
        proc, url = spawn_server(serve_args, log_path, Path(scratch.name) / "voices")
        pid = proc.pid
    try:
        result = asyncio.run(run_load(url, args.clients, args.seconds, args.inflight, args.cancel_rate, pid,
                                      args.seed, args.rss_every, num_steps, args.api_key))
    finally:
        if proc is not None:
            proc.terminate()
            result_exit = proc.wait(timeout=120)
        scratch.cleanup()
    if proc is not None:
        result["server_exit_status"] = result_exit
    shown = ["chorus", "loadtest", *argv, *(["--", *serve_args] if serve_args and args.url is None else [])]
    result["command"] = " ".join(shown)
    result["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
    result["commit"] = _commit()
    result["passed"] = passed(result) and result.get("server_exit_status", 0) == 0
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
