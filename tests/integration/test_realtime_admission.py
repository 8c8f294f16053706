"""Realtime headroom and admission, on the scheduler with no model (utterance stand-ins and a
hand-driven clock), then through a real server on a real engine whose measured speed is set.

The headroom is 1 - demand / capacity: demand, the token-steps per second every streamed chunk
held needs to make its deadline (none given less than `WINDOW_S`); capacity, the fastest step
seen. A new line or stream turn is refused (`busy`, `retry_after_ms`) only when the headroom
after it would fall below `REFUSE_BELOW`: never at light or moderate load, never before
`MIN_STEPS` steps, never with the admission off, never for whole files or later segments.
"""

from __future__ import annotations

import asyncio
import base64
import io
from types import SimpleNamespace

import httpx
import pytest
import soundfile as sf

from server.engine.scheduling.headroom import MIN_STEPS, REFUSE_BELOW, RETRY_MAX_S, RETRY_MIN_S, WINDOW_S, need
from server.engine.types import RequestRejected
from tests.conftest import make_reference_clip
from tests.support.chorus_client import Outcome, Session, metric_value
from tests.support.hold_gate import ReleaseGate
from tests.support.inproc import InProcessServer
from tests.support.waiting import poll_until
from tests.unit.test_deadline_scheduler import Request, run_step, scheduler

FIRST = "One sentence first, long enough that it is still being spoken when the line arrives."
RATE = 400_000.0  # token-steps per second of the stand-in engine's fastest step


def measured(s, rate: float = RATE, steps: int = MIN_STEPS):
    for _ in range(steps):
        s.observe_step(0.02, int(rate * 0.02))
    s.step_seconds = 0.02
    return s


def line(num_step: int = 32, stream: str = "chunk", due_at: float | None = None, request_id: str = "line"):
    return SimpleNamespace(stream=stream, due_at=due_at, options=SimpleNamespace(num_step=num_step),
                           request_id=request_id)


def admission_scheduler(**kw):
    s = scheduler(tokens=1_000_000, batch=10_000, **kw)
    s.headroom.admission = True
    return measured(s)


def test_moderate_load_is_never_refused():
    """A new first chunk every 20 ms (600 packed tokens, 32 steps) on an engine that steps
    them all at once: the demand settles well under capacity, nothing is refused."""
    s = admission_scheduler()
    now = 0.0
    for _ in range(500):
        s.admit_realtime(line(), 600, now)  # raises if refused
        s.add(Request(arrival=now, chunks=(3.0, 3.0), num_step=32).chunk(0, packed_len=600))
        run_step(s, now)
        now += 0.02
    assert 0.0 < s.headroom.free() < 1.0 and s.headroom.refused_total == 0


def test_refused_only_past_the_threshold_with_a_retry_hint():
    s = admission_scheduler()
    for _ in range(12):  # first chunks due now: each needs 600 x 32 / WINDOW_S token-steps per second
        s.add(Request(arrival=0.0, num_step=32).chunk(0, packed_len=600))
    s.schedule(now=0.0)
    demand = 12 * need(600, 32, 0.0)
    assert s.headroom.demand == pytest.approx(demand)
    assert s.headroom.free() == pytest.approx(1 - demand / RATE)
    # the threshold: the largest new chunk that still leaves REFUSE_BELOW
    room = (1 - REFUSE_BELOW) * RATE - demand  # token-steps per second left before refusing
    fits = int(room * WINDOW_S / 32)
    s.admit_realtime(line(), fits, 0.0)
    with pytest.raises(RequestRejected) as refused:
        s.admit_realtime(line(), fits + 2, 0.0)
    assert refused.value.code == "busy"
    assert RETRY_MIN_S * 1000 <= refused.value.retry_after_ms <= RETRY_MAX_S * 1000
    assert s.headroom.refused_total == 1
    # neither a whole file nor a stream's later segment (it has a due_at) is held to it
    s.admit_realtime(line(stream="whole"), 10 * fits, 0.0)
    s.admit_realtime(line(due_at=5.0), 10 * fits, 0.0)


