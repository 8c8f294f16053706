"""The first-audio admission on the scheduler with no model: utterance stand-ins, and a clock
that each step advances by what a step of its packed tokens costs (an affine cost, as measured
steps are). A new turn is taken only when its first chunk's steps, shared with every first
chunk taken before it, end within the promise: a steady stream of turns is never refused; a
burst is cut to what can be served in time, every turn taken is heard within the promise, and
the refused ones, retrying after their hint, are all served."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from server.engine.scheduling.first_audio import DELIVERY_S, RESERVATION_TTL_S, RETRY_MIN_S, StepCost
from server.engine.scheduling.headroom import MIN_STEPS, RETRY_MAX_S
from server.engine.scheduling.scheduler import Scheduler
from server.engine.types import RequestRejected
from tests.unit.test_deadline_scheduler import FRAME_RATE, Request, run_step

PROMISE_S = 0.25
FIXED_S, PER_TOKEN_S = 0.0008, 2.2e-6  # the stand-in engine: a step of T tokens costs FIXED + T x PER_TOKEN
FIRST_LEN, STEPS = 300, 32


def cost(tokens: int) -> float:
    return FIXED_S + PER_TOKEN_S * tokens


def admitting(promise_s: float | None = PROMISE_S) -> Scheduler:
    s = Scheduler(max_batch_size=512, max_packed_tokens=32768, policy="deadline", frame_rate=FRAME_RATE,
                  urgent_step_tokens=2048, admission=True, promise_s=promise_s)
    for i in range(MIN_STEPS):  # measured on steps of many sizes
        tokens = 500 + 50 * i
        s.observe_step(cost(tokens), tokens)
    return s


def turn(request: Request):
    return SimpleNamespace(stream="chunk", due_at=None, options=SimpleNamespace(num_step=STEPS),
                           request_id=request.state.request_id)


def simulate(s: Scheduler, arrivals: list[float], horizon_s: float = 30.0, seed: int = 0) -> dict:
    """Turns arrive at `arrivals`; a refused one comes back after its hint plus up to half of it
    again (as the client retries). Returns, per turn, when it was taken and when its first chunk
    ended, and how many refusals it met."""
    rng = random.Random(seed)
    queue = sorted((t, i) for i, t in enumerate(arrivals))
    taken: dict[int, tuple[float, object]] = {}
    ended: dict[int, float] = {}
    refusals = [0] * len(arrivals)
    now = 0.0
    while (queue or len(ended) < len(taken)) and now < horizon_s:
        while queue and queue[0][0] <= now:
            _, i = queue.pop(0)
            request = Request(arrival=now, chunks=(3.0,), num_step=STEPS)
            try:
                s.admit_realtime(turn(request), FIRST_LEN, now)
            except RequestRejected as refused:
                assert refused.code == "busy"
                hint = refused.retry_after_ms / 1000
                assert RETRY_MIN_S <= hint <= RETRY_MAX_S
                refusals[i] += 1
                queue.append((now + hint * (1 + rng.uniform(0, 0.5)), i))
                queue.sort()
                continue
            chunk = request.chunk(0, packed_len=FIRST_LEN)
            s.add(chunk)
            taken[i] = (now, chunk)
        batch = run_step(s, now)
        tokens = sum(u.packed_len for u in batch.utts)
        step = cost(tokens) if tokens else 0.001
        if tokens:
            s.observe_step(step, tokens)
        now += step
        for i, (_, chunk) in taken.items():
            if i not in ended and chunk.finished:
                ended[i] = now
    return {"taken": {i: t for i, (t, _) in taken.items()}, "ended": ended, "refusals": refusals}


def test_the_step_cost_is_fitted_from_measured_steps():
    fit = StepCost()
    assert fit.seconds(1000) is None  # nothing measured: no estimate, no refusal
    for i in range(MIN_STEPS):
        fit.observe(500 + 50 * i, cost(500 + 50 * i))
    assert fit.seconds(2048) == pytest.approx(cost(2048), rel=1e-6)
    assert fit.seconds(8000) == pytest.approx(cost(8000), rel=1e-6)
    one_size = StepCost()
    for _ in range(MIN_STEPS):
        one_size.observe(1000, 0.004)
    assert one_size.seconds(2000) == pytest.approx(0.008)  # proportional: never an under-estimate above
    # only large steps measured (a server that began with whole files): small ones are read off
    # the line through the two smallest classes, not taken to cost what a large one does
    large = StepCost()
    for i in range(MIN_STEPS):
        large.observe(8000 + 200 * i, cost(8000 + 200 * i))
    assert large.seconds(2048) == pytest.approx(cost(2048), rel=1e-6)
    assert large.seconds(10) >= cost(8000) * 10 / 8000  # never below proportional


def test_a_steady_stream_of_turns_is_never_refused():
    """17 new turns a second (as 150 voice agents at 0.6 of this engine's throughput start theirs)."""
    s = admitting()
    result = simulate(s, [i / 17 for i in range(17 * 8)])
    assert sum(result["refusals"]) == 0 and s.first_audio.refused_total == 0
    assert len(result["ended"]) == 17 * 8


def test_a_burst_is_cut_to_what_is_heard_in_time_and_the_rest_is_served_after_retrying():
    """150 turns within 2 s: the first chunks taken all end within the promise (their steps
    never grow past what the last one taken was promised on); the refused ones retry with
    their hints and are all served in the end."""
    rng = random.Random(1)
    arrivals = sorted(rng.uniform(0, 2.0) for _ in range(150))
    s = admitting()
    result = simulate(s, arrivals)
    first_try = sum(1 for r in result["refusals"] if r == 0)
    assert 0 < first_try < 150 and s.first_audio.refused_total == sum(result["refusals"])
    assert len(result["ended"]) == 150  # every turn served in the end
    late = [result["ended"][i] - t + DELIVERY_S - PROMISE_S for i, t in result["taken"].items()]
    assert max(late) <= 1e-9, f"{sum(x > 0 for x in late)} first chunks past the promise, worst {max(late):.3f} s"
    # without the first-audio rule the same burst is all taken and heard late
    unguarded = simulate(admitting(promise_s=None), arrivals)
    worst = max(unguarded["ended"][i] - t for i, t in unguarded["taken"].items()) + DELIVERY_S
    assert sum(unguarded["refusals"]) == 0 and worst > 2 * PROMISE_S


def test_a_reservation_ends_with_its_first_chunk_a_drop_or_its_time():
    s = admitting()
    done, dropped, lost = (Request(arrival=0.0, chunks=(3.0,), num_step=STEPS) for _ in range(3))
    for request in (done, dropped, lost):
        s.admit_realtime(turn(request), FIRST_LEN, 0.0)
    assert s.first_audio.reserved_tokens(0.0) == 3 * FIRST_LEN
    s.add(chunk := done.chunk(0, packed_len=FIRST_LEN))
    while not chunk.finished:
        run_step(s, 0.0)
    s.first_audio.due_tokens = 500  # as a schedule with a stream's chunk due would have left it
    s.drop_request(dropped.state.request_id, now=0.0)
    assert s.first_audio.reserved_tokens(0.0) == FIRST_LEN  # `lost` never reached the engine
    assert s.first_audio.due_tokens == 0  # an idle engine has nothing due
    assert s.first_audio.reserved_tokens(RESERVATION_TTL_S + 1) == 0


def test_nothing_is_refused_unmeasured_off_alone_or_for_work_without_a_first_audio_promise():
    unmeasured = Scheduler(max_batch_size=16, max_packed_tokens=32768, policy="deadline", urgent_step_tokens=2048,
                           admission=True, promise_s=0.001)
    off = Scheduler(max_batch_size=16, max_packed_tokens=32768, policy="deadline", urgent_step_tokens=2048,
                    promise_s=0.001)
    tight = admitting(promise_s=0.001)
    for s in (unmeasured, off):
        s.admit_realtime(turn(Request(arrival=0.0)), 20_000, 0.0)
    tight.admit_realtime(turn(Request(arrival=0.0)), FIRST_LEN, 0.0)  # nothing ahead: waiting would gain nothing
    with pytest.raises(RequestRejected):
        tight.admit_realtime(turn(Request(arrival=0.0)), FIRST_LEN, 0.0)  # one ahead, and over the promise
    whole = SimpleNamespace(stream="whole", due_at=None, options=SimpleNamespace(num_step=STEPS), request_id="w")
    later = SimpleNamespace(stream="chunk", due_at=3.0, options=SimpleNamespace(num_step=STEPS), request_id="s")
    tight.admit_realtime(whole, FIRST_LEN, 0.0)  # a whole file has no first-audio promise
    tight.admit_realtime(later, FIRST_LEN, 0.0)  # nor a stream's later segment (it is due later)
