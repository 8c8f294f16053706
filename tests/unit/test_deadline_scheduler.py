"""Deadline scheduling with no model: utterance stand-ins and a hand-driven clock.

(a) a new request's first chunk jumps ahead of chunks far ahead of playback when the budget
is tight (waiting ones yield, running ones are paused); (b) aging: a chunk that keeps being
passed over becomes urgent and gets in, nothing starves; (c) FIFO mode keeps its order;
(d) whole-file requests fill what is left.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from server.engine.scheduling import deadlines
from server.engine.scheduling.output import LaunchedPart, LaunchedStep
from server.engine.scheduling.scheduler import AHEAD_STEP_FACTOR, Scheduler
from server.engine.work import ChunkDue

FRAME_RATE = 25
STEP_S = 0.05


class Request:
    """A request stand-in: `chunks` planned lengths in seconds of audio."""

    seq = 0

    def __init__(self, arrival: float, chunks=(2.0,), num_step: int = 8, stream: str = "chunk",
                 due_at: float | None = None):
        Request.seq += 1
        self.state = SimpleNamespace(
            seq=Request.seq, request_id=f"r{Request.seq}", submitted_at=arrival, first_audio_at=None,
            request=SimpleNamespace(stream=stream, due_at=due_at, options=SimpleNamespace(num_step=num_step)),
            plan=SimpleNamespace(chunks=[SimpleNamespace(target_len=int(s * FRAME_RATE)) for s in chunks]),
        )
        self.num_step = num_step

    def chunk(self, index: int, packed_len: int = 100) -> Utt:
        return Utt(self, index, packed_len)


class Utt:
    """What the scheduler reads of an utterance (`Schedulable`); `state` is its request's."""

    def __init__(self, request: Request, index: int, packed_len: int):
        self.state = request.state
        self.chunk_index = index
        self.packed_len = packed_len
        self.num_step = request.num_step
        self.step = 0
        state, frames = request.state, [c.target_len for c in request.state.plan.chunks]
        self.key, self.request_id = (state.seq, index), state.request_id
        self.due = ChunkDue(whole=state.request.stream == "whole", arrived_at=state.submitted_at,
                            hint=state.request.due_at, chunk_index=index, frames_before=sum(frames[:index]),
                            frames_total=sum(frames), num_step=self.num_step)

    @property
    def first_audio_at(self) -> float | None:
        return self.state.first_audio_at

    @property
    def steps_left(self) -> int:
        return self.num_step - self.step

    @property
    def finished(self) -> bool:
        return self.step >= self.num_step

    def advance(self) -> None:
        self.step += 1

    def __repr__(self) -> str:
        return f"{self.state.request_id}#{self.chunk_index}"


def scheduler(tokens: int = 300, batch: int = 16, policy: str = "deadline", urgent_step_tokens=None) -> Scheduler:
    s = Scheduler(max_batch_size=batch, max_packed_tokens=tokens, policy=policy, frame_rate=FRAME_RATE,
                  urgent_step_tokens=urgent_step_tokens)
    s.step_seconds = STEP_S
    return s


def run_step(s: Scheduler, now: float):
    """schedule -> (the runner) -> advance, as the engine loop does; returns the batch."""
    batch = s.schedule(now=now)
    part = LaunchedPart(list(batch.utts), torch.ones(len(batch.utts), dtype=torch.bool),
                        [u.step + 1 for u in batch.utts])
    s.advance(LaunchedStep(parts=[part], items=len(batch.utts)).stepped)
    return batch


def test_deadlines_follow_playback():
    long_ = Request(arrival=10.0, chunks=(4.0, 6.0, 5.0), num_step=8)
    c0, c1, c2 = (long_.chunk(i) for i in range(3))
    assert deadlines.due_at(c0, STEP_S, FRAME_RATE) == 10.0  # the first chunk: due on arrival
    # before first audio: start estimated as chunk 0's due + its steps
    assert deadlines.due_at(c2, STEP_S, FRAME_RATE) == pytest.approx(10.0 + 8 * STEP_S + 10.0)
    long_.state.first_audio_at = 11.0  # then: first audio + the audio before the chunk
    assert deadlines.due_at(c1, STEP_S, FRAME_RATE) == pytest.approx(15.0)
    assert deadlines.due_at(c2, STEP_S, FRAME_RATE) == pytest.approx(21.0)
    segment = Request(arrival=10.0, chunks=(3.0, 3.0), due_at=14.0)  # a stream's later segment
    assert deadlines.due_at(segment.chunk(0), STEP_S, FRAME_RATE) == 14.0
    segment.state.first_audio_at = 12.0  # sent early; playback still starts at the hint
    assert deadlines.due_at(segment.chunk(1), STEP_S, FRAME_RATE) == pytest.approx(17.0)
    whole = Request(arrival=10.0, chunks=(4.0, 6.0), stream="whole")
    assert deadlines.due_at(whole.chunk(0), STEP_S, FRAME_RATE) == pytest.approx(20.0)