def test_chunks_due_later_weigh_less_and_an_idle_engine_forgets_its_demand():
    s = admission_scheduler()
    far = Request(arrival=0.0, chunks=(1.0,), due_at=10.0, num_step=32).chunk(0, packed_len=600)
    s.add(far)
    s.schedule(now=0.0)
    assert s.headroom.demand == pytest.approx(need(600, 32, 10.0))
    assert need(600, 32, 10.0) < need(600, 32, 0.0) / 5
    s.drop_request(far.state.request_id, now=0.1)
    assert s.headroom.demand == 0.0 and s.headroom.free() == 1.0


def test_no_refusal_before_the_engine_is_measured_or_with_the_admission_off():
    unmeasured = scheduler(tokens=1_000_000, batch=10_000)
    unmeasured.headroom.admission = True
    measured(unmeasured, steps=MIN_STEPS - 1)
    off = measured(scheduler(tokens=1_000_000, batch=10_000))
    fifo = measured(scheduler(tokens=1_000_000, batch=10_000, policy="fifo"))
    fifo.headroom.admission = True
    for s in (unmeasured, off, fifo):
        for _ in range(50):
            s.add(Request(arrival=0.0, num_step=32).chunk(0, packed_len=20_000))
        s.schedule(now=0.0)
        s.admit_realtime(line(), 20_000, 0.0)  # far over, but not refused
    assert off.headroom.free() < REFUSE_BELOW  # still measured: /metrics shows it


# ---- through a real server --------------------------------------------------------------


@pytest.fixture(scope="module")
def admitting_server(tiny_checkpoint, tmp_path_factory):
    """A real server on its own CPU engine, `--realtime-admission on` (auto is off on a CPU)."""
    from server.app import load_engines
    from server.cli.main import build_parser, config_from_args

    flags = ["serve", "--model", str(tiny_checkpoint)]
    assert not config_from_args(build_parser().parse_args(flags)).engine.realtime_admission
    cfg = config_from_args(build_parser().parse_args([*flags, "--realtime-admission", "on"]))
    pool = asyncio.run(load_engines(cfg))
    server = InProcessServer(pool, tiny_checkpoint, tmp_path_factory.mktemp("admission")).start()
    yield server, pool.engines[0]
    server.stop()
    pool.stop()


def _line_and_turn_refused(server) -> tuple[dict, dict]:
    """A new line and a stream's first segment, each answered `busy`: their error frames."""

    async def main():
        s = await Session.open(server.ws_url)
        await s.synthesize("line", "Hello there, this is a line.", options={"num_step": 4})
        line_error = await s.expect_error("busy", "line")
        await s.send({"type": "stream_open", "id": "turn", "options": {"num_step": 4}})
        await s.send({"type": "stream_append", "id": "turn", "text": "Sure, here it is. "})
        turn_error = await s.expect_error("busy", "turn")
        await s.close()
        return line_error, turn_error

    return asyncio.run(asyncio.wait_for(main(), 120))


def _line_end(server, request_id: str) -> dict:
    """The end frame of one new line."""

    async def main():
        s = await Session.open(server.ws_url)
        await s.synthesize(request_id, "Hello there, this is a line.", options={"num_step": 4})
        out = (await s.collect([request_id]))[request_id]
        await s.close()
        return out

    return asyncio.run(asyncio.wait_for(main(), 120)).end


def test_a_server_over_its_promises_answers_busy_with_retry_after(admitting_server):
    server, engine = admitting_server
    headroom = engine.scheduler.headroom
    headroom.steps, headroom.best_rate = MIN_STEPS, 1.0  # as if measured on a very slow device
    for frame in _line_and_turn_refused(server):
        assert RETRY_MIN_S * 1000 <= frame["retry_after_ms"] <= RETRY_MAX_S * 1000, frame
    reply = httpx.post(server.url + "/v1/audio/speech", json={"model": "x", "input": "Hello there.",
                                                                "response_format": "wav", "num_step": 4},
                       timeout=120)  # the answer, not its time, is the point (httpx's 5 s: a busy machine)
    assert reply.status_code == 503 and reply.json()["error"]["code"] == "busy"
    assert int(reply.headers["Retry-After"]) >= 1
    # a whole file has no realtime promise: it is served
    flac = httpx.post(server.url + "/v1/audio/speech", json={"model": "x", "input": "Hello there.",
                                                               "response_format": "flac", "num_step": 4},
                      timeout=120)
    assert flac.status_code == 200
    assert metric_value(server.url, "chorus_realtime_headroom") <= 1.0
    headroom.best_rate = 1e12  # a fast engine: the same line is served
    assert _line_end(server, "line2")["type"] == "done"


