"""`bench.client_overhead` on CPU, briefly: every kind runs against a real server, each
round measures each kind once, and the summary's overheads are against the raw client's
median of the same request type."""

from __future__ import annotations

import asyncio

import pytest

from bench import client_overhead


@pytest.mark.bench
def test_client_overhead_runs_every_kind(chorus_url):
    report = asyncio.run(client_overhead.run(chorus_url, rounds=2, num_step=2, text="Hello there.", warmup=1))
    kinds = {"raw_stream", "raw_synthesize", "client_stream", "client_synthesize"}
    kinds |= {k for k in ("pipecat", "livekit") if k not in report.left_out}
    assert set(report.samples_ms) == kinds
    assert all(len(v) == 2 and all(ms > 0 for ms in v) for v in report.samples_ms.values())
    summary = report.to_json()["summary"]
    raw = summary["raw_stream"]["first_audio_ms_median"]
    assert summary["raw_stream"]["overhead_ms"] == 0
    assert summary["client_stream"]["overhead_ms"] == pytest.approx(
        summary["client_stream"]["first_audio_ms_median"] - raw, abs=2e-3)
    assert summary["client_synthesize"]["overhead_ms"] == pytest.approx(
        summary["client_synthesize"]["first_audio_ms_median"] - summary["raw_synthesize"]["first_audio_ms_median"],
        abs=2e-3)
