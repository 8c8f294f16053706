"""What the scheduler sees of a chunk: what it orders, packs and times it by, nothing more.

An `Utterance` (`server/engine/work.py`) is one; so is any stand-in with these members. The
scheduler never reads a chunk's request, text, canvas or model state.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from server.engine.work import ChunkDue


class Schedulable(Protocol):
    @property
    def key(self) -> tuple[int, int]:
        """Arrival order, the FIFO order: (the request's arrival number, the chunk's index)."""

    @property
    def request_id(self) -> str: ...

    @property
    def chunk_index(self) -> int: ...

    @property
    def packed_len(self) -> int:
        """Tokens it adds to a step: its cost against the step's budget."""

    @property
    def steps_left(self) -> int: ...

    @property
    def due(self) -> ChunkDue:
        """Its deadline's terms, fixed when it was built."""

    @property
    def first_audio_at(self) -> float | None:
        """When its request's first audio went out (a later chunk is due from there on)."""

    def advance(self) -> None:
        """It took one step."""


S = TypeVar("S", bound=Schedulable)  # what a scheduler holds and hands back: the engine's `Utterance`
