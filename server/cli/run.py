"""Boot: resolve the model, build the app, bind, and announce the address once ready;
on SIGTERM/SIGINT, drain before stopping.

uvicorn's own signal handling would close every WebSocket (1012) before the app hears of
the shutdown, then re-raise the signal (exit status 143). Chorus takes the signals itself:
the first one drains the app (`server.app.drain`: not ready, no new work, in-flight
requests finish up to `--drain-seconds`, the rest are cancelled and told so) and only then
lets uvicorn stop; a second one cuts the drain short; a third stops at once. The process
exits with status 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket

import uvicorn

from server.app import create_app, drain, load_engines
from server.checkpoint import ensure_demo_checkpoint, is_random_checkpoint
from server.cli.boot_checks import (
    StartupError,
    bind_error,
    check_aligner,
    check_device,
    check_model,
    check_voices_dir,
)
from server.config import ServerConfig
from server.engine.upstream import check_upstream
from server.net.accept_log import AcceptErrorLog
from server.net.http import guarded_http_protocol
from server.net.limits import NetLimits, connection_cap, fd_soft_limit
from server.net.websocket import guarded_ws_protocol

log = logging.getLogger("chorus")


def resolve_model(cfg: ServerConfig) -> None:
    """Fill `cfg.model`; with none named, make (once) and serve the tiny random demo."""
    if not cfg.model:
        cfg.model = str(ensure_demo_checkpoint())
        cfg.demo_model = True
    else:
        cfg.demo_model = is_random_checkpoint(cfg.model)
    cfg.model_name = cfg.model.rstrip("/").split("/")[-1] if not cfg.demo_model else "omnivoice-random-demo"
    if cfg.demo_model:
        log.warning(
            "*** serving a RANDOM-WEIGHT demo checkpoint (%s): its audio is noise. "
            "Pass --model k2-fsa/OmniVoice (or a local folder) for real speech. ***",
            cfg.model,
        )


def net_limits(cfg: ServerConfig) -> NetLimits:
    cap, backlog = connection_cap(cfg.max_connections)
    if cfg.max_connections and cap < cfg.max_connections:
        log.warning("--max-connections %d lowered to %d: the file descriptor limit is %d",
                    cfg.max_connections, cap, fd_soft_limit())
    return NetLimits(cap, cfg.header_timeout, cfg.body_timeout, cfg.send_timeout, backlog,
                     cfg.max_connections_per_client)


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket, made as TCP by name: asyncio turns Nagle's algorithm off
    (`TCP_NODELAY`) only on sockets whose protocol says TCP, and an accepted socket takes its
    listener's. With Nagle on, a response's body waits behind its headers for the peer's
    delayed acknowledgement on every keep-alive request after the first."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(2048)
    sock.setblocking(False)
    return sock


async def _announce_when_started(server: uvicorn.Server, host: str, port: int) -> None:
    while not server.started:
        if server.should_exit:
            return
        await asyncio.sleep(0.02)
    shown = f"[{host}]" if ":" in host else host
    print(f"Chorus listening on http://{shown}:{port}", flush=True)


class _Server(uvicorn.Server):
    """uvicorn, minus its signal handling (Chorus drains first; see the module doc)."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def http_server(app, cfg: ServerConfig) -> uvicorn.Server:
    """uvicorn with Chorus's settings, serving `app` (started by `_serve_async`, or in a
    thread by the test suite's in-process server)."""
    limits = net_limits(cfg)
    log.info("connections: at most %d open (file descriptor limit %d)", limits.max_connections, fd_soft_limit())
    # No permessage-deflate: audio does not compress, and deflating a large frame costs the
    # event loop's time on each side before the first sample is heard.
    uv_config = uvicorn.Config(app, log_level="warning", lifespan="on", ws_max_size=cfg.max_frame_bytes,
                               ws_per_message_deflate=False, timeout_graceful_shutdown=30,
                               http=guarded_http_protocol(limits), ws=guarded_ws_protocol(limits),
                               backlog=limits.backlog)
    return _Server(uv_config)


class _Shutdown:
    """What SIGTERM/SIGINT do: drain once, hurry on the second, force on the third."""

    def __init__(self, server: uvicorn.Server, app, drain_seconds: float):
        self.server = server
        self.app = app
        self.drain_seconds = drain_seconds
        self.hurry = asyncio.Event()
        self.signals = 0
        self.task: asyncio.Task | None = None

    def on_signal(self, sig: signal.Signals) -> None:
        self.signals += 1
        if self.signals == 1:
            log.info("%s: shutting down (draining up to %.0f s; send it again to cancel what is left now)",
                     sig.name, self.drain_seconds)
            self.task = asyncio.get_running_loop().create_task(self._drain())
        elif self.signals == 2:
            log.warning("%s again: cancelling what is left", sig.name)
            self.hurry.set()
        else:
            log.warning("%s a third time: stopping now", sig.name)
            self.server.force_exit = True
            self.server.should_exit = True

    async def _drain(self) -> None:
        try:
            await drain(self.app, self.drain_seconds, self.hurry)
        except Exception:  # stop anyway
            log.exception("draining failed")
        finally:
            self.server.should_exit = True


async def load(cfg: ServerConfig):
    """The engines, loaded before the server starts: a model that fails to load is one line."""
    try:
        return await load_engines(cfg)
    except Exception as exc:  # any failure to load is the model's
        log.debug("loading the model failed", exc_info=True)
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise StartupError(f"--model {cfg.model}: could not load it ({reason})") from exc


async def serve_app(cfg: ServerConfig, sock: socket.socket, app) -> None:
    """Serve `app` on `sock` until a signal's drain ends: uvicorn with Chorus's settings, the
    signals taken here, the listening line once it accepts."""
    server = http_server(app, cfg)
    shutdown = _Shutdown(server, app, cfg.drain_seconds)
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(AcceptErrorLog())
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, shutdown.on_signal, sig)
    port = sock.getsockname()[1]
    announcer = asyncio.create_task(_announce_when_started(server, cfg.host, port))
    try:
        await server.serve(sockets=[sock])
    finally:
        announcer.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if shutdown.task is not None and not shutdown.task.done():
            shutdown.task.cancel()


def prepare(cfg: ServerConfig) -> socket.socket:
    """Check what is cheap to check first (the model folder, the voices folder, the port), then
    the device and the reference's names; the bound socket (the caller closes it)."""
    if cfg.model:
        check_model(cfg.model)
    if not cfg.voices_db:
        check_voices_dir(cfg.voices_dir)
    if cfg.aligner:
        check_aligner(cfg.aligner)
    try:
        sock = bind_socket(cfg.host, cfg.port)
    except OSError as exc:
        raise bind_error(cfg.host, cfg.port, exc) from exc
    try:
        check_device(cfg.engine.device)
        report = check_upstream()
        log.info("omnivoice %s: all %d private names Chorus relies on are present", report.version,
                 report.checked)
        resolve_model(cfg)
    except BaseException:
        sock.close()
        raise
    return sock


async def load_and_serve(cfg: ServerConfig, sock: socket.socket) -> None:
    engine = await load(cfg)
    await serve_app(cfg, sock, create_app(cfg, engine, owns_engine=True))


def serve(cfg: ServerConfig) -> int:
    """`chorus serve`: check, load the model, serve until a signal's drain ends."""
    sock = prepare(cfg)
    try:
        asyncio.run(load_and_serve(cfg, sock))
    finally:
        sock.close()
    log.info("stopped")
    return 0
