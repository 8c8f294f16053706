"""The GPU soak: `chorus loadtest` against `chorus serve --device cuda`, with the GPU's memory
watched beside the host's.

`python -m bench.soak_gpu --minutes 5 --clients 60 --measured-throughput 240 -- --model DIR
--device cuda --dtype bfloat16` starts the server, runs the load test's clients (mixed knobs,
cancels, protocol checks) for that long, samples the server process's GPU memory (nvidia-smi)
and host RSS every couple of seconds, and writes the load test's report with a `summary`:
`minutes`, `accepted`, `lost` (accepted but never ended), `violations` (protocol),
`rss_growth_pct` and `gpu_mem_growth_pct` (median of the last quarter of the run against
the median of its second quarter), and the audio-s/s it delivered against
`--measured-throughput` (what `chorus bench` measured on the same GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from bench.metrics import emit_report
from server.checkout import git_commit
from server.launcher import ServerProcess
from server.loadtest.cli import split_serve_args
from server.loadtest.clients import run_load
from server.loadtest.report import passed, rss_summary


def gpu_memory_mb(pid: int) -> float | None:
    """GPU memory the process `pid` holds, by nvidia-smi; None when it holds none or no GPU."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    used = [float(mem) for p, mem in (line.split(",") for line in out.strip().splitlines() if "," in line)
            if int(p) == pid]
    return sum(used) if used else None


class GpuSampler(threading.Thread):
    def __init__(self, pid: int, every: float = 2.0):
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.samples: list[tuple[float, float]] = []
        self.stop_event = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self.stop_event.wait(self.every):
            mb = gpu_memory_mb(self.pid)
            if mb is not None:
                self.samples.append((time.monotonic() - self.t0, mb))


def _growth_pct(summary: dict) -> float | None:
    base = summary.get("after_warmup")
    return round(100.0 * summary["growth_after_warmup"] / base, 3) if base else None


def main(argv: list[str] | None = None) -> int:
    argv, serve_args = split_serve_args(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=60)
    parser.add_argument("--inflight", type=int, default=2)
    parser.add_argument("--cancel-rate", type=float, default=0.15)
    parser.add_argument("--num-steps", default="16,32")
    parser.add_argument("--measured-throughput", type=float, default=None,
                        help="audio-s/s chorus bench measured on this GPU (to say what share this load is)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    num_steps = [int(x) for x in args.num_steps.split(",")]
    scratch = Path(tempfile.mkdtemp(prefix="chorus-soak-"))
    server = ServerProcess(["--voices-dir", str(scratch / "voices"), "--log-level", "warning", *serve_args],
                           scratch / "server.log").start()
    sampler = GpuSampler(server.pid)
    sampler.start()
    try:
        result = asyncio.run(run_load(server.url, args.clients, args.minutes * 60.0, args.inflight, args.cancel_rate,
                                      server.pid, 0, 2.0, num_steps, None))
    finally:
        sampler.stop_event.set()
        result_exit = server.stop(timeout=120)
    gpu = rss_summary(sampler.samples)
    rss = result["server_rss_mb"]
    delivered = result["audio_seconds"] / result["duration_s"] if result["duration_s"] else None
    result["server_gpu_mem_mb"] = gpu
    result["server_exit_status"] = result_exit
    result["summary"] = {
        "minutes": round(result["duration_s"] / 60.0, 2),
        "accepted": result["accepted"],
        "lost": result["accepted_but_unfinished"],
        "violations": result["protocol_violations"],
        "rss_growth_pct": _growth_pct(rss),
        "gpu_mem_growth_pct": _growth_pct(gpu),
        "audio_s_per_s": round(delivered, 2) if delivered else None,
        "share_of_measured_throughput": (round(delivered / args.measured_throughput, 3)
                                         if delivered and args.measured_throughput else None),
        "passed": passed(result) and result_exit == 0,
        "commit": git_commit(),
    }
    result["command"] = "python -m bench.soak_gpu " + " ".join([*argv, "--", *serve_args])
    emit_report(result, args.out)
    return 0 if result["summary"]["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