def test_a_new_first_chunk_jumps_ahead_of_far_future_chunks():
    s = scheduler(tokens=300)
    long_ = Request(arrival=0.0, chunks=(2.0, 15.0, 15.0, 15.0, 15.0), num_step=8)
    chunks = [long_.chunk(i) for i in range(5)]
    for c in chunks:
        s.add(c)
    batch = run_step(s, now=0.0)
    assert batch.utts == chunks[:3]  # the budget is free: chunks far ahead fill it
    late = Request(arrival=0.1, num_step=8).chunk(0)
    s.add(late)
    batch = run_step(s, now=0.1)
    # the newcomer is due now: the chunk furthest ahead of playback is paused for it
    assert late in batch.utts and chunks[0] in batch.utts and chunks[2] not in batch.utts
    assert s.paused_total == 1 and chunks[2].step == 1  # paused with its progress kept
    assert [u.step for u in chunks[3:]] == [0, 0]  # and the waiting far chunks yielded


def test_waiting_far_chunks_yield_to_an_urgent_one_that_arrived_later():
    s = scheduler(tokens=200)
    s.add(Request(arrival=0.0, num_step=8).chunk(0))  # urgent, runs
    far = Request(arrival=0.0, chunks=(1.0, 20.0), due_at=30.0)  # a segment heard in 30 s
    s.add(far.chunk(0))
    now_due = Request(arrival=0.2).chunk(0)
    s.add(now_due)
    batch = s.schedule(now=0.2)
    assert now_due in batch.utts and far.state.request_id not in {u.state.request_id for u in batch.utts}


def test_urgent_chunks_are_never_paused_and_an_urgent_head_blocks():
    s = scheduler(tokens=200)
    a, b = Request(arrival=0.0).chunk(0), Request(arrival=0.0).chunk(0)
    s.add(a)
    s.add(b)
    assert run_step(s, now=0.0).utts == [a, b]
    c = Request(arrival=0.1).chunk(0, packed_len=150)
    small_far = Request(arrival=0.1, chunks=(1.0,), due_at=50.0).chunk(0, packed_len=10)
    s.add(c)
    s.add(small_far)
    batch = run_step(s, now=0.1)
    assert batch.utts == [a, b] and s.paused_total == 0  # urgent a, b keep running
    assert c.step == 0 and small_far.step == 0  # c waits; nothing less urgent overtakes it


def test_aging_nothing_starves():
    """A far-future chunk keeps being passed over while new first chunks arrive, until its
    slack runs out; then it gets in ahead of newer arrivals."""
    s = scheduler(tokens=200, batch=2)
    for _ in range(2):
        s.add(Request(arrival=0.0, num_step=4).chunk(0))
    run_step(s, now=0.0)  # the engine is full of urgent work
    far = Request(arrival=0.0, chunks=(1.0,), due_at=3.0, num_step=4).chunk(0)
    s.add(far)
    now, joined_at = STEP_S, None
    for _ in range(400):
        s.add(Request(arrival=now, num_step=4).chunk(0))  # a new urgent first chunk every step
        batch = run_step(s, now=now)
        if far in batch.utts:
            joined_at = now
            break
        now += STEP_S
    assert joined_at is not None, "starved"
    # it was held back while it could wait, and got in once its slack reached the horizon
    assert joined_at >= 3.0 - 4 * STEP_S - s.horizon_s - 1e-9
    while not far.finished:
        s.add(Request(arrival=now, num_step=4).chunk(0))
        assert far in run_step(s, now=now).utts  # urgent now: never paused again
        now += STEP_S


