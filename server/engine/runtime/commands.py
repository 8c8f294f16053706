"""Every message the engine thread takes from its queue, in one place.

Callers on any thread (`submit`, `cancel`, `stop`) and the finisher's
workers put these on the engine's command queue; only the engine thread acts on them,
between steps, so request bookkeeping never leaves that thread.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from server.engine.work import RequestState


@dataclass(frozen=True)
class Submit:
    """A planned request, to be admitted (its canvases built) at the next step boundary."""

    state: RequestState


@dataclass(frozen=True)
class Cancel:
    request_id: str


@dataclass(frozen=True)
class Wake:
    """Nothing to do: unblocks a waiting engine thread (stop)."""


@dataclass(frozen=True)
class ChunkDecoded:
    """A chunk's tokens (host copy) and its audio: post-processed, or raw in `whole` mode."""

    state: RequestState
    index: int
    tokens: np.ndarray
    audio: np.ndarray
    post_processed: bool


@dataclass(frozen=True)
class WholeReady:
    """The cross-faded, post-processed audio of a whole request (`stream: whole`)."""

    state: RequestState
    audio: np.ndarray


@dataclass(frozen=True)
class FinishFailed:
    """Decoding or post-processing a chunk failed: its request ends with `error`."""

    state: RequestState
    index: int
    error: BaseException


Command = Submit | Cancel | Wake | ChunkDecoded | WholeReady | FinishFailed
