"""Connection slots shared fairly: a cap per peer address, and room for health probes.

One client must not take every connection slot: each peer address may hold at most
`--max-connections-per-client` open connections (HTTP and WebSocket together). A socket
past either cap is not refused outright while a few *health slots* are free: it may carry
one `GET /healthz`, `/readyz` or `/metrics` (then it is closed), so a liveness probe never
restarts a healthy server whoever holds the slots; anything else on it gets `503 busy`.
Health slots are few, and few per address, so they cannot be held by one client either.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

HEALTH_SLOTS = 16  # sockets past the caps that may carry one health request, all peers together
HEALTH_SLOTS_PER_PEER = 2
HEALTH_LINE = re.compile(rb"(?:GET|HEAD) /(?:healthz|readyz|metrics)(?:\?[^ ]*)? HTTP/1\.[01]\r\n")
MAX_REQUEST_LINE = 512  # bytes a health-only socket may send before its request line ends

Admission = Literal["open", "health", "refused"]


@dataclass
class PeerSlots:
    max_connections: int
    max_per_peer: int
    open: Counter[str] = field(default_factory=Counter)  # connections counted against the caps
    health: Counter[str] = field(default_factory=Counter)  # health-only sockets

    def admit(self, peer: str) -> Admission:
        """Take a slot for a new socket from `peer`: a normal one, a health-only one, or none."""
        if self.open.total() < self.max_connections and self.open[peer] < self.max_per_peer:
            self.open[peer] += 1
            return "open"
        if self.health.total() < HEALTH_SLOTS and self.health[peer] < HEALTH_SLOTS_PER_PEER:
            self.health[peer] += 1
            return "health"
        return "refused"

    def release(self, peer: str, admission: Admission) -> None:
        counts = self.open if admission == "open" else self.health if admission == "health" else None
        if counts is not None:
            counts[peer] -= 1
            if counts[peer] <= 0:
                del counts[peer]


def peer_of(transport) -> str:
    """The peer's address (no port): what the per-client caps count by."""
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, (tuple, list)) and peer else "?"
