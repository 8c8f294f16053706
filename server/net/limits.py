"""The numbers the connection guards enforce, and the connection cap's default."""

from __future__ import annotations

import resource
from dataclasses import dataclass

DEFAULT_MAX_CONNECTIONS = 4096


@dataclass(frozen=True)
class NetLimits:
    max_connections: int
    header_timeout: float  # s from a request's first byte (or the connect) to its last header
    body_timeout: float  # s from the last header to the body's last byte
    send_timeout: float  # s a peer may take none of what we send (also while closing)
    backlog: int = 2048  # listen queue, and the most sockets asyncio accepts in one go
    max_connections_per_client: int | None = None  # one peer address; None: a quarter of max_connections


def per_client_cap(max_connections: int, requested: int | None) -> int:
    """Connections one peer address may hold: `requested`, else a quarter of the cap (at
    least one), never more than the cap."""
    return min(max_connections, requested or max(1, max_connections // 4))


def fd_soft_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def connection_cap(requested: int | None, fd_limit: int | None = None) -> tuple[int, int]:
    """(connections, backlog): `requested` connections (default 4096), but always below the
    file-descriptor limit with headroom for what else the process opens (model files, the
    voice index, worker pipes, logs: an eighth of the limit, at least 64) and for one burst of
    accepts (asyncio accepts up to `backlog` sockets before the refused ones are closed)."""
    fd_limit = fd_soft_limit() if fd_limit is None else fd_limit
    reserve = max(64, fd_limit // 8)
    backlog = min(2048, max(128, reserve))
    room = fd_limit - reserve - backlog
    if room < 1:
        raise ValueError(f"the file descriptor limit ({fd_limit}) leaves no room for connections; raise `ulimit -n`")
    return min(requested or DEFAULT_MAX_CONNECTIONS, room), backlog
