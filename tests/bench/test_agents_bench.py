"""`python -m bench.agents` (its `main`, in this process) runs end to end on a CPU: two agents
for a few seconds against a tiny `chorus serve` it starts, and writes a report of the
documented shape with audio in it."""

from __future__ import annotations

import json

import pytest

SUMMARY_KEYS = ["agents_sustained", "agents_sustained_fifo", "p95_first_audio_ms", "underruns",
                "loaded_p95_first_audio_ms_deadline", "loaded_p95_first_audio_ms_fifo",
                "throughput_ratio_deadline_vs_fifo", "minutes", "gpu", "commit"]


def test_agents_bench_reports_its_shape_with_audio(tiny_checkpoint, tmp_path, monkeypatch):
    """One level of two agents, one-sentence answers (each turn's audio is played back in real
    time), a first-audio bound a slow CPU meets (so no second, bisecting level runs). The bench
    runs in this process; the server it starts is its own process, forked by the tests' fork
    server (`tests.support.serverproc.LaunchedServer`)."""
    from bench import agents
    from tests.support.serverproc import LaunchedServer

    monkeypatch.setattr(agents, "ServerProcess", LaunchedServer)
    out = tmp_path / "agents.json"
    # The loaded run's Poisson arrivals come at a rate set by the measured throughput: with seed
    # 139 the first one falls within its 2 s at any throughput above 0.02 audio-s/s, however
    # busy the machine (with seed 0 it needed 13 audio-s/s, and a busy CPU sent no request).
    argv = ["--scheduling", "default", "--start", "2", "--max-agents", "2", "--level-seconds", "3",
            "--ramp-seconds", "0", "--sentences", "1-1", "--num-step", "2", "--p95-ms", "60000",
            "--throughput-requests", "4", "--seed", "139", "--loaded-seconds", "2", "--out", str(out),
            "--", "--model", str(tiny_checkpoint)]
    assert agents.main(argv) == 0
    report = json.loads(out.read_text())
    summary = report["summary"]
    assert list(summary) == SUMMARY_KEYS
    assert summary["agents_sustained"] in (0, 1, 2) and summary["agents_sustained_fifo"] is None
    assert summary["gpu"] is None and summary["minutes"] > 0 and isinstance(summary["underruns"], int)
    assert report["meta"]["command"].startswith("python -m bench.agents")
    assert report["meta"]["command"].endswith(f"-- --model {tiny_checkpoint}")  # the server's arguments too
    mode = report["modes"]["default"]
    first = mode["levels"][0]
    assert first["agents"] == 2 and first["turns"] >= 2 and first["turns_failed"] == 0
    assert first["audio_seconds"] > 0 and first["first_audio_ms"]["n"] == first["turns"]
    assert all(min(lv["underruns"], 50) == len(lv["underrun_list"]) for lv in mode["levels"])
    assert mode["throughput"]["outcomes"].get("done") == 4
    assert mode["loaded"]["requests"] > 0 and mode["loaded"]["outcomes"] == {"done": mode["loaded"]["requests"]}


def _report(mode: str, sustained: int, p95: float, thr: float, loaded: float, minutes: float, commit="abc") -> dict:
    level = {"agents": sustained, "passed": True, "underruns": 0, "first_audio_ms": {"p95": p95}}
    return {"summary": {"minutes": minutes},
            "meta": {"command": f"python -m bench.agents --scheduling {mode}", "gpu": "G", "commit": commit},
            "modes": {mode: {"agents_sustained": sustained, "at_sustained": level, "levels": [level],
                             "throughput": {"audio_s_per_s": thr},
                             "loaded": {"client_first_audio_ms": {"p95": loaded}}}}}


def test_combine_merges_modes_run_side_by_side(tmp_path):
    from bench.agents import combine

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_report("deadline", 96, 280.0, 200.0, 500.0, 7.5)))
    b.write_text(json.dumps(_report("fifo", 72, 290.0, 210.0, 600.0, 8.0)))
    merged = combine([str(a), str(b)])
    s = merged["summary"]
    assert list(s) == SUMMARY_KEYS
    assert (s["agents_sustained"], s["agents_sustained_fifo"], s["p95_first_audio_ms"]) == (96, 72, 280.0)
    assert (s["loaded_p95_first_audio_ms_deadline"], s["loaded_p95_first_audio_ms_fifo"]) == (500.0, 600.0)
    assert s["throughput_ratio_deadline_vs_fifo"] == round(200 / 210, 3) and s["minutes"] == 8.0
    assert [m["minutes"] for m in merged["meta"]["combined_from"]] == [7.5, 8.0]
    assert [m["command"] for m in merged["meta"]["combined_from"]] == [
        "python -m bench.agents --scheduling deadline", "python -m bench.agents --scheduling fifo"]


def test_a_fifo_only_run_fills_only_the_fifo_keys():
    from bench.agents import summary

    s = summary(_report("fifo", 64, 170.0, 259.6, 395.4, 6.8)["modes"], 6.8, "G", "abc")
    assert (s["agents_sustained_fifo"], s["loaded_p95_first_audio_ms_fifo"]) == (64, 395.4)
    assert s["agents_sustained"] is s["p95_first_audio_ms"] is s["loaded_p95_first_audio_ms_deadline"] is None
    assert s["underruns"] is None and s["throughput_ratio_deadline_vs_fifo"] is None


def test_combine_refuses_mixed_commits_and_repeated_modes(tmp_path):

    from bench.agents import combine

    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    a.write_text(json.dumps(_report("deadline", 96, 280.0, 200.0, 500.0, 7.5)))
    b.write_text(json.dumps(_report("fifo", 72, 290.0, 210.0, 600.0, 8.0, commit="other")))
    c.write_text(json.dumps(_report("deadline", 64, 250.0, 200.0, 500.0, 7.5)))
    with pytest.raises(ValueError, match="different commits"):
        combine([str(a), str(b)])
    with pytest.raises(ValueError, match="more than one report"):
        combine([str(a), str(c)])


def test_levels_option_parses_and_refuses_nonsense():

    from bench.agents import build_parser

    assert build_parser().parse_args(["--levels", "64,96"]).levels == [64, 96]
    for bad in ("0", "x", ""):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--levels", bad])