def test_a_turn_whose_first_audio_would_miss_the_promise_is_answered_busy(admitting_server, monkeypatch):
    """The first-audio rule through a real server: one first chunk taken ahead and the engine's
    step cost set as if every step took a second, a new line and a stream's first segment are
    refused `busy` with a hint (the promise is 250 ms); with a promise that step cost keeps,
    the same line is served."""
    from server.engine.scheduling import first_audio as first_audio_rule
    from server.engine.scheduling.first_audio import StepCost

    server, engine = admitting_server
    first_audio, headroom = engine.scheduler.first_audio, engine.scheduler.headroom
    headroom.steps, headroom.best_rate = MIN_STEPS, 1e12  # the headroom rule has room: only this one refuses
    monkeypatch.setattr(first_audio_rule, "RESERVATION_TTL_S", 3600.0)  # however slow the machine
    first_audio.admit("ahead", 1000, 4)  # unmeasured: taken, and held as a first chunk in flight
    slow = StepCost()
    for _ in range(MIN_STEPS):
        slow.observe(1000, 1.0)
    first_audio.cost, promise = slow, first_audio.promise_s
    assert promise == 0.25  # `--realtime-promise-ms`'s default
    try:
        for frame in _line_and_turn_refused(server):
            assert "first audio" in frame["message"] and frame["retry_after_ms"] >= RETRY_MIN_S * 1000, frame
        first_audio.promise_s = 1e9
        assert _line_end(server, "line3")["type"] == "done"
    finally:
        first_audio.cost, first_audio.promise_s = StepCost(), promise
        first_audio.release("ahead")


def test_a_full_queue_refuses_new_turns_but_never_cuts_a_taken_one_short(shared_engine, tiny_checkpoint, tmp_path):
    """`--max-queue 1`: a stream's first segment takes the one place, its later segment (with a
    reference voice, submitted while the first is in flight) still goes through; a line sent
    meanwhile is refused `busy`. The first segment's events wait behind a `ReleaseGate` until
    the line is refused and the second segment submitted, so it holds its place however slow
    or fast the machine is."""
    buf = io.BytesIO()
    sf.write(buf, make_reference_clip(1.5), 16000, format="WAV", subtype="PCM_16")
    reference = {"audio": base64.b64encode(buf.getvalue()).decode(), "text": "A reference."}
    gate = ReleaseGate(shared_engine, marker=FIRST[:18])
    server = InProcessServer(gate, tiny_checkpoint, tmp_path, "--max-queue", "1").start()

    def submitted(part: str, what: str):
        return asyncio.to_thread(poll_until, lambda: any(part in t for t in gate.texts), what)

    async def main():
        s = await Session.open(server.ws_url)
        s.outcomes["turn"] = Outcome("turn")
        await s.send({"type": "stream_open", "id": "turn", "reference": reference, "options": {"num_step": 16}})
        await s.wait_for("turn", "accepted")
        await s.send({"type": "stream_append", "id": "turn", "text": f"{FIRST} Then a second. "})
        await submitted(FIRST[:18], "the turn's first segment submitted")
        await s.synthesize("line", "A line meanwhile.", options={"num_step": 4})
        refused = await s.expect_error("busy", "line")
        await s.send({"type": "stream_close", "id": "turn"})
        await submitted("Then a second", "the turn's second segment submitted while the first holds the queue")
        gate.release()
        out = (await s.collect(["turn"]))["turn"]
        await s.close()
        return refused, out

    try:
        refused, out = asyncio.run(asyncio.wait_for(main(), 180))
    finally:
        gate.release()
        server.stop()
    assert "requests queued" in refused["message"]
    assert out.end["type"] == "done", out.end
    assert [seg["text"] for seg in out.of("segment")] == [FIRST, "Then a second."]
