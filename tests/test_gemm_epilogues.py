"""The fused-epilogue GEMM experiment (`bench/gemm_epilogues.py`) computes what the unfused
path does, on the CPU through Triton's interpreter (in a subprocess: the interpreter is chosen
when Triton is imported): a benchmark of a wrong kernel would mean nothing."""

from __future__ import annotations

import textwrap

import pytest

from tests.triton_interpreter import run_in_triton_interpreter

pytest.importorskip("triton")

SCRIPT = textwrap.dedent("""
    import torch
    from bench import gemm_epilogues as ge

    torch.manual_seed(0)
    hq, hkv, d, hidden, inter = 4, 2, 32, 128, 96
    # one row, fewer rows than a tile, several row tiles with a ragged last one
    for rows in (1, 17, 70):
        x = torch.randn(rows, hidden)
        w = torch.randn((hq + 2 * hkv) * d, hidden) * hidden ** -0.5
        norms = 1 + 0.1 * torch.randn(2, d)
        pos = torch.randint(0, 4096, (rows,))
        got = ge.qkv_norm_rope(x, w, norms, pos, hq, hkv, 1e-6, 1e6, ge.TileConfig(16, 16, 32, 4, 2, 2))
        want = ge.qkv_reference(x, w, norms, pos, hq, hkv, 1e-6, 1e6)
        assert [tuple(t.shape) for t in got] == [(rows, hq, d), (rows, hkv, d), (rows, hkv, d)]
        assert all(t.is_contiguous() for t in got)
        errors = [ge.relative_error(g, t) for g, t in zip(got, want)]
        assert max(errors) < 1e-4, (rows, errors)
        w_gu = torch.randn(2 * inter, hidden) * hidden ** -0.5
        for bn in (16, 32):
            out = ge.gate_up_silu(x, w_gu, ge.TileConfig(16, bn, 32, 4, 2, 2))
            assert out.shape == (rows, inter)
            assert ge.relative_error(out, ge.gate_up_reference(x, w_gu)) < 1e-5, (rows, bn)
    print("ok")
""")


def test_kernels_in_the_interpreter():
    run_in_triton_interpreter(SCRIPT)
