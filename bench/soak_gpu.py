"""The GPU soak: `chorus loadtest` against `chorus serve --device cuda` at a share of its capacity.

The GPU's memory is watched beside the host's.

`python -m bench.soak_gpu --minutes 5 --clients 60 --measured-throughput 240 -- --model DIR
--device cuda --dtype bfloat16` starts the server, then:

1. calibrates (`--calibrate-seconds`, 0 skips): the load test's clients, closed loop (each keeps
   `--inflight` requests outstanding), saturate it and measure the audio-s/s it delivers for
   this mix of knobs and cancels;
2. soaks for `--minutes`: the same clients, open loop at Poisson times, at `--load` (0.8) of
   the calibrated audio-s/s, turned into requests/s with the calibration's audio per request
   (without calibration they saturate it instead);

sampling the server's GPU memory (nvidia-smi: the server's processes, else the whole device
where it cannot see them, `gpu_mem_source`) and host RSS every couple of seconds during the
soak. The report is the soak's load-test report with `calibration` and a `summary`: `minutes`,
`accepted`, `lost` (accepted but never ended), `violations` (protocol), `rss_growth_pct` and
`gpu_mem_growth_pct` (over the soak: median of its last quarter against the median of its
second quarter), the audio-s/s delivered against the target and the calibration, and against
`--measured-throughput` (what `chorus bench` measured on the same GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from bench.metrics import emit_report
from server.cli.checkout import git_commit
from server.cli.launcher import ServerProcess
from server.loadtest.cli import split_serve_args
from server.loadtest.clients import run_load
from server.loadtest.report import passed, rss_summary

SEED = 0
SAMPLE_EVERY_S = 2.0


def _nvidia_smi(*query: str) -> str | None:
    try:
        return subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None


def _rows(out: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.split(",")] for line in out.strip().splitlines() if "," in line]


def process_tree(pid: int) -> set[int]:
    """`pid` and its descendants: engines may run in child processes (`--engine-processes`)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    tree, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in tree:
            tree.add(p)
            todo.extend(children.get(p, []))
    return tree


def gpu_memory_mb(pid: int) -> float | None:
    """GPU memory the process `pid` (and its children) holds, by nvidia-smi; None when it holds
    none, there is no GPU, or nvidia-smi cannot see the pids (often so in containers)."""
    out = _nvidia_smi("--query-compute-apps=pid,used_memory")
    if out is None:
        return None
    pids = process_tree(pid)
    used = [float(row[1]) for row in _rows(out) if row[0].isdigit() and int(row[0]) in pids
            and row[1].replace(".", "", 1).isdigit()]
    return sum(used) if used else None


def visible_gpus(cuda_visible_devices: str | None) -> set[int] | None:
    """The GPU indices CUDA_VISIBLE_DEVICES names (None: all; an empty set: none or not
    numeric indices, such as UUIDs, which this does not map)."""
    if cuda_visible_devices is None:
        return None
    entries = [e.strip() for e in cuda_visible_devices.split(",") if e.strip()]
    if not entries or not all(e.isdigit() for e in entries):
        return set()
    return {int(e) for e in entries}


def device_memory_mb(cuda_visible_devices: str | None) -> float | None:
    """Memory used on the whole of the visible GPUs (every process's), by nvidia-smi, which
    ignores CUDA_VISIBLE_DEVICES itself, hence the filter; None without a GPU to read."""
    out = _nvidia_smi("--query-gpu=index,memory.used")
    if out is None:
        return None
    wanted = visible_gpus(cuda_visible_devices)
    used = [float(row[1]) for row in _rows(out) if row[0].isdigit() and (wanted is None or int(row[0]) in wanted)
            and row[1].replace(".", "", 1).isdigit()]
    return sum(used) if used else None


def gpu_memory_sample(pid: int | None, source: str | None,
                      cuda_visible_devices: str | None) -> tuple[str, float] | None:
    """(source, MB): the server's own GPU memory ("process") where nvidia-smi shows it, else the
    visible devices' ("device"); a sampler that has a source keeps it, so a series never mixes."""
    if pid is not None and source in (None, "process"):
        mb = gpu_memory_mb(pid)
        if mb is not None:
            return "process", mb
    if source in (None, "device"):
        mb = device_memory_mb(cuda_visible_devices)
        if mb is not None:
            return "device", mb
    return None


