"""Server processes for the tests without paying for their imports each time: a fork server.

A `chorus serve` child spends most of its boot importing torch, transformers, OmniVoice and
Litestar. A helper (`python -m tests.support.forkserver NAME`)
imports those libraries once (never the project's own modules) and waits on an abstract unix
socket; each server is then a fork of it that runs `python -m MODULE ARGS` from there: its own
process (pid, signals, file-descriptor limit, environment, working folder, stdout and stderr),
which imports `server` and parses its command line as a new one does, and exits as one does.

`scripts/test.sh` starts one helper for all its phases and names it in
`CHORUS_TEST_FORKSERVER_AT` (and makes its checkpoint with `python -m tests.support.forkserver
--run NAME server make-checkpoint ...`); elsewhere a test process starts its own at its first
server.

`popen` returns a handle with `subprocess.Popen`'s methods the launchers use (`pid`, `stdout`,
`poll`, `wait`, `send_signal`, `terminate`, `kill`, `returncode`). It is a plain
`subprocess.Popen` (a fresh interpreter) instead when the helper runs another interpreter, when
the child's environment differs from the helper's in anything a library may read at import
(only `CHORUS_*`, `PYTEST_*`, `PYTHONPATH`, `PYTHONUNBUFFERED`, `PYTHONWARNINGS`,
`PYTHONDONTWRITEBYTECODE`, `TOKENIZERS_PARALLELISM` and the shell's and terminal's variables
may differ), when no helper can be had, or when `CHORUS_TEST_FORKSERVER=0`.

Standard library only: the client tests (`tests/clients`, an environment without torch) use
it with the server's interpreter.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What the helper imports: the libraries a server boot spends its time on. Never `server` or
# `tests` modules: each server imports those itself, in its own environment.
PRELOAD = ("torch", "numpy", "transformers", "omnivoice.models.omnivoice", "torchaudio", "triton", "litestar",
           "uvicorn", "websockets", "pydantic", "prometheus_client", "jinja2", "httpx", "yaml", "psutil", "msgspec",
           "soundfile", "safetensors", "accelerate")
# May differ between the helper and a child: no library reads them at import (the last six are
# the shell's and the terminal's).
MAY_DIFFER = ("PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONWARNINGS", "PYTHONDONTWRITEBYTECODE", "TOKENIZERS_PARALLELISM",
              "_", "SHLVL", "PWD", "OLDPWD", "COLUMNS", "LINES")
MAY_DIFFER_PREFIXES = ("CHORUS_", "PYTEST_")
SHARED = "CHORUS_TEST_FORKSERVER_AT"  # the name of a helper started for every test process (scripts/test.sh)
_MAX_MESSAGE = 1 << 20


def enabled() -> bool:
    return os.environ.get("CHORUS_TEST_FORKSERVER", "1") != "0"


def differences(env: dict[str, str], base: dict[str, str]) -> list[str]:
    """The variables of `env` that a fork of a process in `base` could not take on."""
    return sorted(k for k in set(env) | set(base) if env.get(k) != base.get(k)
                  and k not in MAY_DIFFER and not k.startswith(MAY_DIFFER_PREFIXES))


# ------------------------------------------------------------------------------ the test side

class _Helper:
    """A helper of this process's own (started at its first server, ended at its exit)."""

    def __init__(self, python: str):
        self.name = f"chorus-forkserver-{os.getpid()}-{secrets.token_hex(6)}"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), env.get("PYTHONPATH"))))
        self.proc = subprocess.Popen([python, "-m", "tests.support.forkserver", self.name], cwd=REPO, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"ready":  # its imports done, it listens
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError("the fork server did not start")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """Its end of the pipe closed, the helper exits."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


last_refusal: str | None = None  # why the latest `popen` started a fresh interpreter
_helpers: dict[str, _Helper | None] = {}
_helpers_lock = threading.Lock()


@atexit.register
def _close_helpers() -> None:
    for helper in _helpers.values():
        if helper is not None:
            helper.close()


def _helper_name(python: str) -> str | None:
    """The socket name of a helper for `python`: the shared one, else this process's own."""
    shared = os.environ.get(SHARED)
    if shared:
        return shared
    with _helpers_lock:
        helper = _helpers.get(python)
        if python not in _helpers or (helper is not None and not helper.alive()):
            try:
                helper = _helpers[python] = _Helper(python)
            except (OSError, RuntimeError):
                helper = _helpers[python] = None  # plain processes for the rest of this run
        return helper.name if helper is not None else None


class ForkedProcess:
    """A server forked by the helper: what the launchers use of `subprocess.Popen`."""

    def __init__(self, args: list[str], conn: socket.socket, pid: int, stdout):
        self.args = args
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None
        self._conn = conn  # the helper writes the exit status here
        self._lock = threading.Lock()

    def _receive(self, timeout: float | None) -> bool:
        """Wait up to `timeout` (None: for ever) for the helper's word that the process ended."""
        with self._lock:
            if self.returncode is not None:
                return True
            self._conn.settimeout(timeout)
            try:
                data = self._conn.recv(4096)
            except (TimeoutError, BlockingIOError):
                return False
            if not data:
                raise RuntimeError(f"the fork server went away before process {self.pid} ended")
            self.returncode = json.loads(data)["returncode"]
            self._conn.close()
            return True

    def poll(self) -> int | None:
        self._receive(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._receive(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def popen(cmd: list[str], module: str, args: list[str], *, env: dict[str, str], stderr, cwd=None,
          fd_limit: int | None = None):
    """`subprocess.Popen(cmd, cwd=cwd, env=env, stdout=PIPE, stderr=stderr)`, where `cmd` runs
    `python -m module *args` (under `fd_limit`, if given) with `cmd[0]` as the interpreter:
    forked by a helper of that interpreter when it may be, else that very call."""
    name = _helper_name(cmd[0]) if enabled() else None
    if name is not None:
        forked = _fork(name, cmd, module, args, env, stderr, cwd, fd_limit)
        if forked is not None:
            return forked
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=stderr)


def _fork(name: str, cmd, module, args, env, stderr, cwd, fd_limit, stdout: int | None = None) -> ForkedProcess | None:
    """The fork, or None where the helper refused it or was not there. Its stdout is a pipe to
    this process (`ForkedProcess.stdout`), or the descriptor `stdout`."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    read_end, write_end = os.pipe() if stdout is None else (None, stdout)
    request = {"python": os.path.abspath(cmd[0]), "module": module, "args": list(args), "env": env,
               "cwd": os.fspath(cwd or os.getcwd()), "fd_limit": fd_limit}
    try:
        conn.connect("\0" + name)
        err_fd = stderr if isinstance(stderr, int) else stderr.fileno()
        socket.send_fds(conn, [json.dumps(request).encode()], [write_end, err_fd])
        reply = json.loads(conn.recv(4096) or b"{}")
    except (OSError, ValueError):
        reply = {}
    if read_end is not None:
        os.close(write_end)  # the child has its own copy (through the socket), or there is no child
    if "pid" not in reply:  # refused (another interpreter or environment), or no helper there
        global last_refusal
        last_refusal = reply.get("refused", "no helper answered")
        conn.close()
        if read_end is not None:
            os.close(read_end)
        return None
    return ForkedProcess(cmd, conn, reply["pid"], None if read_end is None else os.fdopen(read_end, "rb"))


def run(name: str, module: str, args: list[str]) -> int:
    """`python -m MODULE ARGS` forked by the helper `name`, with this process's stdout, stderr,
    environment and working folder; its exit status as a shell gives it. Without the helper
    (or refused by it), this process becomes that command."""
    cmd = [sys.executable, "-m", module, *args]
    forked = _fork(name, cmd, module, args, dict(os.environ), 2, None, None, stdout=1)
    if forked is None:
        os.execv(sys.executable, cmd)
    code = forked.wait()
    return 128 - code if code < 0 else code


class ForkedLaunch:
    """For subclasses of `server.cli.launcher.ServerProcess`: the child comes from the fork server
    (`cmd` is `[python, "-m" or "-c", ..., *args]`)."""

    def _popen(self, cmd: list[str], env: dict[str, str]):
        return popen(cmd, self.module, cmd[3:], env=env, stderr=self._log, cwd=self.cwd,  # type: ignore[attr-defined]
                     fd_limit=self.fd_limit)  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------ the helper

def _child(request: dict, fds: list[int], base_path: list[str], base_env: dict[str, str]) -> None:
    """In the forked child: become `python -m MODULE ARGS` and exit as it would."""
    import io
    import runpy
    import traceback

    try:
        out_fd, err_fd = fds
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.closerange(3, 65536)  # as `subprocess.Popen(close_fds=True)`: the helper's sockets too
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        env = request["env"]
        unbuffered = bool(env.get("PYTHONUNBUFFERED"))
        encoding = sys.stdout.encoding
        out_raw = io.FileIO(1, "w", closefd=False)
        err_raw = io.FileIO(2, "w", closefd=False)
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(out_raw if unbuffered else io.BufferedWriter(out_raw),
                                                       encoding=encoding, write_through=unbuffered)
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(err_raw if unbuffered else io.BufferedWriter(err_raw),
                                                       encoding=encoding, errors="backslashreplace",
                                                       line_buffering=True, write_through=unbuffered)
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                                                     encoding=encoding)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(env)
        if request["fd_limit"] is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, (request["fd_limit"], request["fd_limit"]))
        # `python -m`'s path: the working folder, PYTHONPATH, then the interpreter's own
        own = sys.path[1 + len(base_path):]
        extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [request["cwd"], *extra, *own]
        warn = [o for o in env.get("PYTHONWARNINGS", "").split(",") if o]
        if warn != [o for o in base_env.get("PYTHONWARNINGS", "").split(",") if o]:
            import warnings  # what the interpreter makes of PYTHONWARNINGS at its start

            sys.warnoptions[:] = warn
            warnings._processoptions(warn)
        sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()  # a new process's global generator is seeded anew
        sys.argv = ["-m", *request["args"]]
    except BaseException:  # noqa: BLE001 - reported on the child's stderr
        traceback.print_exc()
        os._exit(1)
    code = 0
    try:
        runpy._run_module_as_main(request["module"], alter_argv=True)  # what `python -m` runs
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:  # noqa: BLE001 - as the interpreter reports an uncaught exception
        traceback.print_exc()
        code = 1
    try:  # the interpreter's own way out: its threads, then atexit, then the streams
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - exiting anyway
        pass
    if code == -signal.SIGINT:  # as the interpreter ends on an uncaught KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


def _refusal(request: dict, base_env: dict[str, str]) -> str | None:
    if os.path.abspath(request["python"]) != os.path.abspath(sys.executable):
        return f"this helper runs {sys.executable}"
    differ = differences(request["env"], base_env)
    return f"the environment differs in {', '.join(differ)}" if differ else None


def _as_imported(env: dict[str, str], before: dict[str, str], after: dict[str, str]) -> dict[str, str]:
    """`env` as the preloaded imports would have left it in a new process: what they set
    (torch's TORCHINDUCTOR_CACHE_DIR) where `env` does not say otherwise."""
    made = {k: v for k, v in after.items() if before.get(k) != v}
    return {**made, **env}


def _serve(name: str) -> None:
    import gc
    import importlib
    import selectors

    before = dict(os.environ)
    for library in PRELOAD:
        try:
            importlib.import_module(library)
        except Exception:  # noqa: BLE001 - a library this environment lacks is imported by no server
            continue
    base_env = dict(os.environ)
    base_path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    gc.collect()
    gc.freeze()  # what the children share stays shared
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind("\0" + name)
    listener.listen(64)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "owner")
    children: dict[int, tuple[socket.socket, int]] = {}  # pidfd -> (connection, pid)
    while True:
        for key, _ in selector.select():
            if key.data == "owner":  # whoever started it closed its end (or exited): servers left go too
                for _, pid in children.values():
                    os.kill(pid, signal.SIGKILL)
                os._exit(0)
            if key.data == "accept":
                conn, _ = listener.accept()
                try:
                    message, fds, _, _ = socket.recv_fds(conn, _MAX_MESSAGE, 2)
                    request = json.loads(message)
                    request["env"] = _as_imported(request["env"], before, base_env)
                except (OSError, ValueError, KeyError, TypeError):
                    conn.close()
                    continue
                refused = _refusal(request, base_env)
                pid = os.fork() if refused is None else -1
                if pid == 0:
                    _child(request, fds, base_path, base_env)
                for fd in fds:
                    os.close(fd)
                if refused is not None:
                    conn.send(json.dumps({"refused": refused}).encode())
                    conn.close()
                    continue
                pidfd = os.pidfd_open(pid)
                children[pidfd] = (conn, pid)
                selector.register(pidfd, selectors.EVENT_READ, "child")
                conn.send(json.dumps({"pid": pid}).encode())
            elif key.data == "child":
                conn, pid = children.pop(key.fd)
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                try:
                    conn.send(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode())
                except OSError:
                    pass
                conn.close()


if __name__ == "__main__":
    if sys.argv[1] == "--run":  # --run NAME MODULE ARGS...: `python -m MODULE ARGS` through helper NAME
        sys.exit(run(sys.argv[2], sys.argv[3], sys.argv[4:]))
    _serve(sys.argv[1])
