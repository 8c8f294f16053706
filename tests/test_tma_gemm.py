"""The TMA-loaded GEMM experiment (`bench/tma_gemm.py`) computes what the unfused path does,
on the CPU through Triton's interpreter (in a subprocess: the interpreter is chosen when
Triton is imported): a benchmark of a wrong kernel would mean nothing. The interpreter's
bfloat16 tensor-descriptor loads are not faithful, so it runs in float16 and float32."""

from __future__ import annotations

import textwrap

import pytest

from tests.triton_interpreter import run_in_triton_interpreter

pytest.importorskip("triton")

SCRIPT = textwrap.dedent("""
    import torch
    import triton
    from bench import tma_gemm as tg
    from bench.gemm_epilogues import gate_up_reference, qkv_reference, relative_error

    torch.manual_seed(0)
    hq, hkv, d, hidden, inter = 4, 2, 128, 128, 128
    tile = tg.TileConfig(64, 64, 64, 4, 2)
    # Triton 3.6's interpreter cannot take a program id as a loop bound (the persistent loop)
    old_interpreter = tuple(int(v) for v in triton.__version__.split(".")[:2]) < (3, 7)
    gate_up_kernels = [tg.gate_up_silu] + ([] if old_interpreter else [tg.gate_up_silu_persistent])
    # fewer rows than a tile, several row tiles with a ragged last one
    # (q/k angles come from exp2 in the kernel, from a power in the reference: 1e-4 in float32)
    for rows, dtype, limit, qk_limit in ((17, torch.float32, 1e-5, 1e-4), (70, torch.float16, 2e-3, 2e-3)):
        x = torch.randn(rows, hidden).to(dtype)
        w_gu = (torch.randn(2 * inter, hidden) * hidden ** -0.5).to(dtype)
        plain = tg.linear(x, w_gu, tile)
        assert plain.shape == (rows, 2 * inter)
        assert relative_error(plain, x.float() @ w_gu.float().T) < limit
        want = gate_up_reference(x, w_gu)
        for gate_up in gate_up_kernels:
            got = gate_up(x, w_gu, tile)
            assert got.shape == (rows, inter) and relative_error(got, want) < limit, rows
        w = (torch.randn((hq + 2 * hkv) * d, hidden) * hidden ** -0.5).to(dtype)
        norms = (1 + 0.1 * torch.randn(2, d)).to(dtype)
        pos = torch.randint(0, 4096, (rows,))
        want = qkv_reference(x, w, norms, pos, hq, hkv, 1e-6, 1e6)
        for got in (tg.qkv_norm_rope(x, w, norms, pos, hq, hkv, 1e-6, 1e6, tile),
                    tg.qkv_heads(x, w, norms, pos, hq, hkv, 1e-6, 1e6, tile, 1),
                    tg.qkv_heads(x, w, norms, pos, hq, hkv, 1e-6, 1e6, tile, 2)):
            assert [tuple(t.shape) for t in got] == [(rows, hq, d), (rows, hkv, d), (rows, hkv, d)]
            errors = [relative_error(g, t) for g, t in zip(got, want)]
            assert max(errors) < qk_limit, (rows, errors)
    print("ok")
""")


def test_kernels_in_the_interpreter():
    run_in_triton_interpreter(SCRIPT)