def test_fifo_mode_keeps_arrival_order():
    s = scheduler(tokens=300, policy="fifo")
    long_ = Request(arrival=0.0, chunks=(2.0, 15.0, 15.0, 15.0), num_step=8)
    chunks = [long_.chunk(i) for i in range(4)]
    for c in chunks:
        s.add(c)
    assert run_step(s, now=0.0).utts == chunks[:3]
    late = Request(arrival=0.1).chunk(0, packed_len=250)
    s.add(late)
    batch = run_step(s, now=0.1)
    assert batch.utts == chunks[:3] and s.paused_total == 0  # nothing paused for the newcomer
    for _ in range(7):
        batch = run_step(s, now=0.2)
    assert batch.utts == [chunks[3]] and late.step == 0  # the older chunk first, as they arrived
    deadline = scheduler(tokens=300)  # where the deadline policy puts the newcomer first
    for c in (long_.chunk(3), Request(arrival=0.1).chunk(0, packed_len=250)):
        deadline.add(c)
    assert deadline.schedule(now=0.2).utts[0].state.request_id != long_.state.request_id


def test_whole_file_requests_fill_what_is_left():
    s = scheduler(tokens=300)
    whole = Request(arrival=0.0, chunks=(10.0,), stream="whole").chunk(0, packed_len=150)
    s.add(whole)
    streams = [Request(arrival=0.05).chunk(0) for _ in range(2)]
    for u in streams:
        s.add(u)
    batch = s.schedule(now=0.05)
    assert batch.utts[:2] == streams and whole not in batch.utts  # arrived first, yet waits
    alone = scheduler(tokens=300)
    alone.add(whole)
    assert alone.schedule(now=0.05).utts == [whole]  # with nothing else to do it runs at once
    # and it is paused (first) when an urgent chunk needs its room
    newcomer = Request(arrival=0.1).chunk(0, packed_len=200)
    alone.add(newcomer)
    assert alone.schedule(now=0.1).utts == [newcomer] and alone.paused_total == 1


def test_whole_file_requests_age_in():
    s = scheduler(tokens=200, batch=2)
    for _ in range(2):
        s.add(Request(arrival=0.0, num_step=4).chunk(0))
    run_step(s, now=0.0)
    whole = Request(arrival=0.0, chunks=(2.0,), stream="whole", num_step=4).chunk(0)
    s.add(whole)
    now = STEP_S
    for _ in range(400):
        s.add(Request(arrival=now, num_step=4).chunk(0))
        if whole in run_step(s, now=now).utts:
            break
        now += STEP_S
    # held back while streams kept arriving, in once its slack ran out (due 2 s after arrival)
    assert whole.step == 1 and 2.0 - 4 * STEP_S - s.horizon_s - 1e-9 <= now


def test_while_urgent_chunks_run_a_step_stays_small():
    """Chunks far ahead of playback fill a step only up to the urgent step budget while an
    urgent chunk runs (its steps stay short), and take the whole budget once it is done."""
    s = scheduler(tokens=1000, urgent_step_tokens=250)
    story = Request(arrival=0.0, chunks=(2.0, 20.0, 20.0, 20.0), due_at=40.0, num_step=4)
    far = [story.chunk(i) for i in range(4)]
    for c in far:
        s.add(c)
    assert run_step(s, now=0.0).utts == far  # nothing urgent: the whole budget
    first = Request(arrival=0.1, num_step=4).chunk(0)
    s.add(first)
    batch = run_step(s, now=0.1)
    # the newcomer plus the least-slack far chunk: 200 tokens of the 250; the others paused
    assert batch.utts == [far[0], first] and s.paused_total == 3
    assert sum(u.packed_len for u in batch.utts) <= 250
    while not first.finished:
        batch = run_step(s, now=0.2)
        assert first in batch.utts and sum(u.packed_len for u in batch.utts) <= 250
    assert set(run_step(s, now=0.3).utts) == set(far[1:])  # urgent work done: all of it again
    assert [u.step for u in far[1:]] == [3, 2, 2]  # progress kept (far[1] took far[0]'s room)


def test_later_chunks_alone_run_in_bounded_steps_whole_files_in_full_ones():
    """Without urgent work, streams' later chunks still run in steps of at most
    AHEAD_STEP_FACTOR x the urgent step budget (a newcomer waits for the step in flight);
    whole-file requests alone take the whole budget."""
    s = scheduler(tokens=10_000, urgent_step_tokens=100)
    story = Request(arrival=0.0, chunks=(2.0,) * 12, due_at=60.0)
    for i in range(12):
        s.add(story.chunk(i))
    assert sum(u.packed_len for u in s.schedule(now=0.0).utts) == AHEAD_STEP_FACTOR * 100
    files = scheduler(tokens=10_000, urgent_step_tokens=100)
    for _ in range(12):
        files.add(Request(arrival=0.0, chunks=(20.0,), stream="whole").chunk(0))
    assert len(files.schedule(now=0.0).utts) == 12


