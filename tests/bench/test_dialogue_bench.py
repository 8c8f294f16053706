"""`python -m bench.dialogue` run tiny on the CPU against a real server: the script it sends, and the
report's summary keys and what they hold."""

from __future__ import annotations

import json

from bench.dialogue import SPEAKERS, SUMMARY_KEYS, main, script
from server.jobs.split import estimate_seconds


def test_the_script_alternates_two_speakers_and_is_sized_by_the_estimator():
    lines = script(300.0, seed=2)
    total = sum(estimate_seconds(line["text"]) for line in lines)
    assert 300.0 <= total < 330.0 and 20 <= len(lines) <= 100
    assert [line["voice"] for line in lines[:4]] == [*SPEAKERS, *SPEAKERS]
    assert script(300.0, seed=2) == lines


def test_a_tiny_run_reports_its_summary(chorus_server, tmp_path):
    out = tmp_path / "dialogue.json"
    assert main(["--url", chorus_server.url, "--minutes", "0.2", "--runs", "2", "--warmup", "1",
                 "--num-step", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    summary = report["summary"]
    assert set(SUMMARY_KEYS) == set(summary)
    assert report["websocket"]["outcomes"] == {"done": 2}
    assert 0 < summary["dialogue_first_audio_ms"] <= summary["dialogue_first_audio_p95_ms"]
    assert summary["dialogue_first_audio_ms"] < summary["dialogue_done_s"] * 1e3
    assert summary["dialogue_lines"] == report["script"]["lines"] >= 2
    assert summary["dialogue_audio_seconds"] > 0 and summary["http_dialogue_first_audio_ms"] > 0
    assert report["meta"]["command"].startswith("python -m bench.dialogue --url")
