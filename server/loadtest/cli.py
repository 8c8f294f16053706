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
import sys
import tempfile
from pathlib import Path

from server.cli.checkout import git_commit
from server.cli.launcher import ServerProcess
from server.cli.values import integer, positive_float, positive_int, share
from server.loadtest.clients import run_load
from server.loadtest.report import passed


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chorus loadtest", description=__doc__.splitlines()[0],
        epilog="Arguments after `--` go to the `chorus serve` this command starts (without --url).")
    parser.add_argument("--url", default=None, help="a running server's base URL (default: start one on loopback)")
    parser.add_argument("--server-pid", type=positive_int, default=None, help="PID whose RSS to sample (with --url)")
    parser.add_argument("--clients", type=positive_int, default=50)
    parser.add_argument("--seconds", type=positive_float, default=30.0, help="how long clients send (then they drain)")
    parser.add_argument("--inflight", type=positive_int, default=2, help="requests each client keeps in flight")
    parser.add_argument("--cancel-rate", type=share, default=0.15, help="share of requests cancelled soon after")
    parser.add_argument("--num-steps", default="4,8,16", help="step counts to pick from (comma-separated)")
    parser.add_argument("--seed", type=integer, default=0)
    parser.add_argument("--rss-every", type=positive_float, default=1.0, help="seconds between RSS samples")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--server-log", default=None, help="the started server's log (default: a temporary file)")
    parser.add_argument("--out", default=None, help="also write the JSON report here")
    return parser


def split_serve_args(argv: list[str] | None) -> tuple[list[str], list[str]]:
    """A load tool's own arguments, and those after `--` for the `chorus serve` it starts."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def main(argv: list[str] | None = None) -> int:
    argv, serve_args = split_serve_args(argv)
    args = build_parser().parse_args(argv)
    num_steps = [int(x) for x in args.num_steps.split(",") if x.strip()]

    server = None
    url, pid = args.url, args.server_pid
    scratch = tempfile.TemporaryDirectory(prefix="chorus-loadtest-")
    if url is None:
        if args.api_key:
            serve_args = ["--api-key", args.api_key, *serve_args]
        log_path = Path(args.server_log) if args.server_log else Path(scratch.name) / "server.log"
        server = ServerProcess(["--voices-dir", str(Path(scratch.name) / "voices"), "--log-level", "warning",
                                *serve_args], log_path).start()
        url, pid = server.url, server.pid
    try:
        result = asyncio.run(run_load(url, args.clients, args.seconds, args.inflight, args.cancel_rate, pid,
                                      args.seed, args.rss_every, num_steps, args.api_key))
    finally:
        exit_status = server.stop(timeout=120) if server is not None else None
        scratch.cleanup()
    if server is not None:
        result["server_exit_status"] = exit_status
    shown = ["chorus", "loadtest", *argv, *(["--", *serve_args] if serve_args and args.url is None else [])]
    result["command"] = " ".join(shown)
    result["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
    result["commit"] = git_commit()
    result["passed"] = passed(result) and result.get("server_exit_status", 0) == 0
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
