"""Boot: resolve the model, build the app, bind, and announce the address once ready."""

from __future__ import annotations

import asyncio
import logging
import socket

import uvicorn

from server.config import ServerConfig

log = logging.getLogger("chorus")


def resolve_model(cfg: ServerConfig) -> None:
    """Fill `cfg.model`; with none named, make (once) and serve the tiny random demo."""
    from server.checkpoint import ensure_demo_checkpoint, is_random_checkpoint

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


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
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


async def _serve_async(cfg: ServerConfig, sock: socket.socket) -> None:
    from server.app import create_app

    app = create_app(cfg)
    uv_config = uvicorn.Config(app, log_level="warning", lifespan="on", ws_max_size=16 * 1024 * 1024,
                               timeout_graceful_shutdown=30)
    server = uvicorn.Server(uv_config)
    port = sock.getsockname()[1]
    announcer = asyncio.create_task(_announce_when_started(server, cfg.host, port))
    try:
        await server.serve(sockets=[sock])
    finally:
        announcer.cancel()


def serve(cfg: ServerConfig) -> int:
    from server.engine.upstream import check_upstream

    report = check_upstream()
    log.info("omnivoice %s: all %d private names Chorus relies on are present", report.version, report.checked)
    resolve_model(cfg)
    sock = bind_socket(cfg.host, cfg.port)
    asyncio.run(_serve_async(cfg, sock))
    return 0
