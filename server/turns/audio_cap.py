"""The audio cap of work made of several turns (a text stream), counted as it is made.

One request's audio is capped by the engine as it plans it (`--max-audio-seconds`). A stream's
turns share that cap, and a plan can undercount (each clip is padded after it is made), so the
stream counts each turn's audio as made, a running turn at its plan or what it has made so far,
whichever is more, and is refused a turn (or stopped mid-turn) that would pass the cap.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Share:
    planned: float = 0.0
    made: float = 0.0
    finished: bool = False

    @property
    def counted(self) -> float:
        return self.made if self.finished else max(self.planned, self.made)


@dataclass
class AudioCap:
    max_seconds: float | None
    _shares: dict[str, _Share] = field(default_factory=dict)

    def total(self) -> float:
        return sum(share.counted for share in self._shares.values())

    def plan(self, key: str, seconds: float) -> float | None:
        """A turn planned `seconds`: the total it would reach when that passes the cap (the turn is
        then refused), else None and it counts."""
        total = self.total() + seconds
        if self.max_seconds is not None and total > self.max_seconds:
            return total
        self._shares[key] = _Share(planned=seconds)
        return None

    def made(self, key: str, seconds: float) -> float | None:
        """The turn made `seconds` more: the total when that passes the cap (stop it), else None."""
        self._shares.setdefault(key, _Share()).made += seconds
        total = self.total()
        return total if self.max_seconds is not None and total > self.max_seconds else None

    def finished(self, key: str) -> None:
        if (share := self._shares.get(key)) is not None:
            share.finished = True
