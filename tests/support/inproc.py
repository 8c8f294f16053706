"""A real Chorus server inside the test process, for the tests that need no process of
their own: `create_app` on the suite's one shared, already-running engine (the tiny
checkpoint, `chorus serve`'s defaults), served by uvicorn with `chorus serve`'s settings
(`server.cli.run.http_server`) on a loopback socket, in a thread. Its flags go through the
real command line (`server.cli.main`). Clients talk to it exactly as to a process (websockets,
httpx, openai); what is saved is the process boot (imports, model load: ~6 s each).

Processes (`tests.support.serverproc`) stay where a process is the point: signals and the drain,
a restart of the process, the command line's own boot, fuzz liveness, the load tool and
the browser.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path

from server.cli.logs import KeyValueFormatter
from tests.support.waiting import poll_until

START_TIMEOUT_S = 60.0


class InProcessServer:
    def __init__(self, engine, model: Path, workdir: Path, *flags: str):
        from server.cli.main import build_parser, config_from_args
        from server.cli.run import resolve_model

        self.engine = engine
        self.workdir = Path(workdir)
        self.voices_dir = self.workdir / "voices"
        args = build_parser().parse_args(["serve", "--model", str(model), "--host", "127.0.0.1", "--port", "0",
                                          "--voices-dir", str(self.voices_dir), *flags])
        self.cfg = config_from_args(args)
        if "--api-key" not in flags:
            self.cfg.api_key = None  # as `tests.support.serverproc` drops CHORUS_API_KEY
        resolve_model(self.cfg)
        self.url = ""
        self._server = None
        self._thread: threading.Thread | None = None
        self._log_handler: logging.Handler | None = None
        self.log_path = self.workdir / "server.log"

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/v1/stream"

    def start(self) -> InProcessServer:
        from server.app import create_app
        from server.cli.run import bind_socket, http_server

        self.workdir.mkdir(parents=True, exist_ok=True)
        self._capture_log()
        sock = bind_socket("127.0.0.1", 0)
        self._server = server = http_server(create_app(self.cfg, engine=self.engine), self.cfg)
        failure: list[BaseException] = []

        def serve() -> None:
            try:
                asyncio.run(server.serve(sockets=[sock]))
            except BaseException as exc:  # noqa: BLE001 - reported by start()
                failure.append(exc)

        self._thread = threading.Thread(target=serve, name="inproc-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started:
            if failure or not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the in-process server did not start: {failure}\n{self.log()[-3000:]}")
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return self

    def _capture_log(self) -> None:
        """The `chorus.*` log lines while it runs, formatted as `chorus serve` writes them."""
        handler = logging.FileHandler(self.log_path)
        handler.setFormatter(KeyValueFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger = logging.getLogger("chorus")
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        self._log_handler = handler

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(60)
            assert not self._thread.is_alive(), "the in-process server did not stop"
        if self._log_handler is not None:
            logging.getLogger("chorus").removeHandler(self._log_handler)
            self._log_handler.close()
        self._server = self._thread = self._log_handler = None

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def wait_for(self, predicate, what: str, timeout: float = 60.0) -> None:
        """Poll `predicate()` until true (for effects that land a step later, e.g. a cancel)."""
        poll_until(predicate, what, timeout)
