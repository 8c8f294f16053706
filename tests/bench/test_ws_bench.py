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
