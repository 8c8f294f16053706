"""Small-step attention that normalises and rotates q/k as it loads them: an experiment,
measured on an H200 and not adopted.

A small step's layer runs the q/k RMSNorm + RoPE pass (`server.engine.kernels.qk_norm_rope`) and
then the Triton attention (`server.engine.kernels.attention.triton_backend`); the pass only re-reads and
re-writes what the QKV GEMM has just written (2.6-4.6 us a layer at 135-537 rows). Here the
attention kernel reads the raw QKV output instead and normalises each q tile once and each
key block as it streams it (`norm_rope_halves`, the pass's own arithmetic, rounded to the
model dtype as the pass stores it), so a layer has one kernel fewer. A program takes both q
heads of a kv head (`GQA_HEADS`), so a key block is normalised once for the two.

`python -m bench.normed_attention_sweep` times it against the two kernels: 2.2-2.7x slower
at every small-step layout (at 537 rows 34 us against 15.4; at 135 rows 19 against 8.3).
Each key block is normalised and rotated again by every q tile of its document (five times
for a 10 s line's conditional document), and the reductions and sin/cos of that work sit on
the critical path of every block, where the separate pass does it once for all rows at
memory speed. The engine keeps the two kernels.
"""

from __future__ import annotations

import math

import torch

from server.engine.kernels.attention.torch_backend import TorchAttention
from server.engine.kernels.attention.triton_backend import tile_table

try:  # Triton is optional: the sweep and the tests need it
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001
    triton = None


