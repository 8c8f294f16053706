"""Projections with their next elementwise pass in the GEMM's epilogue, on TMA loads (Triton).

`bench/gemm_epilogues.py` did the same fusions on Triton's pointer-loaded GEMM, which runs
15-45% behind cuBLAS at the model's shapes, so they lost. Here the operands come in through
tensor descriptors (Hopper's TMA: one bulk copy a tile, no address arithmetic in the main
loop), as Triton's own Hopper matmul tutorials load them:

- `linear`: the plain projection, the yardstick of the GEMM's own rate against cuBLAS;
- `gate_up_silu`: `bn` columns of the gate and the same of the up projection a program;
  writes `silu(gate) * up` (`gate_up_silu_persistent`: the same with one program per SM
  walking the tiles);
- `qkv_norm_rope`: one head (128 columns) of `bm` rows a program; a q or k head is
  normalised, scaled and rotated as `qk_norm_rope` does (`norm_rope_halves`), a v head
  written as is.

Accumulators are rounded to the model's dtype before the epilogue's float32 arithmetic,
as the separate kernels read the GEMM's stored output. `python -m bench.tma_sweep` times
them against cuBLAS plus the separate kernel (`bench/results/*-tma-sweep.json`): the plain
GEMM runs 8-12% behind cuBLAS from 8k rows; the gate-up one still beats cuBLAS plus the gate
from ~4k rows, the QKV one loses everywhere (its epilogue costs more than the separate pass).
The engine took the gate-up kernel for steps of 4096 rows and more at 4860144 and dropped it:
the forward gained 0.7-2.5%, the 256 mix nothing (`*-fused-gate-ab.json`).
"""

from __future__ import annotations

import math

import torch

from bench.gemm_epilogues import TileConfig, qkv_outputs

try:  # Triton is optional: CPU installs use the unfused path
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor
except Exception:  # noqa: BLE001
    triton = None


# the default tile of these experiments: 128 x 128 (of each accumulator), eight warps
WIDE = TileConfig(128, 128, 64, 8, 3)

