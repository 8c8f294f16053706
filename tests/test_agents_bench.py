"""`python -m bench.agents` runs end to end on a CPU: two agents for a few seconds against a
tiny `chorus serve` it starts, and writes a report of the documented shape with audio in it."""

from __future__ import annotations

import json
import subprocess
import sys

SUMMARY_KEYS = ["agents_sustained", "agents_sustained_fifo", "p95_first_audio_ms", "underruns",
                "loaded_p95_first_audio_ms_deadline", "loaded_p95_first_audio_ms_fifo",
                "throughput_ratio_deadline_vs_fifo", "minutes", "gpu", "commit"]


def test_agents_bench_reports_its_shape_with_audio(tiny_checkpoint, tmp_path):
    out = tmp_path / "agents.json"
    cmd = [sys.executable, "-m", "bench.agents", "--scheduling", "default", "--start", "2", "--max-agents", "2",
           "--level-seconds", "3", "--ramp-seconds", "0", "--sentences", "2-2", "--num-step", "2",
           "--throughput-requests", "4",
           "--loaded-seconds", "2", "--out", str(out), "--", "--model", str(tiny_checkpoint)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    summary = report["summary"]
    assert list(summary) == SUMMARY_KEYS
    assert summary["agents_sustained"] in (0, 1, 2) and summary["agents_sustained_fifo"] is None
    assert summary["gpu"] is None and summary["minutes"] > 0 and isinstance(summary["underruns"], int)
    assert report["meta"]["command"].startswith("python -m bench.agents")
    mode = report["modes"]["default"]
    first = mode["levels"][0]
    assert first["agents"] == 2 and first["turns"] >= 2 and first["turns_failed"] == 0
    assert first["audio_seconds"] > 0 and first["first_audio_ms"]["n"] == first["turns"]
    assert all(min(lv["underruns"], 50) == len(lv["underrun_list"]) for lv in mode["levels"])
    assert mode["throughput"]["outcomes"].get("done") == 4
    assert "loaded" in mode
