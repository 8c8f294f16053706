"""A `chorus serve` for a bench that runs against a server, and its report's `meta`: the benches
that take `--checkpoint` (start one) or `--url` (a running one) share both."""

from __future__ import annotations

import os
import platform
import shlex
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from server.cli.checkout import git_commit
from server.cli.launcher import ServerProcess


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
