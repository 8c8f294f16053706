"""`chorus serve`'s connection flags (`server.net`): caps, per-client shares, deadlines."""

from __future__ import annotations

import argparse

from server.cli_values import positive_float, positive_int, size
from server.config import ServerConfig


def add_connection_flags(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--max-connections", type=positive_int, default=None,
                       help="open HTTP and WebSocket connections; more are answered 503 and closed (default 4096, "
                            "and always at most the file descriptor limit less an eighth, at least 64)")
    serve.add_argument("--max-connections-per-client", type=positive_int, default=None,
                       help="open connections one client address may hold; more get 503 busy (default: a quarter "
                            "of --max-connections; behind a proxy every client has its address: raise it). "
                            "Health requests are still answered past either cap")
    serve.add_argument("--header-timeout", type=positive_float, default=10.0,
                       help="seconds a request's headers may take to arrive, from its first byte or the connect; "
                            "then 408 and close (default 10)")
    serve.add_argument("--body-timeout", type=positive_float, default=60.0,
                       help="seconds a request body may take to arrive after its headers; then 408 and close "
                            "(default 60)")
    serve.add_argument("--send-timeout", type=positive_float, default=30.0,
                       help="seconds a client may take none of what the server sends (audio, or a close) before "
                            "its connection is dropped and its requests cancelled (default 30)")
    serve.add_argument("--max-bodies-bytes", type=size, default="128M",
                       help="HTTP request bodies held at once, all requests together, counted as their bytes "
                            "arrive; beyond, 503 busy (default 128M)")
    serve.add_argument("--max-bodies-bytes-per-client", type=size, default=None,
                       help="HTTP request bodies one client address may hold at once; beyond, 503 busy (default: "
                            "a quarter of --max-bodies-bytes, at least one largest body)")
    serve.add_argument("--max-outbox-bytes", type=size, default="32M",
                       help="frames queued for one WebSocket and not yet sent; beyond, new requests on it get busy "
                            "and past --send-timeout it is closed (1008) (default 32M)")


def apply_connection_flags(cfg: ServerConfig, args: argparse.Namespace) -> None:
    cfg.max_connections = args.max_connections
    cfg.max_connections_per_client = args.max_connections_per_client
    cfg.header_timeout, cfg.body_timeout, cfg.send_timeout = args.header_timeout, args.body_timeout, args.send_timeout
    cfg.max_bodies_bytes = args.max_bodies_bytes
    cfg.max_bodies_bytes_per_client = args.max_bodies_bytes_per_client
    cfg.max_outbox_bytes = args.max_outbox_bytes
