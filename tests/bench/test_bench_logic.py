"""The benchmark's arithmetic and request mixes (no GPU needed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.metrics import SUMMARY_KEYS, Arch, build_summary, forward_flops, mfu, percentile, stats
from bench.mixes import (
    FRAME_RATE,
    audio_seconds,
    long_paragraph,
    mixed_knobs_mix,
    plain_mix,
    poisson_arrivals,
)


def test_plain_mix_is_seeded_and_in_range():
    a, b = plain_mix(256, seed=0), plain_mix(256, seed=0)
    assert a == b and plain_mix(256, seed=1) != a
    assert len({s.request_id for s in a}) == 256
    assert all(2.0 <= s.seconds <= 25.0 for s in a)
    assert all(s.frames == int(s.seconds * FRAME_RATE) == round(s.seconds * FRAME_RATE - 0.5) for s in a)
    assert 256 * 10 < audio_seconds(a) < 256 * 17
    assert all(s.text.endswith(".") and len(s.text.split()) >= 2 for s in a)


def test_mixed_knobs_shares():
    specs = mixed_knobs_mix(256, seed=0)
    base = plain_mix(256, seed=0)
    assert [(s.text, s.seconds) for s in specs] == [(s.text, s.seconds) for s in base]
    assert sum(s.clone for s in specs) == 128
    assert sum(s.guidance_scale == 0 for s in specs) == 64
    assert sum(s.num_step == 16 for s in specs) == 64
    assert not any(s.guidance_scale == 0 and s.num_step == 16 for s in specs)


def test_long_paragraph_and_arrivals():
    text = long_paragraph(0, 60.0)
    assert 120 <= len(text.split()) <= 200
    arrivals = poisson_arrivals(10.0, 60.0, seed=0)
    assert arrivals == sorted(arrivals) and all(0 < t < 60 for t in arrivals)
    assert 450 < len(arrivals) < 750


def test_flops_of_a_packed_step():
    arch = Arch()
    assert arch.matmul_params_per_layer * arch.layers == pytest.approx(440.4e6, rel=1e-3)
    one = forward_flops([280, 250], 500, arch)
    assert one == pytest.approx(2 * 440.4e6 * 530 + 4 * 16 * 128 * 28 * (280**2 + 250**2) + 2 * 1024 * 8200 * 500,
                                rel=1e-3)
    assert forward_flops([280, 250] * 2, 1000, arch) == pytest.approx(2 * one)
    assert mfu(989e12, 1.0) == pytest.approx(1.0)


def test_percentiles_and_stats():
    assert percentile([], 50) is None
    assert percentile([3, 1, 2], 50) == 2
    assert percentile([0, 10], 95) == pytest.approx(9.5)
    s = stats([1.0, 2.0, 3.0, 4.0])
    assert s["n"] == 4 and s["median"] == 2.5 and s["p95"] == pytest.approx(3.85)


def test_summary_has_every_key_and_nulls_for_missing_scenarios():
    assert build_summary({}) == {k: None for k in SUMMARY_KEYS}
    doc = {
        "meta": {"gpu": "NVIDIA H200", "dtype": "bfloat16", "commit": "abc"},
        "engine": {"throughput_256": {"audio_s_per_s": 300.0}, "single_10s": {"ms": {"median": 80.0}},
                   "mixed_knobs": {"audio_s_per_s": 270.0}, "long_60s": {"first_audio_ms": {"median": 100.0}},
                   "loaded": {"total_ms": {"p95": 1500.0}}},
        "reference": {"throughput_256": {"audio_s_per_s": 40.0}, "single_10s": {"ms": {"median": 800.0}}},
        "forward": {"mfu_8k_tokens": 0.5, "mfu_32k_tokens": 0.6},
        "server": {"single_10s": {"client_first_audio_ms": {"median": 55.0}, "gap_first_audio_ms": {"median": 2.0}},
                   "single_10s_fresh_lengths": {"client_first_audio_ms": {"median": 57.0}},
                   "long_60s_fast_start": {"client_first_audio_ms": {"median": 40.0}},
                   "throughput_256": {"audio_s_per_s": 295.0}, "loaded": {"client_first_audio_ms": {"p95": 240.0}}},
        "fp8": {"throughput_256": {"audio_s_per_s": 400.0}, "single_10s": {"ms": {"median": 52.0}}},
    }
    s = build_summary(doc)
    assert list(s) == list(SUMMARY_KEYS)
    assert s["throughput_vs_reference"] == 7.5 and s["single_vs_reference"] == 10.0
    assert s["mixed_knobs_vs_plain"] == 0.9 and s["mfu_8k_tokens"] == 0.5 and s["gpu"] == "NVIDIA H200"
    assert s["mfu_32k_tokens"] == 0.6 and s["ws_single_10s_first_audio_ms"] == 55.0 and s["ws_single_gap_ms"] == 2.0
    assert s["ws_long_fast_start_first_audio_ms"] == 40.0 and s["ws_long_first_audio_ms"] is None
    assert s["ws_single_fresh_length_first_audio_ms"] == 57.0
    assert s["ws_throughput_audio_s_per_s"] == 295.0 and s["ws_loaded_p95_first_audio_ms"] == 240.0
    assert s["fp8_throughput_audio_s_per_s"] == 400.0 and s["fp8_single_10s_ms"] == 52.0


def test_chorus_bench_cli_help_and_cpu_refusal():
    help_ = subprocess.run([sys.executable, "-m", "server", "bench", "--help"], capture_output=True, text=True,
                           timeout=120)
    assert help_.returncode == 0 and "--scenarios" in help_.stdout
    import torch

    if not torch.cuda.is_available():
        run = subprocess.run([sys.executable, "-m", "server", "bench", "--scenarios", "forward"],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 2 and "CUDA" in run.stderr


def test_bench_graph_limit_must_be_a_histogram_bucket(capsys):
    from bench.cli import build_parser

    assert build_parser().parse_args(["--graph-max-tokens", "4096"]).graph_max_tokens == 4096
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--graph-max-tokens", "5000"])
    assert ("argument --graph-max-tokens: invalid choice: 5000 (choose from 1024, 2048, 4096, 8192)"
            in capsys.readouterr().err)


def test_decode_profile_counts_the_codecs_operators(model):
    """The profile scenario's decode figures, on the CPU: the codec's own operators, counted once
    per decode (its 37 convolutions among them), no device figures off CUDA."""
    from bench.diagnose import profile_decode
    from server.engine.model.codec import Codec

    result = profile_decode(Codec(model), seconds=0.4, iters=2)
    assert result["wall_ms"] > 0 and result["kernel_ms"] is None and result["kernel_launches"] is None
    calls = {op["name"]: op["calls"] for op in result["top_host_operators"]}
    assert calls.get("aten::conv1d", 0) + calls.get("aten::conv_transpose1d", 0) == 37
    assert result["host_operators"] >= 37


def test_a_request_profiles_kernels_are_tabled_per_run_by_kind():
    """`profile_requests`' table, from profiler averages: GPU time and launches a run, by kind
    (the sampler's and the codec's kernels apart from the forward's), the largest first."""
    from types import SimpleNamespace

    from bench.diagnose import kernel_table

    events = [SimpleNamespace(key=key, count=count, device_time_total=us) for key, count, us in (
        ("nvjet_sm90_tst_128x144_64x6_2x1_v_bz_TNT", 96, 900.0),
        ("_cfg_scores_kernel", 96, 1700.0),
        ("void at::native::sbtopk::gatherTopK<float>", 96, 1200.0),
        ("_snake_kernel", 108, 800.0),
        ("sm80_xmma_fprop_implicit_gemm_tf32f32", 12, 940.0),
        ("_qk_norm_rope_kernel", 96, 300.0),
        ("Memcpy DtoH (Device -> Pinned)", 3, 0.0),  # no device time: left out
    )]
    table = kernel_table(events, runs=3, top=3)
    assert table["gpu_ms"] == round(5840.0 / 3 / 1e3, 3)
    assert table["launches"] == round((96 * 4 + 108 + 12) / 3)
    assert table["ms_by_kind"] == {"sampler": round(2900 / 3 / 1e3, 3), "decode": round(1740 / 3 / 1e3, 3),
                                   "gemm": 0.3, "qk_norm_rope": 0.1}
    assert [k["name"] for k in table["top_kernels"]] == ["_cfg_scores_kernel",
                                                         "void at::native::sbtopk::gatherTopK<float>",
                                                         "sm80_xmma_fprop_implicit_gemm_tf32f32"]
    assert table["top_kernels"][0] == {"us": round(1700 / 3, 1), "calls": 32.0, "us_per_call": round(1700 / 96, 2),
                                       "name": "_cfg_scores_kernel"}
