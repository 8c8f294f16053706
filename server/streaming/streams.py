"""A connection's text streams: route `stream_*` frames to their `StreamSession`.

The connection keeps its ids unique across requests and streams and counts both against
its in-flight limit; this class answers the frames that name no open stream.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from server.config import StreamLimits
from server.streaming.session import StreamHost, StreamSession
from server.turns.service import SynthesisService
from server.voices.store import Owner
from server.wire import messages as p

RECENT_ENDS = 256  # ids of streams that ended lately: their late frames are dropped quietly


class ConnectionStreams:
    def __init__(self, service: SynthesisService, limits: StreamLimits, prefix: str, owner: Owner, *,
                 send: Callable, send_bytes: Callable[[bytes, float], None],
                 refuse: Callable[[str | None, str, str, str | None], None]):
        self.refuse = refuse
        self.host = StreamHost(service, limits, owner, prefix, send, send_bytes, self._ended)
        self.open: dict[str, StreamSession] = {}
        self._recent: deque[str] = deque(maxlen=RECENT_ENDS)

    def __contains__(self, stream_id: str) -> bool:
        return stream_id in self.open

    def __len__(self) -> int:
        return len(self.open)

    def start(self, msg: p.StreamOpen) -> None:
        """Open a stream (the connection has checked the id and its in-flight limit)."""
        session = StreamSession(msg, self.host)
        self.open[msg.id] = session
        if msg.id in self._recent:
            self._recent.remove(msg.id)
        session.start()

    def handle(self, msg: p.StreamAppend | p.StreamFlush | p.StreamClose) -> None:
        session = self.open.get(msg.id)
        if session is None:
            if msg.id not in self._recent:  # a late frame of a stream that just ended is no mistake
                self.refuse(msg.id, "invalid_request", f"id: no open stream {msg.id!r} on this connection", "id")
        elif isinstance(msg, p.StreamAppend):
            session.append(msg.text)
        elif isinstance(msg, p.StreamClose):
            session.close()
        else:
            session.flush()

    def cancel(self, stream_id: str) -> bool:
        """`cancel` for a stream; False when no stream has that id."""
        session = self.open.get(stream_id)
        if session is not None:
            session.cancel()
        return session is not None

    def cancel_all(self, reason: str | None = None) -> None:
        for session in list(self.open.values()):
            session.cancel(reason)

    def _ended(self, session: StreamSession) -> None:
        if self.open.get(session.id) is session:
            del self.open[session.id]
            self._recent.append(session.id)
