"""A real `chorus serve` subprocess on 127.0.0.1, for integration tests.

Started with `--port 0`; the URL comes from the `Chorus listening on ...` line it prints
once it takes requests. Its stderr (the log) is kept in a file for assertions and for
reading when a test fails.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

READY_LINE = re.compile(r"Chorus listening on (http://127\.0\.0\.1:\d+)")
START_TIMEOUT_S = 180.0


class ChorusServer:
    def __init__(self, model: Path, workdir: Path, *args: str):
        self.model = Path(model)
        self.workdir = Path(workdir)
        self.voices_dir = self.workdir / "voices"
        self.args = list(args)
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self._starts = 0

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/v1/stream"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"server-{self._starts}.log"

    def start(self) -> "ChorusServer":
        self._starts += 1
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
        env.pop("CHORUS_API_KEY", None)
        cmd = [sys.executable, "-m", "server", "serve", "--model", str(self.model), "--host", "127.0.0.1",
               "--port", "0", "--voices-dir", str(self.voices_dir), *self.args]
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, text=True, env=env)
        line = self._first_line()
        match = READY_LINE.search(line)
        if not match:
            self.stop()
            raise RuntimeError(f"chorus serve did not start (printed {line!r}); log:\n{self.log()}")
        self.url = match.group(1)
        return self

    def _first_line(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(START_TIMEOUT_S)
        return result[0] if result else ""

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()
        self.proc = None

    def restart(self) -> "ChorusServer":
        self.stop()
        return self.start()

    def wait_for(self, predicate, what: str, timeout: float = 60.0) -> None:
        """Poll `predicate()` until true (for effects that land a step later, e.g. a cancel)."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not seen within {timeout:.0f}s")
            time.sleep(0.05)
