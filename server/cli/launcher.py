"""`python -m server serve ...` as a child process: started on loopback, ready once it
prints `Chorus listening on URL`, its stdout and stderr kept in one log file, stopped with
SIGTERM (the graceful drain) and killed only if that hangs.

The one launcher of the test suite, the browser tests and `chorus loadtest`.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

READY_LINE = re.compile(r"Chorus listening on (http://\S+)")
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0
# `python -c` with this instead of `-m server` when the process gets a file-descriptor limit
_LIMITED = ("import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_NOFILE, ({0}, {0})); "
            "sys.argv[0] = '{1}'; runpy.run_module('{1}', run_name='__main__')")


class ServerStartError(RuntimeError):
    """The server exited, or printed no ready line in time; the message ends with its log."""


class ServerProcess:
    """One `chorus serve` child. `args` are the serve flags; `--host`/`--port` are added
    (port 0 at first, the same port again on `restart`). `fd_limit` caps its open files
    (RLIMIT_NOFILE, soft and hard). `module` is what `python -m` runs (a test's own entry
    module may build the app with what it injects)."""

    def __init__(self, args: list[str], log_path: Path, *, env: dict[str, str] | None = None,
                 cwd: Path | None = None, port: int = 0, fd_limit: int | None = None,
                 module: str = "server"):
        self.args = list(args)
        self.log_path = Path(log_path)
        self.env = dict(os.environ if env is None else env)
        self.cwd = cwd
        self.port = port
        self.fd_limit = fd_limit
        self.module = module
        self.url = ""
        self.proc: subprocess.Popen | None = None
        self._log = None
        self._ready = threading.Event()
        self._pump_thread: threading.Thread | None = None
        self._log_start = 0  # where the latest start's lines begin in the log file

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/v1/stream"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = START_TIMEOUT_S) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(self.env, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
        launch = ["-m", self.module] if self.fd_limit is None else ["-c", _LIMITED.format(self.fd_limit, self.module)]
        cmd = [sys.executable, *launch, "serve", "--host", "127.0.0.1", "--port", str(self.port), *self.args]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - open while the process runs; a restart appends
        self._log_start = self._log.tell()
        self._ready.clear()
        self.url = ""
        self.proc = self._popen(cmd, env)
        self._pump_thread = threading.Thread(target=self._pump, args=(self.proc, self._log), daemon=True)
        self._pump_thread.start()
        if not self._ready.wait(timeout) or not self.url:
            self.stop()
            raise ServerStartError(f"chorus serve did not start within {timeout:.0f} s; its log "
                                   f"({self.log_path}):\n{self.log()[-4000:]}")
        self.port = int(self.url.rsplit(":", 1)[1])
        return self

    def _popen(self, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        """The child itself: stdout piped here (for the ready line), stderr into the log."""
        return subprocess.Popen(cmd, cwd=self.cwd, env=env, stdout=subprocess.PIPE, stderr=self._log)

    def _pump(self, proc: subprocess.Popen, log) -> None:
        """Copy stdout into the log, noting the ready line; `_ready` is set at the line or at exit."""
        assert proc.stdout is not None
        with proc.stdout:
            for raw in proc.stdout:
                log.write(raw)
                log.flush()
                found = READY_LINE.search(raw.decode(errors="replace"))
                if found and not self._ready.is_set():
                    self.url = found.group(1).rstrip("/")
                    self._ready.set()
        self._ready.set()

    def send_signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float | None = None) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM and wait (kill if it hangs); the exit status, or None if never started."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        status = self.proc.returncode
        if self._pump_thread is not None:
            self._pump_thread.join(10)  # ends at the pipe's end, once the process is gone
        if self._log is not None:
            self._log.close()
        self.proc = None
        return status

    def restart(self) -> ServerProcess:
        """Stop, then start again on the same port with the same flags."""
        self.stop()
        return self.start()

    def log(self) -> str:
        """What the latest start logged (earlier starts' lines stay in the file above it)."""
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(self._log_start)
            return f.read().decode(errors="replace")
