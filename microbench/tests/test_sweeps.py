"""The micro-benchmarks' own logic on a CPU: each refuses a machine without CUDA, a sweep row
times and checks its variants, and the attention probe fits its cost line."""

from __future__ import annotations

import runpy
import sys

import pytest

pytestmark = pytest.mark.bench


@pytest.mark.parametrize("module", ["microbench.attention_sweep", "microbench.attention_grid_probe",
                                    "microbench.gemm_algos", "microbench.kernels", "microbench.qk_rope_sweep"])
def test_each_refuses_a_machine_without_cuda(module, capsys, monkeypatch):
    """`python -m <module>` as its command line runs it (in this process: torch is imported once)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the sweep would run")
    monkeypatch.setattr(sys, "argv", [module])
    monkeypatch.delitem(sys.modules, module, raising=False)  # run afresh as __main__, as `-m` does
    with pytest.raises(SystemExit) as exited:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    assert exited.value.code == 2 and "CUDA" in capsys.readouterr().err


def test_a_sweep_row_times_each_variant_and_checks_it_against_the_default():
    """`variant_timings`, with a stand-in for the CUDA-graph timer: each label's time and bit
    equality, and the fastest label as `best`."""
    from microbench.sweeps import variant_timings

    calls = []

    def timer(fn):
        fn()
        return {1: 3.0, 2: 1.5, 4: 2.0}[calls[-1]]

    row = variant_timings({"w1": 1, "w2": 2, "w4": 4}, calls.append, lambda warps: warps != 2, timer=timer)
    assert row == {"w1": {"us": 3.0, "bitwise_equal_to_default": True},
                   "w2": {"us": 1.5, "bitwise_equal_to_default": False},
                   "w4": {"us": 2.0, "bitwise_equal_to_default": True}, "best": "w2"}
    assert calls == [1, 2, 4]


def test_attention_grid_probe_fits_a_program_s_fixed_and_per_block_cost():
    from microbench.attention_grid_probe import fit_line

    fixed, per_block = fit_line([(1, 4.0), (2, 4.9), (4, 6.7), (8, 10.3)])
    assert fixed == pytest.approx(3.1, abs=1e-9) and per_block == pytest.approx(0.9, abs=1e-9)
