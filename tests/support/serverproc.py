"""A real `chorus serve` subprocess on 127.0.0.1 for the tests that need a process of their
own (signals, restarts, replicas): `server.cli.launcher.ServerProcess` on a checkpoint, with a
voices folder and a log file under `workdir` for assertions and for reading when a test
fails. Tests that need no process use `tests.support.inproc` instead."""

from __future__ import annotations

import os
from pathlib import Path

from server.cli.launcher import ServerProcess
from tests.support.forkserver import ForkedLaunch
from tests.support.waiting import poll_until

REPO = Path(__file__).resolve().parents[2]


class LaunchedServer(ForkedLaunch, ServerProcess):
    """`server.cli.launcher.ServerProcess` with its child forked by `tests.support.forkserver`: the
    base of the tests' server launchers, and what a test puts in place of the launcher a tool
    uses (`chorus loadtest`)."""


class ChorusServer(LaunchedServer):
    def __init__(self, model: Path, workdir: Path, *args: str, env: dict[str, str] | None = None,
                 fd_limit: int | None = None, module: str = "server"):
        self.model = Path(model)
        self.workdir = Path(workdir)
        self.voices_dir = self.workdir / "voices"
        environ = dict(os.environ if env is None else env)
        environ.pop("CHORUS_API_KEY", None)
        # a test's own entry module (`module`) imports `tests`, from the repository root
        environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), environ.get("PYTHONPATH"))))
        super().__init__(["--model", str(self.model), "--voices-dir", str(self.voices_dir), *args],
                         self.workdir / "server.log", env=environ, fd_limit=fd_limit, module=module)

    def wait_for(self, predicate, what: str, timeout: float = 60.0) -> None:
        """Poll `predicate()` until true (for effects that land a step later, e.g. a cancel)."""
        poll_until(predicate, what, timeout)
