"""The loaded-p95 queueing model: its step-cost curve, the simulation's limits, and a run on a
committed `chorus bench` result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from microbench.queue_model import StepCost, predict, simulate

pytestmark = pytest.mark.bench

COST = StepCost((500, 1000, 4000), (2.0, 3.0, 9.0))


def test_step_cost_interpolates_and_extends_by_the_last_rate():
    assert COST(100) == 2.0 and COST(500) == 2.0 and COST(750) == 2.5 and COST(2500) == 6.0
    assert COST(8000) == 18.0  # the last point's cost per token


def test_a_lone_request_takes_its_steps_plus_the_fixed_part():
    lat = simulate(0.01, COST, 500, num_step=32, extra_ms=10.0, seconds=3000, seed=1)
    assert lat and min(lat) == pytest.approx(32 * 2.0 + 10.0)


def test_latency_grows_with_load_and_scales_with_step_cost():
    p95 = lambda xs: sorted(xs)[int(0.95 * len(xs))]
    light, heavy = (simulate(rate, COST, 500, seconds=400, seed=3) for rate in (2.0, 8.0))
    assert p95(heavy) > p95(light) > 64.0
    slow = StepCost(COST.tokens, tuple(2 * m for m in COST.ms))
    base, doubled = simulate(4.0, COST, 500, seconds=400, seed=5), simulate(2.0, slow, 500, seconds=800, seed=5)
    assert len(base) == len(doubled)
    assert doubled == pytest.approx([2 * x for x in base], rel=1e-6)


def test_a_cap_on_requests_per_step_queues_the_rest_first_come_first_served():
    one = simulate(50.0, COST, 500, num_step=4, seconds=20, seed=2, max_running=1)
    shared = simulate(50.0, COST, 500, num_step=4, seconds=20, seed=2)
    assert len(one) == len(shared) > 500
    assert min(one) == pytest.approx(4 * 2.0)  # alone in its steps
    assert simulate(50.0, COST, 500, num_step=4, seconds=20, seed=2, max_running=10**6) == shared
    with pytest.raises(ValueError):
        simulate(50.0, COST, 500, seconds=1, max_running=0)


@pytest.mark.parametrize(("option", "bads"), [
    ("--caps", {"0": "each cap must be at least 1", "4,-1": "each cap must be at least 1",
                "four": "not a list of request counts: 'four' (e.g. 4,8,16)"}),
    ("--rates", {"0": "each rate must be above 0 requests a second",
                 "19,-1": "each rate must be above 0 requests a second",
                 "fast": "not a list of arrival rates: 'fast' (e.g. 18.5,19.7)"}),
])
def test_list_options_refuse_nonsense(capsys, option, bads):
    from microbench.queue_model import main

    for bad, message in bads.items():
        with pytest.raises(SystemExit) as exc:
            main(["unused.json", option, bad])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert option in err and f"{option}: {message}" in err


def test_predict_on_a_committed_bench_result():
    path = Path(__file__).parents[2] / "bench" / "results" / "2026-12-02-h200-bench-0320464.json"
    out = predict(json.loads(path.read_text()), target_ms=250.0, seconds=120, caps=(4, 10**6))
    pred, measured = out["predicted_first_audio_ms"], out["measured_first_audio_ms"]
    assert out["tokens_per_request"] == 537 and out["rate_req_per_s"] > 10
    assert 32 * out["step_cost_ms"]["535"] < pred["p50"] < pred["p95"] < measured["p95"]
    assert 0 < out["scale_for_target"] < 1
    capped = out["capped_first_audio_ms"]
    assert capped[str(10**6)] == {"p50": round(pred["p50"], 1), "p95": round(pred["p95"], 1)}
    assert capped["4"]["p95"] > 0


def test_capacity_is_lines_per_step_over_their_steps():
    from microbench.queue_model import capacity

    assert capacity(COST, 500, 1, num_step=32) == pytest.approx(1 / (32 * 2.0 / 1000))
    assert capacity(COST, 500, 8, num_step=32) == pytest.approx(8 / (32 * 9.0 / 1000))
    assert capacity(COST, 500, 8) > capacity(COST, 500, 2) > capacity(COST, 500, 1)  # fuller steps, cheaper lines


def test_rates_predict_the_same_step_costs_at_other_loads():
    path = Path(__file__).parents[2] / "bench" / "results" / "2026-12-02-h200-bench-0320464.json"
    result = json.loads(path.read_text())
    own = result["server"]["loaded"]["rate_req_per_s"]
    out = predict(result, seconds=120, caps=(4,), rates=(own * 0.9, own, own * 1.05))
    at = out["first_audio_ms_at_rates"]
    pred = out["predicted_first_audio_ms"]
    assert at[str(own)] == {"p50": pred["p50"], "p95": pred["p95"]}
    assert at[str(own * 0.9)]["p95"] < pred["p95"] < at[str(own * 1.05)]["p95"]
    cap = out["capacity_req_per_s"]
    assert own < cap["4"] < cap["sharing"]  # four lines a step keep up with the load, with less room
