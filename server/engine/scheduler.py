"""Admission and progress: which utterances run in the next step, and what a step changed.

There is no prefill or decode phase, only work left against a budget: every running
utterance costs its packed length in every step until its last. New utterances join at
step boundaries, strictly first come first served (a waiting head that does not fit yet
blocks those behind it, so nothing starves), within `max_batch_size` items and
`max_packed_tokens` tokens.

The scheduler owns the state changes of a step: `schedule()` says what runs, and
`advance(step)` (what the runner launched) moves every stepped utterance one step on and
retires those that took their last. It never touches a model, so it is tested with none.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from server.engine.request import Utterance

if TYPE_CHECKING:
    from server.engine.runner import LaunchedStep


@dataclass(frozen=True)
class StepRecord:
    """One executed step, for tests and metrics."""

    index: int
    items: int
    packed_tokens: int
    seconds: float
    admitted: int = 0


class ScheduledBatch(NamedTuple):
    """The utterances of the next step, and how many of them joined at this boundary."""

    utts: list[Utterance]
    admitted: int


@dataclass(order=True)
class _Waiting:
    key: tuple[int, int]
    utt: Utterance = field(compare=False)


class Scheduler:
    def __init__(self, max_batch_size: int, max_packed_tokens: int):
        self.max_batch_size = max_batch_size
        self.max_packed_tokens = max_packed_tokens
        self.waiting: list[_Waiting] = []  # sorted by (request arrival, chunk index)
        self.running: list[Utterance] = []

    def fits_alone(self, packed_len: int) -> bool:
        return packed_len <= self.max_packed_tokens

    def add(self, utt: Utterance) -> None:
        bisect.insort(self.waiting, _Waiting((utt.state.seq, utt.chunk_index), utt))

    @property
    def running_tokens(self) -> int:
        return sum(u.packed_len for u in self.running)

    @property
    def waiting_utts(self) -> list[Utterance]:
        return [w.utt for w in self.waiting]

    def schedule(self) -> ScheduledBatch:
        """Admit from the head of the queue; return the step's utterances and how many joined."""
        budget = self.max_packed_tokens - self.running_tokens
        admitted = 0
        while self.waiting and len(self.running) < self.max_batch_size:
            head = self.waiting[0].utt
            if head.packed_len > budget:
                break
            self.waiting.pop(0)
            self.running.append(head)
            budget -= head.packed_len
            admitted += 1
        return ScheduledBatch(list(self.running), admitted)

    def advance(self, step: "LaunchedStep") -> list[Utterance]:
        """Each utterance the step launched moved one step on; retire and return those done."""
        done = []
        for utt in step.stepped:
            utt.step += 1
            if utt.finished:
                done.append(utt)
        self.retire(done)
        return done

    def retire(self, utts: list[Utterance]) -> None:
        gone = {id(u) for u in utts}
        self.running = [u for u in self.running if id(u) not in gone]

    def drop_request(self, request_id: str) -> None:
        """Remove every utterance of a request (cancel / failure)."""
        self.running = [u for u in self.running if u.state.request_id != request_id]
        self.waiting = [w for w in self.waiting if w.utt.state.request_id != request_id]

    def __len__(self) -> int:
        return len(self.running) + len(self.waiting)


class StepLog(deque):
    """The last N step records."""

    def __init__(self, maxlen: int = 4096):
        super().__init__(maxlen=maxlen)