class GpuSampler(threading.Thread):
    def __init__(self, pid: int | None, every: float = SAMPLE_EVERY_S, cuda_visible_devices: str | None = None):
        super().__init__(daemon=True)
        self.pid, self.every, self.cuda_visible_devices = pid, every, cuda_visible_devices
        self.samples: list[tuple[float, float]] = []
        self.source: str | None = None
        self.stop_event = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self.stop_event.wait(self.every):
            sample = gpu_memory_sample(self.pid, self.source, self.cuda_visible_devices)
            if sample is not None:
                self.source = sample[0]
                self.samples.append((time.monotonic() - self.t0, sample[1]))


def _growth_pct(summary: dict) -> float | None:
    base = summary.get("after_warmup")
    return round(100.0 * summary["growth_after_warmup"] / base, 3) if base else None


def _per(a: float, b: float, digits: int = 3) -> float | None:
    return round(a / b, digits) if b else None


def calibration_summary(report: dict) -> dict:
    """What the closed-loop phase measured. Requests count as sent less refused: refusals are
    saturation's, which the paced soak should not see, while cancels belong to the mix and so
    count (they deliver little audio, at any load)."""
    duration, audio = report["duration_s"], report["audio_seconds"]
    requests = report["sent"] - sum(report["refused"].values())
    done = report["outcomes"]["done"]
    return {"seconds": report["settings"]["seconds"], "duration_s": duration, "audio_seconds": audio,
            "audio_s_per_s": _per(audio, duration), "requests_per_s": _per(requests, duration),
            "audio_s_per_request": _per(audio, requests), "done_per_s": _per(done, duration),
            "audio_s_per_done": _per(audio, done), "sent": report["sent"], "requests": requests,
            "refused": report["refused"], "accepted": report["accepted"], "lost": report["accepted_but_unfinished"],
            "violations": report["protocol_violations"], "connection_errors": report["connection_errors"],
            "latency_ms": report["latency_ms"], "passed": passed(report)}


def paced_rate(calibration: dict, load: float) -> tuple[float, float] | None:
    """(target audio-s/s, requests/s that deliver it): `load` of the calibrated audio-s/s at
    the calibration's audio per request; None when the calibration delivered no audio."""
    audio, duration, requests = calibration["audio_seconds"], calibration["duration_s"], calibration["requests"]
    if not (audio > 0 and duration > 0 and requests > 0):
        return None
    return load * audio / duration, load * requests / duration


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.soak_gpu", description=__doc__.splitlines()[0],
                                     epilog="Arguments after `--` go to the `chorus serve` it starts.")
    parser.add_argument("--minutes", type=float, default=5.0, help="how long the soak sends (then it drains)")
    parser.add_argument("--clients", type=int, default=60)
    parser.add_argument("--inflight", type=int, default=2, help="most requests a client has outstanding")
    parser.add_argument("--cancel-rate", type=float, default=0.15)
    parser.add_argument("--num-steps", default="16,32")
    parser.add_argument("--calibrate-seconds", type=float, default=30.0,
                        help="closed-loop run that measures capacity first (0: skip, and soak saturated)")
    parser.add_argument("--load", type=float, default=0.8, help="share of the calibrated audio-s/s to soak at")
    parser.add_argument("--measured-throughput", type=float, default=None,
                        help="audio-s/s chorus bench measured on this GPU (to say what share this load is)")
    parser.add_argument("--out", default=None)
    return parser


def command_line(args: argparse.Namespace, serve_args: list[str], cuda_visible_devices: str | None) -> str:
    """The run spelled out in full (defaults too), so it reproduces even if defaults change."""
    cmd = ["python", "-m", "bench.soak_gpu", "--minutes", str(args.minutes), "--clients", str(args.clients),
           "--inflight", str(args.inflight), "--cancel-rate", str(args.cancel_rate), "--num-steps", args.num_steps,
           "--calibrate-seconds", str(args.calibrate_seconds), "--load", str(args.load)]
    if args.measured_throughput is not None:
        cmd += ["--measured-throughput", str(args.measured_throughput)]
    if args.out:
        cmd += ["--out", args.out]
    if serve_args:
        cmd += ["--", *serve_args]
    env = f"CUDA_VISIBLE_DEVICES={shlex.quote(cuda_visible_devices)} " if cuda_visible_devices is not None else ""
    return env + shlex.join(cmd)


