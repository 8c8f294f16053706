"""`python -m bench.hostile` end to end on the CPU, one cheap attack: the report holds the probe's
latencies and the summary key per attack."""

from __future__ import annotations

import json

from bench import hostile


def test_the_report_has_a_probe_per_attack(tiny_checkpoint, tmp_path):
    out = tmp_path / "hostile.json"
    args = ["--checkpoint", str(tiny_checkpoint), "--out", str(out), "--attacks", "idle,expansion_flood"]
    assert hostile.main(args) == 0
    report = json.loads(out.read_text())
    assert set(report["attacks"]) == {"idle", "expansion_flood"}
    assert report["attacks"]["idle"]["healthz"]["probes"] > 10
    assert set(report["attacks"]["expansion_flood"]["ends"]) == {"text_too_long"}
    assert set(report["summary"]) == {"idle_healthz_max_ms", "expansion_flood_healthz_max_ms"}
