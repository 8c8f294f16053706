"""A small step's projections as one short Triton GEMM: an experiment, measured and not kept.

At a lone line's 544 packed rows or a fast-start chunk's 160, each of a layer's four
projections is a short, wide product that cuBLAS runs far from the card's limits (on an
H200, the QKV projection at 160 rows: 5.6-6.9 us for 8 MB of weights, which the memory
moves in under 2 us). Here the weights are the MMA's long side ("swap AB"): a program owns
`bn` output columns (weight rows) by `bm` packed rows and computes `W[cols] @ x[rows].T`,
loading each weight byte once per row tile. The narrow projections (O, down: 1024 columns)
split their inner dimension over `split_k` programs; the last of a tile's programs to finish
adds the float32 partials in a fixed order, writes the tile and resets the tile's counter
for the next call (or the next replay of a CUDA graph), so the result does not depend on
timing.

`python -m bench.small_gemm_sweep` times it against cuBLAS: 0.44-0.85x cuBLAS's speed at
every projection and row count (`bench/results/2026-12-01-h200-small-gemm-sweep.json`), so
the engine keeps cuBLAS. One lesson kept here: the inner loop's length must keep Triton's
divisibility hint (`k_per_split` is specialised); unspecialised, the loads' alignment is
unknown, nothing is copied asynchronously, the loop runs unpipelined and the kernel is
3-5x slower still.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass

import torch
import torch.nn.functional as F

try:  # Triton is optional: CPU installs have no use for this experiment
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001
    triton = None


@dataclass(frozen=True)
class GemmTile:
    """One program's share: `bn` output columns by `bm` rows, `bk` of the inner dimension a
    stage, that dimension split over `split_k` programs."""

    bn: int = 64
    bm: int = 64
    bk: int = 64
    split_k: int = 1
    warps: int = 4
    stages: int = 4

    def fits(self, n: int, k: int) -> bool:
        return n % self.bn == 0 and k % (self.split_k * self.bk) == 0


if triton is not None:

    @triton.jit(do_not_specialize=["rows"])
    def _small_gemm_kernel(x, w, y, partials, counters, rows, k_per_split, N, sx, sw, sy,
                           BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        pid_k = tl.program_id(2)
        cols = pid_n * BN + tl.arange(0, BN)
        r = pid_m * BM + tl.arange(0, BM)
        r_ok = r < rows
        kk = tl.arange(0, BK)
        k0 = pid_k * k_per_split
        w_ptrs = w + cols.to(tl.int64)[:, None] * sw + (k0 + kk)[None, :]
        x_ptrs = x + r.to(tl.int64)[:, None] * sx + (k0 + kk)[None, :]
        acc = tl.zeros((BN, BM), tl.float32)
        for _ in range(0, k_per_split, BK):
            wt = tl.load(w_ptrs)
            xt = tl.load(x_ptrs, mask=r_ok[:, None], other=0.0)
            acc = tl.dot(wt, tl.trans(xt), acc)
            w_ptrs += BK
            x_ptrs += BK
        y_ptrs = y + r.to(tl.int64)[None, :] * sy + cols[:, None]
        if SPLIT_K == 1:
            tl.store(y_ptrs, acc.to(y.dtype.element_ty), mask=r_ok[None, :])
        else:
            # partials: (SPLIT_K, row tiles * BM, N) float32; counters: one per output tile
            tile = pid_m * tl.num_programs(0) + pid_n
            plane = tl.num_programs(1) * BM * N
            p_ptrs = partials + r.to(tl.int64)[None, :] * N + cols[:, None]
            tl.store(p_ptrs + pid_k * plane, acc)
            done = tl.atomic_add(counters + tile, 1, sem="acq_rel")
            if done == SPLIT_K - 1:  # the last of the tile's programs: add them in order
                total = tl.load(p_ptrs, cache_modifier=".cg")
                for s in tl.static_range(1, SPLIT_K):
                    total += tl.load(p_ptrs + s * plane, cache_modifier=".cg")
                tl.store(y_ptrs, total.to(y.dtype.element_ty), mask=r_ok[None, :])
                tl.store(counters + tile, 0)


def small_linear(x: torch.Tensor, w: torch.Tensor, tile: GemmTile, counters: torch.Tensor | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """x (M, K) @ w (N, K).T -> (M, N) in x's dtype, float32 accumulation. `counters`: int32
    zeros, one per output tile at least, needed when `tile.split_k` > 1 (left zeroed)."""
    rows, k = x.shape
    n = w.shape[0]
    if not tile.fits(n, k) or w.shape[1] != k:
        raise ValueError(f"tile {tile} does not fit a ({n}, {k}) projection")
    assert x.stride(1) == 1 and w.stride(1) == 1
    if out is None:
        out = x.new_empty(rows, n)
    if rows == 0:
        return out
    grid = (n // tile.bn, math.ceil(rows / tile.bm), tile.split_k)
    if tile.split_k > 1:
        if counters is None or counters.numel() < grid[0] * grid[1]:
            raise ValueError(f"split-K needs {grid[0] * grid[1]} zeroed counters")
        partials = torch.empty(tile.split_k, grid[1] * tile.bm, n, device=x.device, dtype=torch.float32)
    else:
        counters = partials = out  # unused
    _small_gemm_kernel[grid](x, w, out, partials, counters, rows, k // tile.split_k, n,
                             x.stride(0), w.stride(0), out.stride(0),
                             BN=tile.bn, BM=tile.bm, BK=tile.bk, SPLIT_K=tile.split_k,
                             num_warps=tile.warps, num_stages=tile.stages)
    return out


Table = dict[tuple[int, int], tuple[tuple[int, GemmTile], ...]]


class SmallGemm:
    """`linear(x, w)` for the backbone (set as its `linear` before any forward): the Triton
    GEMM where `tiles` has a tile for the projection's (N, K) and the step's rows, cuBLAS
    otherwise. `tiles`: (N, K) -> ((largest rows, tile), ...) in ascending rows."""

    def __init__(self, device: torch.device, tiles: Table):
        self.tiles = dict(tiles)
        self._bounds = {shape: [m for m, _ in entries] for shape, entries in self.tiles.items()}
        most = max([(n // t.bn) * math.ceil(m / t.bm) for (n, _k), es in self.tiles.items() for m, t in es],
                   default=1)
        self.counters = torch.zeros(most, dtype=torch.int32, device=device)

    def tile_for(self, rows: int, n: int, k: int) -> GemmTile | None:
        bounds = self._bounds.get((n, k))
        i = bisect_left(bounds, rows) if bounds else 0
        return self.tiles[(n, k)][i][1] if bounds and i < len(bounds) else None

    def __call__(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        tile = self.tile_for(x.shape[0], w.shape[0], w.shape[1])
        if tile is None:
            return F.linear(x, w)
        return small_linear(x, w, tile, self.counters)