def run_soak(url: str, pid: int | None, args: argparse.Namespace, cuda_visible_devices: str | None = None) -> dict:
    """Calibrate then soak against the server at `url` (`pid`: its process, for RSS and GPU
    memory); the soak's report with `calibration` and `summary`."""
    num_steps = [int(x) for x in args.num_steps.split(",") if x.strip()]
    calibration, rate, target = None, None, None
    if args.calibrate_seconds > 0:
        calibrated = asyncio.run(run_load(url, args.clients, args.calibrate_seconds, args.inflight, args.cancel_rate,
                                          pid, SEED, SAMPLE_EVERY_S, num_steps, None))
        calibration = calibration_summary(calibrated)
        paced = paced_rate(calibration, args.load)
        if paced is None:
            return {"calibration": calibration, "gpu_mem_source": None,
                    "summary": {"passed": False, "error": "the calibration delivered no audio", "commit": git_commit()}}
        target, rate = paced
        calibration["load"] = args.load
        calibration["soak_rate_per_s"] = round(rate, 3)
    sampler = GpuSampler(pid, cuda_visible_devices=cuda_visible_devices)
    sampler.start()
    try:
        result = asyncio.run(run_load(url, args.clients, args.minutes * 60.0, args.inflight, args.cancel_rate,
                                      pid, SEED, SAMPLE_EVERY_S, num_steps, None, rate))
    finally:
        sampler.stop_event.set()
        sampler.join(timeout=30)
    gpu = rss_summary(sampler.samples)
    delivered = result["audio_seconds"] / result["duration_s"] if result["duration_s"] else None
    calibrated_rate = calibration["audio_s_per_s"] if calibration else None
    result["calibration"] = calibration
    result["server_gpu_mem_mb"] = gpu
    result["gpu_mem_source"] = sampler.source
    result["summary"] = {
        "minutes": round(result["duration_s"] / 60.0, 2),
        "accepted": result["accepted"],
        "lost": result["accepted_but_unfinished"],
        "violations": result["protocol_violations"],
        "rss_growth_pct": _growth_pct(result["server_rss_mb"]),
        "gpu_mem_growth_pct": _growth_pct(gpu),
        "gpu_mem_source": sampler.source,
        "audio_s_per_s": round(delivered, 2) if delivered else None,
        "target_audio_s_per_s": round(target, 2) if target else None,
        "share_of_calibrated": round(delivered / calibrated_rate, 3) if delivered and calibrated_rate else None,
        "share_of_measured_throughput": (round(delivered / args.measured_throughput, 3)
                                         if delivered and args.measured_throughput else None),
        "sends_delayed_at_cap": result.get("sends_delayed_at_cap"),
        "passed": passed(result) and (calibration is None or calibration["passed"]),
        "commit": git_commit(),
    }
    return result


def main(argv: list[str] | None = None) -> int:
    argv, serve_args = split_serve_args(argv)
    args = build_parser().parse_args(argv)
    if args.load <= 0 or args.calibrate_seconds < 0:
        raise SystemExit("--load must be positive and --calibrate-seconds at least 0")
    cuda_visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES")  # the server inherits it
    scratch = Path(tempfile.mkdtemp(prefix="chorus-soak-"))
    server = ServerProcess(["--voices-dir", str(scratch / "voices"), "--log-level", "warning", *serve_args],
                           scratch / "server.log").start()
    try:
        result = run_soak(server.url, server.pid, args, cuda_visible_devices)
    finally:
        exit_status = server.stop(timeout=120)
    result["server_exit_status"] = exit_status
    result["summary"]["passed"] = result["summary"]["passed"] and exit_status == 0
    result["command"] = command_line(args, serve_args, cuda_visible_devices)
    emit_report(result, args.out)
    return 0 if result["summary"]["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
