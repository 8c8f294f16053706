"""`chorus serve` as a child process for the client tests, run by the server's own
interpreter: the client, Pipecat and LiveKit Agents live in an environment of their own
(no torch), so these tests never import `server`. `CHORUS_SERVER_PYTHON` names that
interpreter (default: the project's `.venv`, else this one)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

from tests.support import forkserver

ROOT = Path(__file__).resolve().parents[2]
READY_LINE = re.compile(r"Chorus listening on (http://\S+)")


def server_python() -> str:
    named = os.environ.get("CHORUS_SERVER_PYTHON")
    if named:
        return named
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def server_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CHORUS_API_KEY"}
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    return env


def make_checkpoint(out: Path) -> Path:
    subprocess.run([server_python(), "-m", "server", "make-checkpoint", "--size", "tiny", "--out", str(out)],
                   cwd=ROOT, env=server_env(), check=True, capture_output=True)
    return out


class ChorusProcess:
    """One `chorus serve` on loopback; `url` once its ready line is printed."""

    def __init__(self, model: Path, workdir: Path, *flags: str, port: int = 0):
        self.model, self.workdir, self.flags, self.port = model, Path(workdir), flags, port
        self.log_path = self.workdir / "server.log"
        self.url = ""
        self.proc: subprocess.Popen | forkserver.ForkedProcess | None = None

    def start(self, timeout: float = 180.0) -> ChorusProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cmd = [server_python(), "-m", "server", "serve", "--model", str(self.model), "--host", "127.0.0.1",
               "--port", str(self.port), "--voices-dir", str(self.workdir / "voices"), *self.flags]
        self.url = ""
        log = open(self.log_path, "ab")  # noqa: SIM115 - open while the process runs
        # forked from a helper that has the server's libraries imported (`tests.support.forkserver`)
        self.proc = forkserver.popen(cmd, "server", cmd[3:], env=server_env(), stderr=log, cwd=ROOT)
        ready = threading.Event()

        def pump() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                match = READY_LINE.search(line.decode(errors="replace"))
                if match and not self.url:
                    self.url = match.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(timeout) or not self.url:
            self.stop()
            raise RuntimeError(f"chorus serve did not start:\n{self.log()[-4000:]}")
        self.port = int(self.url.rsplit(":", 1)[1])
        return self

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/v1/stream"

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