if triton is not None:
    from server.engine.kernels.qk_norm_rope import norm_rope_halves

    @triton.jit
    def _tile_ids(pid, num_m, num_n, GROUP_M: tl.constexpr):
        """(row tile, column tile) of tile `pid`: `GROUP_M` row tiles share a column sweep, so
        a weight tile is read from L2 by the programs that follow."""
        per_group = GROUP_M * num_n
        first_m = (pid // per_group) * GROUP_M
        size_m = tl.minimum(num_m - first_m, GROUP_M)
        return first_m + (pid % per_group) % size_m, (pid % per_group) // size_m

    @triton.jit
    def _dual_dot(a_desc, w_desc, off_m, col1, col2, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                  BK: tl.constexpr):
        """(a[rows] @ w[col1:+BN].T, a[rows] @ w[col2:+BN].T) in float32, one stream of a."""
        acc1 = tl.zeros((BM, BN), tl.float32)
        acc2 = tl.zeros((BM, BN), tl.float32)
        for k in range(0, K, BK):
            a = a_desc.load([off_m, k])
            acc1 = tl.dot(a, w_desc.load([col1, k]).T, acc1)
            acc2 = tl.dot(a, w_desc.load([col2, k]).T, acc2)
        return acc1, acc2

    @triton.jit
    def _gate_up_tile(a_desc, w_desc, o_desc, off_m, off_n, INTER: tl.constexpr, K: tl.constexpr,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        """One (BM, BN) tile of silu(gate) * up."""
        acc_gate, acc_up = _dual_dot(a_desc, w_desc, off_m, off_n, INTER + off_n, K, BM, BN, BK)
        # the GEMM's output as the unfused path stores it, then that path's float32 arithmetic
        gate = acc_gate.to(o_desc.dtype).to(tl.float32)
        up = acc_up.to(o_desc.dtype).to(tl.float32)
        o_desc.store([off_m, off_n], (gate / (1.0 + tl.exp(-gate)) * up).to(o_desc.dtype))

    @triton.jit
    def _gate_up_silu_kernel(a_desc, w_desc, o_desc, M, INTER: tl.constexpr, K: tl.constexpr,
                             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
        pid_m, pid_n = _tile_ids(tl.program_id(0), tl.cdiv(M, BM), INTER // BN, GROUP_M)
        _gate_up_tile(a_desc, w_desc, o_desc, pid_m * BM, pid_n * BN, INTER, K, BM, BN, BK)

    @triton.jit
    def _linear_kernel(a_desc, w_desc, o_desc, M, N: tl.constexpr, K: tl.constexpr,
                       BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
        pid_m, pid_n = _tile_ids(tl.program_id(0), tl.cdiv(M, BM), N // BN, GROUP_M)
        off_m, off_n = pid_m * BM, pid_n * BN
        acc = tl.zeros((BM, BN), tl.float32)
        for k in range(0, K, BK):
            acc = tl.dot(a_desc.load([off_m, k]), w_desc.load([off_n, k]).T, acc)
        o_desc.store([off_m, off_n], acc.to(o_desc.dtype))

    @triton.jit
    def _gate_up_silu_persistent(a_desc, w_desc, o_desc, M, INTER: tl.constexpr, K: tl.constexpr,
                                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                                 PROGRAMS: tl.constexpr, FLATTEN: tl.constexpr, WS: tl.constexpr):
        """`_gate_up_silu_kernel` with one program per SM walking the tiles."""
        num_m = tl.cdiv(M, BM)
        num_n: tl.constexpr = INTER // BN
        for tile in tl.range(tl.program_id(0), num_m * num_n, PROGRAMS, flatten=FLATTEN, warp_specialize=WS):
            pid_m, pid_n = _tile_ids(tile, num_m, num_n, GROUP_M)
            _gate_up_tile(a_desc, w_desc, o_desc, pid_m * BM, pid_n * BN, INTER, K, BM, BN, BK)

    @triton.jit
    def _qkv_norm_rope_kernel(a_desc, w_desc, q_desc, k_desc, v_desc, norms, pos, M, eps, log2_theta,
                              K: tl.constexpr, NQ: tl.constexpr, NK: tl.constexpr, HALF: tl.constexpr,
                              BM: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
        pid_m, head = _tile_ids(tl.program_id(0), tl.cdiv(M, BM), NQ + 2 * NK, GROUP_M)
        off_m = pid_m * BM
        col = head * (2 * HALF)
        acc1, acc2 = _dual_dot(a_desc, w_desc, off_m, col, col + HALF, K, BM, HALF, BK)
        dtype: tl.constexpr = q_desc.dtype
        x1 = acc1.to(dtype).to(tl.float32)
        x2 = acc2.to(dtype).to(tl.float32)
        if head < NQ + NK:
            rows = off_m + tl.arange(0, BM)
            d = tl.arange(0, HALF)[None, :]
            wrow = (head >= NQ).to(tl.int32) * (2 * HALF)  # norms is [q_norm; k_norm], (2, D)
            w1 = tl.load(norms + wrow + d).to(tl.float32)
            w2 = tl.load(norms + wrow + HALF + d).to(tl.float32)
            p = tl.load(pos + tl.minimum(rows, M - 1)).to(tl.float32)[:, None]
            o1, o2 = norm_rope_halves(x1, x2, w1, w2, p, eps, log2_theta, HALF)
            if head < NQ:
                q_desc.store([off_m, col], o1.to(dtype))
                q_desc.store([off_m, col + HALF], o2.to(dtype))
            else:
                kc = col - NQ * 2 * HALF
                k_desc.store([off_m, kc], o1.to(dtype))
                k_desc.store([off_m, kc + HALF], o2.to(dtype))
        else:
            vc = col - (NQ + NK) * 2 * HALF
            v_desc.store([off_m, vc], x1.to(dtype))
            v_desc.store([off_m, vc + HALF], x2.to(dtype))


    @triton.jit
    def _qkv_heads_kernel(a_desc, w_desc, q_desc, k_desc, v_desc, norms, pos, M, eps, log2_theta,
                          K: tl.constexpr, NQ: tl.constexpr, NK: tl.constexpr, HALF: tl.constexpr, HP: tl.constexpr,
                          BM: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
        """`_qkv_norm_rope_kernel` with `HP` whole heads a program in one accumulator (one dot
        of HP * 128 columns); the halves are taken apart in registers for the epilogue."""
        BN: tl.constexpr = HP * 2 * HALF
        pid_m, pid_n = _tile_ids(tl.program_id(0), tl.cdiv(M, BM), (NQ + 2 * NK) // HP, GROUP_M)
        off_m = pid_m * BM
        col = pid_n * BN
        acc = tl.zeros((BM, BN), tl.float32)
        for k in range(0, K, BK):
            acc = tl.dot(a_desc.load([off_m, k]), w_desc.load([col, k]).T, acc)
        dtype: tl.constexpr = q_desc.dtype
        x = acc.to(dtype)
        head = pid_n * HP
        if head < NQ + NK:
            halves = tl.permute(tl.reshape(x.to(tl.float32), [BM, HP, 2, HALF]), (0, 1, 3, 2))
            x1, x2 = tl.split(halves)  # (BM, HP, HALF) each
            rows = off_m + tl.arange(0, BM)
            d = tl.arange(0, HALF)[None, :]
            wrow = (head >= NQ).to(tl.int32) * (2 * HALF)  # norms is [q_norm; k_norm], (2, D)
            w1 = tl.load(norms + wrow + d).to(tl.float32)
            w2 = tl.load(norms + wrow + HALF + d).to(tl.float32)
            p = tl.load(pos + tl.minimum(rows, M - 1)).to(tl.float32)
            p = tl.reshape(tl.broadcast_to(p[:, None], (BM, HP)), (BM * HP, 1))
            o1, o2 = norm_rope_halves(tl.reshape(x1, (BM * HP, HALF)), tl.reshape(x2, (BM * HP, HALF)), w1, w2, p,
                                      eps, log2_theta, HALF)
            o = tl.join(tl.reshape(o1, (BM, HP, HALF)), tl.reshape(o2, (BM, HP, HALF)))
            y = tl.reshape(tl.permute(o, (0, 1, 3, 2)), (BM, BN)).to(dtype)
            if head < NQ:
                q_desc.store([off_m, col], y)
            else:
                k_desc.store([off_m, col - NQ * 2 * HALF], y)
        else:
            v_desc.store([off_m, col - (NQ + NK) * 2 * HALF], x)


def _desc(t: torch.Tensor, block: list[int]):
    return TensorDescriptor.from_tensor(t, block)


def _launch_opts(tile: TileConfig) -> dict:
    return {"num_warps": tile.warps, "num_stages": tile.stages}


def linear(x: torch.Tensor, w: torch.Tensor, tile: TileConfig = WIDE) -> torch.Tensor:
    """x (S, K) @ w.T, w (N, K) -> (S, N)."""
    seq, k = x.shape
    n = w.shape[0]
    out = x.new_empty(seq, n)
    if seq:
        grid = (triton.cdiv(seq, tile.bm) * (n // tile.bn),)
        _linear_kernel[grid](_desc(x, [tile.bm, tile.bk]), _desc(w, [tile.bn, tile.bk]),
                             _desc(out, [tile.bm, tile.bn]), seq, N=n, K=k, BM=tile.bm, BN=tile.bn, BK=tile.bk,
                             GROUP_M=tile.group_m, **_launch_opts(tile))
    return out


def gate_up_silu(x: torch.Tensor, w_gate_up: torch.Tensor, tile: TileConfig = WIDE) -> torch.Tensor:
    """x (S, hidden) @ w_gate_up.T (gate rows, then up rows) -> silu(gate) * up, (S, inter)."""
    seq, hidden = x.shape
    inter = w_gate_up.shape[0] // 2
    out = x.new_empty(seq, inter)
    if seq:
        assert inter % tile.bn == 0 and hidden % tile.bk == 0 and x.stride(1) == 1 and w_gate_up.is_contiguous()
        grid = (triton.cdiv(seq, tile.bm) * (inter // tile.bn),)
        _gate_up_silu_kernel[grid](_desc(x, [tile.bm, tile.bk]), _desc(w_gate_up, [tile.bn, tile.bk]),
                                   _desc(out, [tile.bm, tile.bn]), seq, INTER=inter, K=hidden, BM=tile.bm,
                                   BN=tile.bn, BK=tile.bk, GROUP_M=tile.group_m, **_launch_opts(tile))
    return out


def gate_up_silu_persistent(x: torch.Tensor, w_gate_up: torch.Tensor, tile: TileConfig = WIDE, *,
                            flatten: bool = True, warp_specialize: bool = False) -> torch.Tensor:
    """`gate_up_silu` with one program per SM (Triton's persistent matmul form)."""
    seq, hidden = x.shape
    inter = w_gate_up.shape[0] // 2
    out = x.new_empty(seq, inter)
    if seq:
        assert inter % tile.bn == 0 and hidden % tile.bk == 0
        tiles = triton.cdiv(seq, tile.bm) * (inter // tile.bn)
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4
        programs = min(tiles, sms)
        _gate_up_silu_persistent[(programs,)](
            _desc(x, [tile.bm, tile.bk]), _desc(w_gate_up, [tile.bn, tile.bk]), _desc(out, [tile.bm, tile.bn]), seq,
            INTER=inter, K=hidden, BM=tile.bm, BN=tile.bn, BK=tile.bk, GROUP_M=tile.group_m, PROGRAMS=programs,
            FLATTEN=flatten, WS=warp_specialize, **_launch_opts(tile))
    return out


def qkv_heads(x: torch.Tensor, w_qkv: torch.Tensor, norms: torch.Tensor, pos: torch.Tensor,
              num_q_heads: int, num_kv_heads: int, eps: float, theta: float, tile: TileConfig = WIDE,
              heads_per_program: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`qkv_norm_rope` with `heads_per_program` whole heads in one accumulator."""
    seq, hidden = x.shape
    heads = num_q_heads + 2 * num_kv_heads
    d, q, k, v = qkv_outputs(x, w_qkv, num_q_heads, num_kv_heads)
    hp = heads_per_program
    if seq:
        assert num_q_heads % hp == 0 and num_kv_heads % hp == 0
        bn = hp * d
        grid = (triton.cdiv(seq, tile.bm) * (heads // hp),)
        _qkv_heads_kernel[grid](
            _desc(x, [tile.bm, tile.bk]), _desc(w_qkv, [bn, tile.bk]),
            _desc(q.view(seq, -1), [tile.bm, bn]), _desc(k.view(seq, -1), [tile.bm, bn]),
            _desc(v.view(seq, -1), [tile.bm, bn]), norms, pos, seq, float(eps), float(math.log2(theta)),
            K=hidden, NQ=num_q_heads, NK=num_kv_heads, HALF=d // 2, HP=hp, BM=tile.bm, BK=tile.bk,
            GROUP_M=tile.group_m, **_launch_opts(tile))
    return q, k, v


def qkv_norm_rope(x: torch.Tensor, w_qkv: torch.Tensor, norms: torch.Tensor, pos: torch.Tensor,
                  num_q_heads: int, num_kv_heads: int, eps: float, theta: float,
                  tile: TileConfig = WIDE) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (S, hidden) @ w_qkv.T with Qwen3's q/k norm and RoPE -> q (S, Hq, D), k and v
    (S, Hkv, D), contiguous. `norms` is (2, D) = [q_norm; k_norm]; `tile.bn` is ignored
    (a program owns one head, as two halves)."""
    seq, hidden = x.shape
    heads = num_q_heads + 2 * num_kv_heads
    d, q, k, v = qkv_outputs(x, w_qkv, num_q_heads, num_kv_heads)
    if seq:
        half = d // 2
        grid = (triton.cdiv(seq, tile.bm) * heads,)
        _qkv_norm_rope_kernel[grid](
            _desc(x, [tile.bm, tile.bk]), _desc(w_qkv, [half, tile.bk]),
            _desc(q.view(seq, -1), [tile.bm, half]), _desc(k.view(seq, -1), [tile.bm, half]),
            _desc(v.view(seq, -1), [tile.bm, half]), norms, pos, seq, float(eps), float(math.log2(theta)),
            K=hidden, NQ=num_q_heads, NK=num_kv_heads, HALF=half, BM=tile.bm, BK=tile.bk,
            GROUP_M=tile.group_m, **_launch_opts(tile))
    return q, k, v