if triton is not None:
    from server.engine.kernels.qk_norm_rope import norm_rope_halves

    @triton.jit
    def _normed_doc_attention_kernel(qkv, o, w, pos, tiles, scale_log2, eps, log2_theta,
                                     s_tok, so_t, so_h,
                                     NQ: tl.constexpr, NK: tl.constexpr, HEADS: tl.constexpr,
                                     HALF: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
        """The engine's small-step attention kernel on the raw QKV projection: q and k heads are
        RMS-normalised and rotated as they are loaded (`norm_rope_halves`, rounded to the model
        dtype as the separate pass stores them), so no pass writes q and k first. A program takes `BM` rows
        of `HEADS` q heads that share one kv head (stacked, `HEADS * BM` query rows), so each
        key block is loaded and normalised once for all of them."""
        tile = tl.program_id(0)
        first_head = tl.program_id(1) * HEADS
        q_start = tl.load(tiles + 3 * tile)
        doc_end = tl.load(tiles + 3 * tile + 1)
        doc_start = tl.load(tiles + 3 * tile + 2)
        r = tl.arange(0, HEADS * BM)
        rows = q_start + r % BM
        head = (first_head + r // BM).to(tl.int64)[:, None]
        row_ok = rows < doc_end
        rows64 = rows.to(tl.int64)[:, None]
        d = tl.arange(0, HALF)[None, :]
        dt = qkv.dtype.element_ty
        src = qkv + rows64 * s_tok + head * (2 * HALF) + d
        x1 = tl.load(src, mask=row_ok[:, None], other=0.0).to(tl.float32)
        x2 = tl.load(src + HALF, mask=row_ok[:, None], other=0.0).to(tl.float32)
        wq1 = tl.load(w + d).to(tl.float32)  # w is [q_norm; k_norm], (2, D)
        wq2 = tl.load(w + HALF + d).to(tl.float32)
        wk1 = tl.load(w + 2 * HALF + d).to(tl.float32)
        wk2 = tl.load(w + 3 * HALF + d).to(tl.float32)
        pq = tl.load(pos + rows, mask=row_ok, other=0).to(tl.float32)[:, None]
        q1, q2 = norm_rope_halves(x1, x2, wq1, wq2, pq, eps, log2_theta, HALF)
        q1, q2 = q1.to(dt), q2.to(dt)
        kv_head = first_head // (NQ // NK)
        k_base = qkv + (NQ + kv_head) * (2 * HALF)
        v_base = qkv + (NQ + NK + kv_head) * (2 * HALF)
        dv = tl.arange(0, 2 * HALF)[None, :]
        m_i = tl.full([HEADS * BM], float("-inf"), tl.float32)
        l_i = tl.zeros([HEADS * BM], tl.float32)
        acc = tl.zeros([HEADS * BM, 2 * HALF], tl.float32)
        for n0 in range(doc_start, doc_end, BN):
            cols = n0 + tl.arange(0, BN)
            col_ok = cols < doc_end
            cols64 = cols.to(tl.int64)[:, None]
            k1 = tl.load(k_base + cols64 * s_tok + d, mask=col_ok[:, None], other=0.0).to(tl.float32)
            k2 = tl.load(k_base + cols64 * s_tok + HALF + d, mask=col_ok[:, None], other=0.0).to(tl.float32)
            pk = tl.load(pos + cols, mask=col_ok, other=0).to(tl.float32)[:, None]
            k1, k2 = norm_rope_halves(k1, k2, wk1, wk2, pk, eps, log2_theta, HALF)
            s = tl.dot(q1, tl.trans(k1.to(dt)))
            s = tl.dot(q2, tl.trans(k2.to(dt)), s) * scale_log2  # log2-scaled scores: exp2 below
            s = tl.where(col_ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            vt = tl.load(v_base + cols64 * s_tok + dv, mask=col_ok[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(dt), vt)
            m_i = m_new
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(o + rows64 * so_t + head * so_h + dv, out.to(o.dtype.element_ty), mask=row_ok[:, None])


# The fastest program shape on an H200 (`python -m bench.normed_attention_sweep`): 64 rows of
# both q heads of a kv head, key blocks of 32, eight warps.
GQA_HEADS = 2
NORMED_BLOCK_M = 64
NORMED_BLOCK_N = 32
NORMED_WARPS = 8
NORMED_STAGES = 2


def attend_normed(tiles: torch.Tensor, qkv: torch.Tensor, norms: torch.Tensor, pos: torch.Tensor,
                  num_q_heads: int, num_kv_heads: int, eps: float, theta: float, scale: float,
                  out: torch.Tensor | None = None, *, block_m: int = NORMED_BLOCK_M,
                  block_n: int = NORMED_BLOCK_N, heads: int = GQA_HEADS, num_warps: int = NORMED_WARPS,
                  num_stages: int = NORMED_STAGES) -> torch.Tensor:
    """Attention straight from the fused QKV projection qkv (S, Hq + 2 Hkv, D): q and k heads
    normalised by `norms` (2, D) = [q_norm; k_norm] and rotated by `pos` (S,) as they load
    (the arithmetic of `qk_norm_rope`), v read as it is -> (S, Hq, D). `heads` q heads of one
    kv head per program (1 up to Hq / Hkv)."""
    seq, width, dim = qkv.shape
    if out is None:
        out = qkv.new_empty(seq, num_q_heads, dim)
    if seq == 0 or tiles.shape[0] == 0:
        return out
    group = num_q_heads // num_kv_heads
    heads = min(heads, group)
    assert width == num_q_heads + 2 * num_kv_heads and group % heads == 0 and dim % 2 == 0
    assert qkv.stride(2) == 1 and qkv.stride(1) == dim and out.stride(2) == 1 and norms.is_contiguous()
    _normed_doc_attention_kernel[(tiles.shape[0], num_q_heads // heads)](
        qkv, out, norms, pos, tiles, float(scale * math.log2(math.e)), float(eps), float(math.log2(theta)),
        qkv.stride(0), out.stride(0), out.stride(1),
        NQ=num_q_heads, NK=num_kv_heads, HEADS=heads, HALF=dim // 2, BM=block_m, BN=block_n,
        num_warps=num_warps, num_stages=num_stages,
    )
    return out


def check(device, dtype: torch.dtype, num_q_heads: int, num_kv_heads: int, head_dim: int, eps: float,
          theta: float, doc_lens: tuple[int, ...] = (287, 250, 1, 70)) -> float:
    """Relative error of `attend_normed` against the float32 q/k norm + RoPE
    (`qk_norm_rope.reference`) and per-document SDPA on random data; raises when the kernel
    cannot run."""
    from server.engine.kernels import qk_norm_rope
    gen = torch.Generator(device="cpu").manual_seed(3)
    seq, scale = sum(doc_lens), head_dim**-0.5
    qkv = torch.randn(seq, num_q_heads + 2 * num_kv_heads, head_dim, generator=gen) * 3
    norms = 1 + 0.1 * torch.randn(2, head_dim, generator=gen)
    pos = torch.cat([torch.arange(n) for n in doc_lens])
    q, k = qk_norm_rope.reference(qkv, norms, pos, num_q_heads, num_kv_heads, eps, theta)
    ref_attn = TorchAttention(scale)
    ref = ref_attn.attend(ref_attn.plan(list(doc_lens)), q, k, qkv[:, num_q_heads + num_kv_heads:])
    tiles = tile_table(list(doc_lens), NORMED_BLOCK_M).to(device)
    out = attend_normed(tiles, qkv.to(device, dtype), norms.to(device, dtype), pos.to(device), num_q_heads,
                        num_kv_heads, eps, theta, scale)
    return float((out.float().cpu() - ref).norm() / ref.norm())
