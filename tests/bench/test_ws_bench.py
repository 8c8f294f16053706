"""The WebSocket scenarios of `chorus bench`, run small against a real server on the CPU:
the client's clocks, the engine's timings beside them, and audio counted as received."""

from __future__ import annotations

from bench import ws_bench as ws
from bench.mixes import plain_mix


def test_single_reports_client_and_engine_clocks(chorus_server):
    result = ws.run(ws.single(chorus_server.ws_url, seconds=1.0, runs=2, warmup=0))
    assert result["runs"] == 2
    client, engine = result["client_first_audio_ms"], result["engine_first_audio_ms"]
    assert client["n"] == engine["n"] == 2
    # the engine's clock starts when the server receives the frame: inside the client's
    assert client["min"] >= engine["min"] > 0
    assert result["gap_first_audio_ms"]["min"] >= 0
    assert result["client_done_ms"]["min"] >= client["min"]


def test_throughput_counts_audio_received_over_several_connections(chorus_server):
    specs = plain_mix(6, seed=3, lo=0.5, hi=1.5)
    specs = [s.__class__(s.request_id, s.text, s.seconds, num_step=2) for s in specs]
    result = ws.run(ws.throughput(chorus_server.ws_url, specs, connections=3))
    assert result["outcomes"] == {"done": 6}
    expected = sum(s.seconds for s in specs)
    # every request's audio arrives: its pinned duration, give or take post-processing's
    # trimmed silence and added padding
    assert 0.5 * expected < result["audio_seconds_received"] < 2 * expected
    assert result["audio_s_per_s"] > 0


def test_loaded_sends_poisson_arrivals_and_reports_percentiles(chorus_server):
    result = ws.run(ws.loaded(chorus_server.ws_url, max_audio_s_per_s=4.0, duration_s=2.0, seconds=1.0,
                              connections=2))
    assert result["requests"] >= 1
    assert result["outcomes"] == {"done": result["requests"]}
    assert result["client_first_audio_ms"]["n"] == result["requests"]
    assert result["engine_queue_ms"]["n"] == result["requests"]
    steps = result["server_steps"]  # read from the server's /metrics around the window
    assert "error" not in steps, steps
    assert steps["steps"] > 0 and steps["mean_packed_tokens"] > 0 and steps["mean_step_ms"] > 0
    assert 0 < steps["in_step_share"] <= 1.05


def test_step_watch_window_takes_only_the_readings_inside_it():
    """A level's busy share counts its measured seconds only: readings of the ramp before and
    of the idle tail after would dilute it."""
    watch = ws.StepWatch("http://unused")
    busy_from_5_to_15 = [(t, max(0.0, min(t, 15.0) - 5.0)) for t in range(0, 31, 5)]
    watch.readings = [ws.StepTotals(at=t, steps=100 * s, step_seconds=s, observed=100 * s, tokens=1000 * s,
                                    over_graph=0) for t, s in busy_from_5_to_15]
    watch.first, watch.last = watch.readings[0], watch.readings[-1]
    assert watch.result()["in_step_share"] == round(10 / 30, 3)
    assert watch.result(5.0, 15.0)["in_step_share"] == 1.0
    assert watch.result(5.0, 15.0)["wall_s"] == 10.0
    assert "error" in watch.result(6.0, 9.0)  # no two readings inside
