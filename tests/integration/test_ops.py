"""Health, readiness and Prometheus metrics of a real server."""

from __future__ import annotations

import httpx

from tests.support.chorus_client import metric_value

FAMILIES = ["chorus_requests_total", "chorus_queue_depth", "chorus_inflight_items", "chorus_inflight_requests",
            "chorus_packed_tokens_per_step_bucket", "chorus_step_seconds_bucket", "chorus_step_interval_seconds_bucket",
            "chorus_steps_total",
            "chorus_audio_seconds_total", "chorus_time_to_first_audio_seconds_bucket"]


def test_health_and_readiness(chorus_server):
    assert httpx.get(chorus_server.url + "/healthz").json() == {"status": "ok"}
    r = httpx.get(chorus_server.url + "/readyz")
    assert r.status_code == 200 and r.json() == {"ready": True, "engines": 1}


def test_metrics_count_what_happened(chorus_server):
    url = chorus_server.url

    def snapshot() -> dict[str, float]:
        return {
            "done": metric_value(url, "chorus_requests_total", endpoint="speech", outcome="done"),
            "invalid": metric_value(url, "chorus_requests_total", endpoint="speech", outcome="invalid_request"),
            "audio": metric_value(url, "chorus_audio_seconds_total"),
            "steps": metric_value(url, "chorus_steps_total", engine="engine0"),
            "step_obs": metric_value(url, "chorus_step_seconds_count", engine="engine0"),
            "tokens_obs": metric_value(url, "chorus_packed_tokens_per_step_count", engine="engine0"),
            "interval_obs": metric_value(url, "chorus_step_interval_seconds_count", engine="engine0"),
            "first_audio": metric_value(url, "chorus_time_to_first_audio_seconds_count"),
        }

    before = snapshot()
    r = httpx.post(url + "/v1/audio/speech", json={"input": "Count me.", "num_step": 5, "response_format": "pcm"},
                   timeout=60)
    assert r.status_code == 200
    seconds = len(r.content) / 2 / 24000
    request_id = r.headers["x-request-id"]
    def lines() -> list[str]:
        return [line for line in chorus_server.log().splitlines() if f"request_id={request_id} " in line]

    # the body can end before the engine's `done` is booked (metrics, then the log line)
    chorus_server.wait_for(lambda: any("chorus.service: done" in line and "outcome=done" in line
                                       for line in lines()), "the request's done log line")
    assert any("chorus.service: accepted" in line for line in lines()), lines()
    assert httpx.post(url + "/v1/audio/speech", json={"input": ""}).status_code == 422
    after = snapshot()
    assert after["done"] == before["done"] + 1 and after["invalid"] == before["invalid"] + 1
    assert abs(after["audio"] - before["audio"] - seconds) < 1e-3
    assert after["steps"] >= before["steps"] + 5
    assert after["step_obs"] - before["step_obs"] == after["steps"] - before["steps"]
    assert after["tokens_obs"] - before["tokens_obs"] == after["steps"] - before["steps"]
    # every step but the first after the engine idled has a launch-to-launch interval
    steps = after["steps"] - before["steps"]
    assert steps - 1 <= after["interval_obs"] - before["interval_obs"] < steps
    assert after["first_audio"] == before["first_audio"] + 1

    text = httpx.get(url + "/metrics").text
    for family in FAMILIES:
        assert family in text, family
    assert metric_value(url, "chorus_inflight_requests") == 0
    assert metric_value(url, "chorus_queue_depth", engine="engine0") == 0
