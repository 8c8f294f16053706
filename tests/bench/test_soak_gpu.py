"""`python -m bench.soak_gpu`'s parts on a CPU: the calibrate-then-pace soak against a real
server (the tiny checkpoint, in process), the command line it records, and GPU memory read
from canned nvidia-smi outputs, per process or, where nvidia-smi cannot see the pids (as in
many containers), for the visible devices."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from types import SimpleNamespace

import pytest

import bench.soak_gpu as soak
from server.loadtest.cli import split_serve_args

SUMMARY_KEYS = {"minutes", "accepted", "lost", "violations", "rss_growth_pct", "gpu_mem_growth_pct",
                "gpu_mem_source", "audio_s_per_s", "target_audio_s_per_s", "share_of_calibrated",
                "share_of_measured_throughput", "sends_delayed_at_cap", "passed", "commit"}
DEVICES = "0, 1000\n1, 2000\n2, 4000\n"


def fake_nvidia_smi(monkeypatch, apps: str | Exception, devices: str = DEVICES) -> list[list[str]]:
    """subprocess.run answering nvidia-smi's two queries with canned text; returns the calls."""
    calls: list[list[str]] = []

    def run(cmd, **_kw):
        calls.append(cmd)
        if isinstance(apps, Exception):
            raise apps
        return SimpleNamespace(stdout=apps if cmd[1].startswith("--query-compute-apps") else devices)

    monkeypatch.setattr(subprocess, "run", run)
    return calls


def test_process_memory_counts_the_server_and_its_children(monkeypatch):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        fake_nvidia_smi(monkeypatch, f"{os.getpid()}, 100\n{child.pid}, 250\n0, 4000\n")
        assert soak.gpu_memory_mb(os.getpid()) == 350.0
        assert soak.gpu_memory_sample(os.getpid(), None, "0") == ("process", 350.0)
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize(("visible", "mb"), [(None, 7000.0), ("0,2", 5000.0), ("1", 2000.0), ("", None),
                                             ("GPU-5f3c", None), ("7", None)])
def test_device_memory_is_the_fallback_for_the_visible_gpus(monkeypatch, visible, mb):
    calls = fake_nvidia_smi(monkeypatch, "")  # nvidia-smi lists no process it can see
    assert soak.gpu_memory_mb(os.getpid()) is None
    assert soak.device_memory_mb(visible) == mb
    assert soak.gpu_memory_sample(os.getpid(), None, visible) == (("device", mb) if mb is not None else None)
    assert any("--query-gpu=index,memory.used" in c for c in calls)


def test_a_sampler_keeps_its_source(monkeypatch):
    fake_nvidia_smi(monkeypatch, f"{os.getpid()}, 100\n")
    assert soak.gpu_memory_sample(os.getpid(), "device", None) == ("device", 7000.0)  # never mixes in process
    fake_nvidia_smi(monkeypatch, "")
    assert soak.gpu_memory_sample(os.getpid(), "process", None) is None  # nor falls back mid-run
    sampler = soak.GpuSampler(os.getpid(), every=0.01, cuda_visible_devices="2")
    sampler.start()
    try:
        for _ in range(500):
            if len(sampler.samples) >= 2:
                break
            sampler.stop_event.wait(0.01)
    finally:
        sampler.stop_event.set()
        sampler.join()
    assert sampler.source == "device" and {mb for _, mb in sampler.samples} == {4000.0}


def test_no_nvidia_smi_means_no_samples(monkeypatch):
    fake_nvidia_smi(monkeypatch, FileNotFoundError("nvidia-smi"))
    assert soak.gpu_memory_mb(os.getpid()) is None and soak.device_memory_mb(None) is None
    assert soak.gpu_memory_sample(os.getpid(), None, None) is None


def test_the_soak_paces_at_a_share_of_its_calibration(chorus_server, monkeypatch):
    monkeypatch.setattr(soak, "_nvidia_smi", lambda *query: None)
    args = soak.build_parser().parse_args(["--minutes", "0.05", "--clients", "3", "--num-steps", "2",
                                           "--calibrate-seconds", "2", "--load", "0.5"])
    result = soak.run_soak(chorus_server.url, None, args)
    cal, summary = result["calibration"], result["summary"]
    assert set(summary) == SUMMARY_KEYS, summary
    assert summary["passed"] and summary["lost"] == 0 and summary["violations"] == 0, summary
    assert cal["passed"] and cal["audio_s_per_s"] > 0 and cal["requests_per_s"] > 0 and cal["audio_s_per_request"] > 0
    assert cal["seconds"] == 2 and result["settings"]["seconds"] == 3.0
    assert summary["target_audio_s_per_s"] == pytest.approx(0.5 * cal["audio_s_per_s"], rel=0.02)
    rate = result["settings"]["rate_per_s"]
    assert rate == pytest.approx(cal["soak_rate_per_s"], abs=0.001)
    assert rate == pytest.approx(0.5 * cal["requests_per_s"], rel=0.02)  # half the calibration's requests
    assert summary["share_of_calibrated"] is not None and summary["audio_s_per_s"] > 0
    assert result["gpu_mem_source"] is None and summary["gpu_mem_growth_pct"] is None


def test_without_calibration_the_soak_saturates(chorus_server, monkeypatch):
    monkeypatch.setattr(soak, "_nvidia_smi", lambda *query: None)
    args = soak.build_parser().parse_args(["--minutes", "0.01", "--clients", "2", "--num-steps", "2",
                                           "--calibrate-seconds", "0"])
    result = soak.run_soak(chorus_server.url, None, args)
    assert result["calibration"] is None and "rate_per_s" not in result["settings"]
    assert result["summary"]["passed"] and result["summary"]["target_audio_s_per_s"] is None


def test_the_recorded_command_reproduces_the_run():
    argv = ["--minutes", "2", "--load", "0.7", "--", "--model", "a dir", "--device", "cuda"]
    own, serve = split_serve_args(argv)
    args = soak.build_parser().parse_args(own)
    line = soak.command_line(args, serve, "1")
    env, rest = line.split(" ", 1)
    assert env == "CUDA_VISIBLE_DEVICES=1"
    words = shlex.split(rest)
    assert words[:3] == ["python", "-m", "bench.soak_gpu"]
    own2, serve2 = split_serve_args(words[3:])
    assert serve2 == serve and soak.build_parser().parse_args(own2) == args
    assert "--calibrate-seconds 30.0" in line  # defaults spelled out
    assert soak.command_line(args, [], None).startswith("python -m bench.soak_gpu ")


def test_the_command_line_help(capsys):
    with pytest.raises(SystemExit) as info:
        soak.main(["--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and "--calibrate-seconds" in out and "--load" in out
