"""A chained request's later chunks (no voice: chunk 0 becomes their reference), built only once
chunk 0's audio is out.

When the scheduler holds other work until a due chunk's audio is out, the later chunks' build
(tokenising, copies) would hold the interpreter lock that the decode, the post-processing and the
send of that audio need, for chunks that could not step before that audio anyway. So they wait for
chunk 0's `ChunkDecoded`, then `AUDIO_OUT_S` more for its audio to leave.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from server.engine.types import VoicePrompt
from server.engine.work import RequestState

AUDIO_OUT_S = 0.001  # a chunk's audio gets this long to leave before its successors' builds run
IDLE_WAIT_S = 0.25  # the engine's idle wait when no build is due


@dataclass
class _DueBuild:
    at: float  # perf_counter from which the chunks are built
    state: RequestState
    chunk0: VoicePrompt


class LaterChunks:
    """Builds deferred until chunk 0's audio is out, then due `AUDIO_OUT_S` after it."""

    def __init__(self) -> None:
        self._deferred: dict[str, tuple[RequestState, VoicePrompt]] = {}  # request id -> chunk 0 as a voice
        self._due: deque[_DueBuild] = deque()  # chunk 0's audio is out, oldest first

    def defer(self, state: RequestState, chunk0: VoicePrompt) -> None:
        self._deferred[state.request_id] = (state, chunk0)

    def audio_out(self, request_id: str, now: float) -> None:
        """Chunk 0 of `request_id` is decoded: its later chunks are due shortly."""
        if (deferred := self._deferred.pop(request_id, None)) is not None:
            self._due.append(_DueBuild(now + AUDIO_OUT_S, *deferred))

    def due(self, now: float) -> list[tuple[RequestState, VoicePrompt]]:
        """The builds due by `now` of requests still running, oldest first."""
        out = []
        while self._due and self._due[0].at <= now:
            build = self._due.popleft()
            if not build.state.finished:
                out.append((build.state, build.chunk0))
        return out

    def wait_s(self, now: float) -> float:
        """Seconds until the next due build (the idle wait's timeout), or the usual wait."""
        return max(self._due[0].at - now, 0.0) if self._due else IDLE_WAIT_S

    def drop(self, request_id: str) -> None:
        self._deferred.pop(request_id, None)