def test_urgent_chunks_beyond_the_urgent_step_budget_all_run():
    s = scheduler(tokens=1000, urgent_step_tokens=150)
    firsts = [Request(arrival=0.0).chunk(0) for _ in range(4)]
    ahead = Request(arrival=0.0, chunks=(1.0,), due_at=30.0).chunk(0)
    for u in [*firsts, ahead]:
        s.add(u)
    batch = s.schedule(now=0.0)
    assert batch.utts == firsts  # 400 urgent tokens: the budget is theirs, nothing else fills it


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="deadline, fifo"):
        Scheduler(4, 100, policy="random")


def test_with_every_request_due_now_deadline_packs_the_steps_fifo_packs():
    """The throughput test's shape (96 requests of 2-12 s arriving within 200 ms, more than a
    step holds): every first chunk is urgent, so deadline scheduling must form the very steps
    FIFO forms; a throughput gap between the two modes there is not the scheduler's."""
    rng = random.Random(3)
    lengths = [rng.randint(50, 300) for _ in range(96)]
    arrivals = sorted(rng.uniform(0, 0.2) for _ in lengths)

    def steps(policy: str) -> list[tuple[int, ...]]:
        Request.seq = 0
        s = scheduler(tokens=32768, batch=64, policy=policy, urgent_step_tokens=2048)
        now, i, out = 0.0, 0, []
        while i < len(lengths) or len(s):
            while i < len(lengths) and arrivals[i] <= now:
                s.add(Request(arrival=arrivals[i], chunks=(lengths[i] / FRAME_RATE,), num_step=32)
                      .chunk(0, packed_len=2 * lengths[i] + 40))
                i += 1
            if not len(s):
                now = arrivals[i]
                continue
            batch = run_step(s, now)
            out.append(tuple(u.state.seq for u in batch.utts))
            now += (1.1 + 0.0019 * sum(u.packed_len for u in batch.utts)) / 1e3  # an H200's step time
        return out

    fifo, deadline = steps("fifo"), steps("deadline")
    assert len(fifo) >= 64 and max(len(b) for b in fifo) == 64  # the batch limit binds
    assert deadline == fifo


def test_a_due_chunks_decode_holds_what_can_wait_and_releases_when_decoded():
    """A long text's first chunk has taken its last step (its sound is due: the listener
    waits) and its later chunks are queued: they wait out its decode instead of sharing the
    GPU with it; a newcomer due now still runs; `decoded` releases the rest."""
    s = scheduler(tokens=1000)
    story = Request(arrival=0.0, chunks=(2.0, 10.0, 10.0), num_step=4)
    first, *later = (story.chunk(i) for i in range(3))
    first.step = first.num_step
    assert s.await_decode(first, now=0.2)
    for c in later:
        s.add(c)
    assert s.schedule(now=0.2).utts == []  # everything can wait: nothing runs
    newcomer = Request(arrival=0.21).chunk(0)
    s.add(newcomer)
    assert run_step(s, now=0.21).utts == [newcomer]  # due now: runs, alone
    s.decoded(story.state.request_id, 0, now=0.215)
    assert set(run_step(s, now=0.22).utts) == {newcomer, *later}


def test_running_chunks_with_slack_pause_for_a_due_decode_then_resume():
    s = scheduler(tokens=1000, urgent_step_tokens=250)
    story = Request(arrival=0.0, chunks=(4.0, 4.0), due_at=0.0, num_step=4)
    ahead = story.chunk(1)
    s.add(ahead)
    assert run_step(s, now=0.0).utts == [ahead]
    done = Request(arrival=0.05, num_step=4).chunk(0)
    done.step = done.num_step
    assert s.await_decode(done, now=0.1)
    assert s.schedule(now=0.1).utts == [] and s.paused_total == 1
    s.decoded(done.state.request_id, 0, now=0.105)
    assert run_step(s, now=0.11).utts == [ahead] and ahead.step == 2  # its progress kept


