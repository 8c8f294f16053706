"""Two projections with their next elementwise pass done in the GEMM's epilogue: an
experiment in Triton, measured and not adopted.

A layer of the packed forward runs 9-10 kernels one after another. Two of them only re-read
what a GEMM has just written: the q/k RMSNorm + RoPE pass after the QKV projection, and the
SiLU gate after the gate-up projection (on an H200, 5.2 + 2.9 us a layer at a lone line's
535 rows, 153 + 145 us at 34k rows). Here each of the two projections is one Triton GEMM that
finishes the job in registers:

- `qkv_norm_rope`: each program owns one head (two 64-column halves, as RoPE's rotate-half
  pairs them) of `bm` rows; a q or k head is normalised over its 128 columns, scaled by
  Qwen3's q/k norm weight and rotated by its row's position; a v head is written as is.
- `gate_up_silu`: each program owns `bn` columns of the gate and the same of the up
  projection; writes `silu(gate) * up`.

The accumulators are rounded to the model dtype before the epilogue's float32 arithmetic, as
the separate kernels read the GEMM's stored output. `python -m bench.epilogue_sweep` times
them against cuBLAS plus the separate kernel: with Triton 3.6's pointer-loaded, software-
pipelined GEMM they lose at every size (the QKV one by 50-76%), bar the gate-up one at 17k
rows and more (~4%), so the engine keeps cuBLAS. A fused epilogue pays only on a GEMM that
matches cuBLAS first (TMA loads, warp-specialised, 128x256 tiles: CUTLASS's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

try:  # Triton is optional: CPU installs use the unfused path
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001
    triton = None


@dataclass(frozen=True)
class TileConfig:
    """A GEMM program's tile: `bm` rows by `bn` columns of each of its two accumulators,
    `bk` of the inner dimension a stage; `group_m` row tiles share a column tile in launch
    order (L2 reuse of the weight)."""

    bm: int = 64
    bn: int = 64
    bk: int = 64
    warps: int = 4
    stages: int = 4
    group_m: int = 8

    @property
    def name(self) -> str:
        """`BMxBNxBK`, warps, stages, and the row-tile group when not 8: `128x64x64w4s3g4`."""
        group = "" if self.group_m == 8 else f"g{self.group_m}"
        return f"{self.bm}x{self.bn}x{self.bk}w{self.warps}s{self.stages}{group}"


DEFAULT_TILE = TileConfig()


if triton is not None:

    @triton.jit
    def _tile_ids(num_m, num_n, GROUP_M: tl.constexpr):
        """(row tile, column tile) of this program, `GROUP_M` row tiles per column sweep."""
        pid = tl.program_id(0)
        per_group = GROUP_M * num_n
        group = pid // per_group
        first_m = group * GROUP_M
        size_m = tl.minimum(num_m - first_m, GROUP_M)
        pid_m = first_m + (pid % per_group) % size_m
        pid_n = (pid % per_group) // size_m
        return pid_m, pid_n

    @triton.jit
    def _dual_dot(a, w, M, stride_a, stride_w, rows, col1, col2,
                  K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        """(a[rows] @ w[col1].T, a[rows] @ w[col2].T) in float32; rows past M read row M - 1
        (their results are never stored)."""
        safe_rows = tl.minimum(rows, M - 1).to(tl.int64)
        kk = tl.arange(0, BK)
        a_ptrs = a + safe_rows[:, None] * stride_a + kk[None, :]
        w1_ptrs = w + col1.to(tl.int64)[:, None] * stride_w + kk[None, :]
        w2_ptrs = w + col2.to(tl.int64)[:, None] * stride_w + kk[None, :]
        acc1 = tl.zeros((BM, BN), tl.float32)
        acc2 = tl.zeros((BM, BN), tl.float32)
        for _ in range(0, K, BK):
            x = tl.load(a_ptrs)
            acc1 = tl.dot(x, tl.trans(tl.load(w1_ptrs)), acc1)
            acc2 = tl.dot(x, tl.trans(tl.load(w2_ptrs)), acc2)
            a_ptrs += BK
            w1_ptrs += BK
            w2_ptrs += BK
        return acc1, acc2

    @triton.jit
    def _qkv_norm_rope_kernel(a, w, q_out, k_out, v_out, norms, pos, M, stride_a, stride_w, eps, log2_theta,
                              K: tl.constexpr, NQ: tl.constexpr, NK: tl.constexpr, HALF: tl.constexpr,
                              BM: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
        num_m = tl.cdiv(M, BM)
        pid_m, head = _tile_ids(num_m, NQ + 2 * NK, GROUP_M)
        rows = pid_m * BM + tl.arange(0, BM)
        d = tl.arange(0, HALF)
        col1 = head * (2 * HALF) + d
        acc1, acc2 = _dual_dot(a, w, M, stride_a, stride_w, rows, col1, col1 + HALF, K, BM, HALF, BK)
        # the GEMM's output as the unfused path stores it, then that path's float32 arithmetic
        x1 = acc1.to(q_out.dtype.element_ty).to(tl.float32)
        x2 = acc2.to(q_out.dtype.element_ty).to(tl.float32)
        row_ok = (rows < M)[:, None]
        r64 = rows.to(tl.int64)[:, None]
        dd = d[None, :]
        if head < NQ + NK:
            ms = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF)
            r = (1.0 / tl.sqrt(ms + eps))[:, None]
            wrow = (head >= NQ).to(tl.int32) * (2 * HALF)  # norms is [q_norm; k_norm], (2, D)
            n1 = x1 * r * tl.load(norms + wrow + dd).to(tl.float32)
            n2 = x2 * r * tl.load(norms + wrow + HALF + dd).to(tl.float32)
            p = tl.load(pos + tl.minimum(rows, M - 1)).to(tl.float32)[:, None]
            ang = p * tl.exp2(-(dd.to(tl.float32) / HALF) * log2_theta)
            two_pi = 6.283185307179586
            ang = ang - two_pi * tl.floor(ang / two_pi + 0.5)  # keeps the fast sin/cos accurate
            c = tl.cos(ang)
            s = tl.sin(ang)
            o1 = (n1 * c - n2 * s).to(q_out.dtype.element_ty)
            o2 = (n2 * c + n1 * s).to(q_out.dtype.element_ty)
            if head < NQ:
                dst = q_out + r64 * (NQ * 2 * HALF) + head * (2 * HALF) + dd
            else:
                dst = k_out + r64 * (NK * 2 * HALF) + (head - NQ) * (2 * HALF) + dd
            tl.store(dst, o1, mask=row_ok)
            tl.store(dst + HALF, o2, mask=row_ok)
        else:
            dst = v_out + r64 * (NK * 2 * HALF) + (head - NQ - NK) * (2 * HALF) + dd
            tl.store(dst, x1.to(v_out.dtype.element_ty), mask=row_ok)
            tl.store(dst + HALF, x2.to(v_out.dtype.element_ty), mask=row_ok)

    @triton.jit
    def _gate_up_silu_kernel(a, w, out, M, stride_a, stride_w, stride_out,
                             K: tl.constexpr, INTER: tl.constexpr,
                             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
        num_m = tl.cdiv(M, BM)
        pid_m, pid_n = _tile_ids(num_m, INTER // BN, GROUP_M)
        rows = pid_m * BM + tl.arange(0, BM)
        cols = pid_n * BN + tl.arange(0, BN)
        acc_gate, acc_up = _dual_dot(a, w, M, stride_a, stride_w, rows, cols, cols + INTER, K, BM, BN, BK)
        gate = acc_gate.to(out.dtype.element_ty).to(tl.float32)
        up = acc_up.to(out.dtype.element_ty).to(tl.float32)
        y = gate / (1.0 + tl.exp(-gate)) * up
        dst = out + rows.to(tl.int64)[:, None] * stride_out + cols[None, :]
        tl.store(dst, y.to(out.dtype.element_ty), mask=(rows < M)[:, None])


def qkv_outputs(x: torch.Tensor, w_qkv: torch.Tensor, num_q_heads: int, num_kv_heads: int):
    """(D, q, k, v) for x @ w_qkv.T: empty contiguous q (S, Hq, D), k and v (S, Hkv, D)."""
    seq, d = x.shape[0], w_qkv.shape[0] // (num_q_heads + 2 * num_kv_heads)
    return d, x.new_empty(seq, num_q_heads, d), x.new_empty(seq, num_kv_heads, d), x.new_empty(seq, num_kv_heads, d)


def _grid(rows: int, bm: int, col_tiles: int) -> tuple[int]:
    return (triton.cdiv(rows, bm) * col_tiles,)


def qkv_norm_rope(x: torch.Tensor, w_qkv: torch.Tensor, norms: torch.Tensor, pos: torch.Tensor,
                  num_q_heads: int, num_kv_heads: int, eps: float, theta: float,
                  cfg: TileConfig | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (S, hidden) @ w_qkv.T with Qwen3's q/k norm and RoPE applied -> q (S, Hq, D),
    k (S, Hkv, D), v (S, Hkv, D), all contiguous. `norms` is (2, D) = [q_norm; k_norm]."""
    seq, hidden = x.shape
    heads = num_q_heads + 2 * num_kv_heads
    d, q, k, v = qkv_outputs(x, w_qkv, num_q_heads, num_kv_heads)
    if seq == 0:
        return q, k, v
    cfg = cfg or DEFAULT_TILE
    assert x.stride(1) == 1 and w_qkv.is_contiguous() and norms.is_contiguous() and hidden % cfg.bk == 0
    _qkv_norm_rope_kernel[_grid(seq, cfg.bm, heads)](
        x, w_qkv, q, k, v, norms, pos, seq, x.stride(0), w_qkv.stride(0), float(eps), float(math.log2(theta)),
        K=hidden, NQ=num_q_heads, NK=num_kv_heads, HALF=d // 2, BM=cfg.bm, BK=cfg.bk, GROUP_M=cfg.group_m,
        num_warps=cfg.warps, num_stages=cfg.stages,
    )
    return q, k, v


