"""The scheduler with no model: utterance stand-ins, and launched steps built by hand
(the runner's `LaunchedStep`), whose stepped utterances go to `advance` as the engine loop
passes them."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from server.engine.scheduling.output import LaunchedPart, LaunchedStep
from server.engine.scheduling.scheduler import Scheduler


class Utt:
    """What the scheduler reads of an utterance (`Schedulable`), FIFO's share of it."""

    def __init__(self, seq: int, chunk: int, packed_len: int, num_step: int = 3, rid: str | None = None):
        self.state = SimpleNamespace(seq=seq, request_id=rid or f"r{seq}")
        self.key, self.request_id = (seq, chunk), self.state.request_id
        self.chunk_index = chunk
        self.packed_len = packed_len
        self.num_step = num_step
        self.step = 0
        self.due, self.first_audio_at = None, None  # FIFO reads no deadline

    @property
    def steps_left(self) -> int:
        return self.num_step - self.step

    @property
    def finished(self) -> bool:
        return self.step >= self.num_step

    def advance(self) -> None:
        self.step += 1


def launched(utts, failed=()) -> list:
    """The utterances a step in which `utts` ran (one forward) moved on: the runner's
    `LaunchedStep.stepped`, as the engine loop hands it to `advance`."""
    part = LaunchedPart(list(utts), torch.ones(len(utts), dtype=torch.bool), [u.step + 1 for u in utts])
    return LaunchedStep(parts=[part], failed=list(failed), items=len(utts)).stepped


def test_advance_moves_each_stepped_utterance_once_and_retires_the_done():
    s = Scheduler(max_batch_size=8, max_packed_tokens=1000)
    short, long_ = Utt(0, 0, 10, num_step=2), Utt(1, 0, 10, num_step=4)
    s.add(short)
    s.add(long_)
    batch = s.schedule()
    assert batch.utts == [short, long_] and batch.admitted == 2
    assert s.advance(launched(batch.utts)) == []
    assert (short.step, long_.step) == (1, 1)
    assert s.advance(launched(s.schedule().utts)) == [short]  # its last step ran
    assert s.running == [long_] and len(s) == 1
    batch = s.schedule()
    assert batch.utts == [long_] and batch.admitted == 0


def test_an_utterance_missing_from_the_launched_step_does_not_advance():
    """A failed item (or one of a half that raised) is not in `stepped`: it keeps its step."""
    s = Scheduler(max_batch_size=8, max_packed_tokens=1000)
    a, b = Utt(0, 0, 10), Utt(1, 0, 10)
    s.add(a)
    s.add(b)
    s.schedule()
    s.advance(launched([a], failed=[SimpleNamespace(utt=b, error=RuntimeError("x"))]))
    assert (a.step, b.step) == (1, 0)


def test_freed_budget_admits_the_next_waiting_at_the_next_step():
    s = Scheduler(max_batch_size=8, max_packed_tokens=100)
    first, second = Utt(0, 0, 80, num_step=1), Utt(1, 0, 80, num_step=1)
    s.add(first)
    s.add(second)
    assert s.schedule().utts == [first]
    assert s.advance(launched([first])) == [first]
    batch = s.schedule()
    assert batch.utts == [second] and batch.admitted == 1


def test_drop_request_removes_running_and_waiting_chunks():
    s = Scheduler(max_batch_size=1, max_packed_tokens=100)
    run, wait, other = Utt(0, 0, 10), Utt(0, 1, 10), Utt(1, 0, 10)
    for u in (run, wait, other):
        s.add(u)
    assert s.schedule().utts == [run]
    s.drop_request("r0")
    assert s.running == [] and s.waiting_utts == [other]
    assert s.schedule().utts == [other]
