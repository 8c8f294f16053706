"""The MLP's gate-up projection with its SiLU gate in the GEMM's epilogue (Triton, TMA loads).

Unfused, a large step's gate-up GEMM writes (S, 2 I) and `silu_and_mul` reads it all back to
write (S, I): at 34k packed rows about 0.6 GB a layer. Here each program computes a tile of
the gate and the same tile of the up projection from one stream of `x` (tensor descriptors:
Hopper's TMA loads the operands) and writes `silu(gate) * up` only. The accumulators are
rounded to the model's dtype first, as the separate kernel reads the stored GEMM output, so
it computes what cuBLAS plus `silu_and_mul` do; on an H200 its outputs were within 5e-7
(relative) of theirs.

On an H200 (`python -m bench.tma_sweep`, `bench/results/*-tma-sweep.json`) Triton's GEMM
runs ~7% behind cuBLAS's at these shapes, so the fusion pays only where the gate's own pass
costs more than that: from ~4k rows (34k rows: 763 against 821 us a layer); below, the
backbone keeps cuBLAS and the separate kernel (`MIN_ROWS`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

try:  # Triton is optional: CPU installs keep the unfused path
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor
except Exception:  # noqa: BLE001
    triton = None

# steps of at least this many packed rows use the fused kernel (measured crossover ~2-4k)
MIN_ROWS = 4096


@dataclass(frozen=True)
class Tile:
    """A program's tile: `bm` rows by `bn` columns of each accumulator, `bk` of the inner
    dimension a stage, `stages` stages in flight, `group_m` row tiles per column sweep."""

    bm: int = 128
    bn: int = 64
    bk: int = 64
    warps: int = 4
    stages: int = 3
    group_m: int = 8

    @property
    def name(self) -> str:
        group = "" if self.group_m == 8 else f"g{self.group_m}"
        return f"{self.bm}x{self.bn}x{self.bk}w{self.warps}s{self.stages}{group}"


# the measured best at 4k-34k rows on an H200: 128 rows x 64 columns of each accumulator
TILE = Tile()


if triton is not None:

    @triton.jit
    def tile_ids(pid, num_m, num_n, GROUP_M: tl.constexpr):
        """(row tile, column tile) of tile `pid`: `GROUP_M` row tiles share a column sweep, so
        a weight tile is read from L2 by the programs that follow."""
        per_group = GROUP_M * num_n
        first_m = (pid // per_group) * GROUP_M
        size_m = tl.minimum(num_m - first_m, GROUP_M)
        return first_m + (pid % per_group) % size_m, (pid % per_group) // size_m

    @triton.jit
    def _gate_up_silu_kernel(a_desc, w_desc, o_desc, M, INTER: tl.constexpr, K: tl.constexpr,
                             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
        pid_m, pid_n = tile_ids(tl.program_id(0), tl.cdiv(M, BM), INTER // BN, GROUP_M)
        off_m, off_n = pid_m * BM, pid_n * BN
        acc_gate = tl.zeros((BM, BN), tl.float32)
        acc_up = tl.zeros((BM, BN), tl.float32)
        for k in range(0, K, BK):
            a = a_desc.load([off_m, k])
            acc_gate = tl.dot(a, w_desc.load([off_n, k]).T, acc_gate)
            acc_up = tl.dot(a, w_desc.load([INTER + off_n, k]).T, acc_up)
        # the GEMM's output as the unfused path stores it, then that path's float32 arithmetic
        gate = acc_gate.to(o_desc.dtype).to(tl.float32)
        up = acc_up.to(o_desc.dtype).to(tl.float32)
        o_desc.store([off_m, off_n], (gate / (1.0 + tl.exp(-gate)) * up).to(o_desc.dtype))


def available(device: torch.device | None = None) -> bool:
    return triton is not None and (device is None or torch.device(device).type == "cuda")


def supports(hidden: int, inter: int, tile: Tile = TILE) -> bool:
    """Whether the tile divides the model's MLP (Qwen3-0.6B: 1024 -> 3072)."""
    return hidden % tile.bk == 0 and inter % tile.bn == 0


def gate_up_silu(x: torch.Tensor, w_gate_up: torch.Tensor, tile: Tile = TILE) -> torch.Tensor:
    """x (S, hidden) @ w_gate_up.T (gate rows, then up rows) -> silu(gate) * up, (S, inter)."""
    seq, hidden = x.shape
    inter = w_gate_up.shape[0] // 2
    out = x.new_empty(seq, inter)
    if seq == 0:
        return out
    assert supports(hidden, inter, tile) and x.stride(1) == 1 and w_gate_up.is_contiguous()
    grid = (triton.cdiv(seq, tile.bm) * (inter // tile.bn),)
    desc = TensorDescriptor.from_tensor
    _gate_up_silu_kernel[grid](
        desc(x, [tile.bm, tile.bk]), desc(w_gate_up, [tile.bn, tile.bk]), desc(out, [tile.bm, tile.bn]), seq,
        INTER=inter, K=hidden, BM=tile.bm, BN=tile.bn, BK=tile.bk, GROUP_M=tile.group_m,
        num_warps=tile.warps, num_stages=tile.stages,
    )
    return out


def reference(x: torch.Tensor, w_gate_up: torch.Tensor) -> torch.Tensor:
    """The unfused arithmetic in float32 torch: the GEMM's output rounded once, as stored."""
    inter = w_gate_up.shape[0] // 2
    gu = (x.float() @ w_gate_up.float().T).to(x.dtype).float()
    return (torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]).to(x.dtype)


def check(device, dtype: torch.dtype, hidden: int, inter: int, rows: int = 300) -> float:
    """Relative error of the kernel against `reference` on random data (a partial row tile
    included); raises when the kernel cannot run."""
    gen = torch.Generator(device="cpu").manual_seed(2)
    x = torch.randn(rows, hidden, generator=gen).to(device, dtype)
    w = (torch.randn(2 * inter, hidden, generator=gen) * hidden**-0.5).to(device, dtype)
    got, want = gate_up_silu(x, w).float(), reference(x, w).float()
    return float((got - want).norm() / want.norm())