def gate_up_silu(x: torch.Tensor, w_gate_up: torch.Tensor, cfg: TileConfig | None = None) -> torch.Tensor:
    """x (S, hidden) @ w_gate_up.T (gate rows, then up rows) -> silu(gate) * up, (S, inter)."""
    seq, hidden = x.shape
    inter = w_gate_up.shape[0] // 2
    out = x.new_empty(seq, inter)
    if seq == 0:
        return out
    cfg = cfg or DEFAULT_TILE
    assert x.stride(1) == 1 and w_gate_up.is_contiguous() and inter % cfg.bn == 0 and hidden % cfg.bk == 0
    _gate_up_silu_kernel[_grid(seq, cfg.bm, inter // cfg.bn)](
        x, w_gate_up, out, seq, x.stride(0), w_gate_up.stride(0), out.stride(0),
        K=hidden, INTER=inter, BM=cfg.bm, BN=cfg.bn, BK=cfg.bk, GROUP_M=cfg.group_m,
        num_warps=cfg.warps, num_stages=cfg.stages,
    )
    return out


# ---- the yardsticks: torch's float32 arithmetic ----------------------------------------------


def qkv_reference(x, w_qkv, norms, pos, num_q_heads, num_kv_heads, eps, theta):
    """`qkv_norm_rope` in float32 torch (the GEMM's output rounded once, as stored)."""
    from server.engine.kernels.qk_norm_rope import reference

    seq = x.shape[0]
    d = w_qkv.shape[0] // (num_q_heads + 2 * num_kv_heads)
    qkv = F.linear(x.float(), w_qkv.float()).to(x.dtype).view(seq, -1, d)
    q, k = reference(qkv, norms, pos, num_q_heads, num_kv_heads, eps, theta)
    return q, k, qkv[:, num_q_heads + num_kv_heads :]


def gate_up_reference(x, w_gate_up):
    """`gate_up_silu` in float32 torch."""
    gu = F.linear(x.float(), w_gate_up.float()).to(x.dtype).float()
    inter = gu.shape[1] // 2
    return (F.silu(gu[:, :inter]) * gu[:, inter:]).to(x.dtype)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))
