"""`python -m bench.jobs` run tiny on the CPU against a real server: a long text as one job, then one
voice agent beside a running job; the report's summary keys and what they hold."""

from __future__ import annotations

import json

import pytest

from bench.jobs import SUMMARY_KEYS, long_text, main
from server.jobs.split import estimate_seconds


def test_the_long_text_is_sized_by_the_duration_estimator():
    text = long_text(120.0, seed=3)
    assert 120.0 <= estimate_seconds(text) < 150.0
    assert text.count("\n\n") >= 2 and "?" in text + "?"  # paragraphs of sentences
    assert long_text(120.0, seed=3) == text  # seeded


def test_a_tiny_run_reports_its_summary(chorus_server, tmp_path):
    out = tmp_path / "jobs.json"
    assert main(["--url", chorus_server.url, "--minutes", "0.2", "--num-step", "2", "--no-normalize",
                 "--format", "wav", "--with-agents", "0.5", "--throughput", "2",
                 "--level-seconds", "1.5", "--ramp-seconds", "0", "--job-lead-seconds", "0.5",
                 "--agents-in-threads", "--client-processes", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    summary = report["summary"]
    assert set(SUMMARY_KEYS) == set(summary)
    assert summary["job_items"] >= 2 and summary["job_audio_seconds"] > 0
    assert summary["job_audio_s_per_s"] == pytest.approx(summary["job_audio_seconds"] / summary["job_wall_seconds"],
                                                         rel=0.01)
    assert summary["agents"] == 1
    assert summary["agents_with_job_p95_first_audio_ms"] > 0
    assert summary["agents_alone_p95_first_audio_ms"] is None  # no --baseline
    assert summary["agents_with_job_underruns"] >= 0 and summary["job_audio_s_per_s_beside_agents"] >= 0
    assert report["job"]["status"] == "completed" and report["job"]["archive"]["bytes"] > 0
    jobs = report["agents_with_job"]["jobs"]
    assert jobs and jobs[-1]["status"] in ("completed", "cancelled")
    meta = report["meta"]
    assert meta["command"].startswith("python -m bench.jobs --url") and "commit" in meta
    assert set(meta["machine"]) >= {"gpu", "cpus", "host"}
