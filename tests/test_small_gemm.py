"""The small-step GEMM experiment (`bench/small_gemm.py`) computes x @ w.T, on the CPU through
Triton's interpreter (in a subprocess: the interpreter is chosen when Triton is imported): a
benchmark of a wrong kernel would mean nothing. Split-K tiles must also leave their counters
zeroed, or the next call (a CUDA graph's next replay) would add the wrong partials."""

from __future__ import annotations

import textwrap

import pytest

from tests.triton_interpreter import run_in_triton_interpreter

pytest.importorskip("triton")

SCRIPT = textwrap.dedent("""
    import torch
    from bench import small_gemm as sg

    torch.manual_seed(0)
    counters = torch.zeros(64, dtype=torch.int32)
    for n, k in ((128, 256), (64, 384)):
        w = torch.randn(n, k) * k ** -0.5
        tiles = [sg.GemmTile(32, 16, 32), sg.GemmTile(64, 32, 32, split_k=2), sg.GemmTile(32, 16, 64, split_k=3)]
        for tile in (t for t in tiles if t.fits(n, k)):
            # one row, fewer rows than a tile, several row tiles with a ragged last one
            for rows in (1, 9, 37):
                x = torch.randn(rows, k)
                for _ in range(2):  # the second call reuses the counters the first left
                    got = sg.small_linear(x, w, tile, counters)
                    err = float((got - x @ w.T).abs().max())
                    assert err < 1e-4, (n, k, tile, rows, err)
                    assert int(counters.abs().sum()) == 0, (tile, rows)
    # the table: the first bucket that holds the rows, cuBLAS past the last or for other shapes
    small, big = sg.GemmTile(32, 16, 32), sg.GemmTile(64, 32, 32, split_k=2)
    gemm = sg.SmallGemm("cpu", {(128, 256): ((16, small), (48, big))})
    assert gemm.tile_for(16, 128, 256) == small and gemm.tile_for(17, 128, 256) == big
    assert gemm.tile_for(49, 128, 256) is None and gemm.tile_for(4, 64, 256) is None
    x, w = torch.randn(40, 256), torch.randn(128, 256)
    assert float((gemm(x, w) - x @ w.T).abs().max()) < 1e-3
    print("ok")
""")


def test_kernel_in_the_interpreter():
    run_in_triton_interpreter(SCRIPT)


def test_tile_must_fit_the_projection():
    from bench.small_gemm import GemmTile

    assert GemmTile(64, 32, 64, split_k=2).fits(4096, 1024)
    assert not GemmTile(64, 32, 64, split_k=3).fits(4096, 1024)  # 1024 is not 3 x 64 x n
    assert not GemmTile(128, 32, 64).fits(1088, 1024)