def test_a_decode_hold_needs_a_due_streamed_chunk_and_ends_on_its_own():
    from server.engine.scheduling.scheduler import DECODE_HOLD_MAX_S

    s = scheduler(tokens=1000)
    whole = Request(arrival=0.0, stream="whole").chunk(0)
    segment = Request(arrival=0.0, due_at=5.0).chunk(0)  # a stream's segment, heard in 5 s
    assert not s.await_decode(whole, now=0.1) and not s.await_decode(segment, now=0.1)
    assert not scheduler(policy="fifo").await_decode(Request(arrival=0.0).chunk(0), now=0.1)
    held = Request(arrival=0.0).chunk(0)
    assert s.await_decode(held, now=0.1)
    ahead = Request(arrival=0.0, due_at=9.0).chunk(0)
    s.add(ahead)
    assert s.schedule(now=0.1 + DECODE_HOLD_MAX_S / 2).utts == []
    assert s.schedule(now=0.1 + DECODE_HOLD_MAX_S * 1.5).utts == [ahead]  # a late report stalls nothing
    assert not s.awaited
    again = Request(arrival=1.0).chunk(0)
    assert s.await_decode(again, now=1.0)
    s.drop_request(again.state.request_id, now=1.01)  # cancelled or failed: no hold left behind
    assert not s.awaited


def test_a_lone_stream_holds_for_every_first_chunk_as_before():
    """Light load: first chunks seconds apart each get their hold, whole."""
    from server.engine.scheduling.scheduler import DECODE_HOLD_MAX_S

    s = scheduler(tokens=1000)
    for turn in range(5):
        now = 3.0 * turn
        first = Request(arrival=now).chunk(0)
        first.step = first.num_step
        ahead = Request(arrival=now, due_at=now + 9.0).chunk(0)
        s.add(ahead)
        assert s.await_decode(first, now=now + 0.1)
        assert s.schedule(now=now + 0.1 + DECODE_HOLD_MAX_S * 0.9).utts == []  # held its full length
        s.decoded(first.state.request_id, 0, now=now + 0.1 + DECODE_HOLD_MAX_S)
        assert ahead in run_step(s, now=now + 0.2).utts
        s.drop_request(ahead.state.request_id, now=now + 0.2)
    assert s.hold_budget.holds_total == 5 and s.hold_budget.holds_refused_total == 0


def test_under_sustained_load_holds_idle_the_engine_at_most_their_share():
    """A due first chunk finishes every 20 ms and each decode takes 30 ms: unthrottled, the
    engine would be held all the time. The bucket keeps held time near its share."""
    from server.engine.scheduling.hold_budget import HOLD_SHARE

    s = scheduler(tokens=100_000, batch=1000)
    far = Request(arrival=0.0, chunks=(1.0,), due_at=1e6, num_step=10**9).chunk(0)  # always has slack
    s.add(far)
    now, ran, steps, pending = 0.0, 0, 0, []
    while now < 60.0:
        first = Request(arrival=now).chunk(0)
        first.step = first.num_step
        if s.await_decode(first, now=now):
            pending.append((now + 0.03, first))
        for _ in range(4):  # 5 ms steps, the decode reports as they land
            for at, utt in [p for p in pending if p[0] <= now]:
                s.decoded(utt.state.request_id, 0, now=now)
                pending.remove((at, utt))
            ran += far in run_step(s, now=now).utts
            steps += 1
            now += 0.005
    held_share = s.hold_budget.held_seconds_total / now
    assert 0.5 * HOLD_SHARE < held_share <= HOLD_SHARE * 1.1
    assert 1 - ran / steps <= HOLD_SHARE * 1.2  # the bulk chunk ran in all but about that share of steps
    assert s.hold_budget.holds_refused_total > s.hold_budget.holds_total  # most wanted holds were refused


def test_a_hold_that_outlasts_its_credit_ends_early_and_is_charged():
    from server.engine.scheduling.hold_budget import HoldBudget

    budget = HoldBudget(cap_s=0.05, share=0.1)
    assert budget.start(0.0) and budget.start(0.01)  # a second chunk joins the open hold
    assert budget.holds_total == 1
    assert budget.left(0.04) == pytest.approx(0.05 - 0.04)  # full: nothing more accrues
    budget.end(0.06)  # the whole hold is charged
    assert budget.credit_s == pytest.approx(0.05 - 0.06)
    assert not budget.start(0.061) and not budget.start(0.061 + 0.05)  # below zero: no hold
    assert budget.start(0.06 + 0.11)  # credit back after 10 x its deficit in wall time
    s = scheduler(tokens=1000)
    s.hold_budget.credit_s = 0.01  # only 10 ms of credit left
    held = Request(arrival=0.0).chunk(0)
    s.add(Request(arrival=0.0, due_at=9.0).chunk(0))
    assert s.await_decode(held, now=0.1)
    assert s.schedule(now=0.105).utts == []
    assert len(s.schedule(now=0.12).utts) == 1 and not s.awaited  # out of credit: the hold ended
    assert s.hold_budget.held_seconds_total == pytest.approx(0.02)
