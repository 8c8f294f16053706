"""A `chorus serve` for a bench that runs against a server, and its report's `meta`: the benches
that take `--checkpoint` (start one) or `--url` (a running one) share both, and their `main`."""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from bench.metrics import emit_report
from server.cli.checkout import git_commit
from server.cli.launcher import ServerProcess
from server.loadtest.cli import split_serve_args


@contextmanager
def served(url: str | None, checkpoint: str | None, serve_args: list[str]) -> Iterator[str]:
    """The server's base URL: `url` as given, else a `chorus serve --model checkpoint` started
    here (its voices and log in a temporary folder) and stopped at the end."""
    if url:
        yield url.rstrip("/")
        return
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(["--model", str(checkpoint), "--voices-dir", str(Path(tmp) / "voices"),
                                "--log-level", "warning", *serve_args], Path(tmp) / "server.log").start()
        try:
            yield server.url
        finally:
            server.stop()


def gpu_name() -> str | None:
    """The GPU this machine's torch sees, or None (no GPU, or a client-only machine without torch)."""
    try:
        import torch

        return torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - torch missing: a client-only machine
        return None


def report_meta(module: str, argv: list[str], serve_args: list[str], gpu: str | None, started: float,
                settings: dict) -> dict:
    """What makes a result reproducible: the command as typed, the commit, the machine, the settings."""
    commit = git_commit(os.environ.get("CHORUS_COMMIT"))
    command = ["python", "-m", module, *argv, *(["--", *serve_args] if serve_args else [])]
    return {"command": shlex.join(command), "date_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "commit": commit, "machine": {"gpu": gpu, "cpus": os.cpu_count(), "host": platform.node(),
                                          "python": platform.python_version()},
            "minutes": round((time.perf_counter() - started) / 60, 2),
            "settings": {k: v for k, v in settings.items() if k != "url"}, "serve_args": serve_args}


def result_path(out: str | None, name: str, gpu: str | None) -> str:
    """`out`, else `bench/results/<date>-<gpu|cpu>-<name>.json`."""
    date = datetime.now(UTC)
    return out or str(Path(__file__).parent / "results" / f"{date:%Y-%m-%d}-{'gpu' if gpu else 'cpu'}-{name}.json")


def server_parser(module: str, description: str) -> argparse.ArgumentParser:
    """A bench's parser with its server: `--checkpoint` (start one) or `--url` (a running one)."""
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=description,
                                epilog="Arguments after `--` go to the `chorus serve` this starts.")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--checkpoint", help="the model folder the started server serves (`--model`)")
    where.add_argument("--url", help="a running server instead of starting one")
    return p


def run_served(module: str, name: str, argv: list[str] | None, parser: argparse.ArgumentParser,
               measure: Callable[[str, argparse.Namespace], dict],
               summary: Callable[[dict, str | None, str | None], dict]) -> int:
    """A bench's `main`: `measure` against the server, its `summary` and `meta` on top, written to
    `--out` (else `bench/results/<date>-<gpu|cpu>-<name>.json`)."""
    argv, serve_args = split_serve_args(argv)
    args = parser.parse_args(argv)
    t0, gpu = time.perf_counter(), gpu_name()
    with served(args.url, args.checkpoint, serve_args) as base:
        result = measure(base, args)
    meta = report_meta(module, argv, serve_args, gpu, t0, vars(args))
    report = {"summary": summary(result, gpu, meta["commit"]), "meta": meta, **result}
    emit_report(report, result_path(args.out, name, gpu))
    return 0
