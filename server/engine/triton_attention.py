"""Attention within each document of a small packed row, in one short Triton kernel.

A lone request's step packs a few hundred rows in two or three documents. FlashInfer's
Hopper prefill kernel is built for long rows: at 135 rows it takes 7.3 us a layer, most of
it fixed cost, a sixth of a short chunk's forward. Here a program takes `BLOCK_M`
query rows of one document and one query head, and runs the usual online softmax over its
document's keys in `BLOCK_N` blocks (float32 scores and sums, the model's dtype for the
two matrix products' inputs): no planning beyond a table of tiles, and a grid of
tiles x heads that fills the GPU even for one short document.

`TritonAttention.plan(doc_lens)` makes that table (query start, document end, document
start per tile) on the host and copies it to the device without waiting; a graph
planner keeps it in a static buffer sized for its bucket, so a captured graph replays
any layout of that many documents and rows.
"""

from __future__ import annotations

import math

import torch

from server.engine.attention import TorchAttention, graph_layout
from server.engine.triton_env import INTERPRET

try:  # Triton is optional: CPU installs and machines without it use the other backends
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001
    triton = None

# Measured on an H200 against FlashInfer's Hopper kernel (16 q / 8 kv heads of 128, bf16, one
# layer's call replayed in a CUDA graph): 4.8 vs 7.3 us at 135 rows, 10.4 vs 11.0 at 537,
# 18.9 vs 18.2 at 1611, 45.6 vs 42.2 at 4296: worth it for steps of about a thousand rows.
BLOCK_M = 64
BLOCK_N = 64
NUM_WARPS = 4
NUM_STAGES = 3


if triton is not None:

    @triton.jit
    def _doc_attention_kernel(q, k, v, o, tiles, scale_log2,
                              sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, so_t, so_h,
                              GROUP: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
        tile = tl.program_id(0)
        head = tl.program_id(1).to(tl.int64)
        q_start = tl.load(tiles + 3 * tile)
        doc_end = tl.load(tiles + 3 * tile + 1)
        doc_start = tl.load(tiles + 3 * tile + 2)
        rows = q_start + tl.arange(0, BM)
        row_ok = rows < doc_end
        d = tl.arange(0, D)[None, :]
        kv_head = head // GROUP
        qt = tl.load(q + rows.to(tl.int64)[:, None] * sq_t + head * sq_h + d, mask=row_ok[:, None], other=0.0)
        m_i = tl.full([BM], float("-inf"), tl.float32)
        l_i = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, D], tl.float32)
        for n0 in range(doc_start, doc_end, BN):
            cols = n0 + tl.arange(0, BN)
            col_ok = cols < doc_end
            cols64 = cols.to(tl.int64)[:, None]
            kt = tl.load(k + cols64 * sk_t + kv_head * sk_h + d, mask=col_ok[:, None], other=0.0)
            s = tl.dot(qt, tl.trans(kt)) * scale_log2  # log2-scaled scores: exp2 below
            s = tl.where(col_ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            vt = tl.load(v + cols64 * sv_t + kv_head * sv_h + d, mask=col_ok[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
            m_i = m_new
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # 0 only in a table's empty tiles
        tl.store(o + rows.to(tl.int64)[:, None] * so_t + head * so_h + d, out.to(o.dtype.element_ty),
                 mask=row_ok[:, None])


if triton is not None:
    from server.engine.qk_norm_rope import norm_rope_halves

    @triton.jit
    def _normed_doc_attention_kernel(qkv, o, w, pos, tiles, scale_log2, eps, log2_theta,
                                     s_tok, so_t, so_h,
                                     NQ: tl.constexpr, NK: tl.constexpr, HEADS: tl.constexpr,
                                     HALF: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
        """`_doc_attention_kernel` on the raw QKV projection: q and k heads are RMS-normalised
        and rotated as they are loaded (`norm_rope_halves`, rounded to the model dtype as the
        separate pass stores them), so no pass writes q and k first. A program takes `BM` rows
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


def available(device: torch.device | None = None) -> bool:
    """Triton is importable and the kernel can run there (CUDA, or CPU under the interpreter)."""
    if triton is None:
        return False
    return device is None or torch.device(device).type == "cuda" or INTERPRET


def tile_table(doc_lens: list[int], block_m: int = BLOCK_M, tiles: int | None = None) -> torch.Tensor:
    """(tiles, 3) int32 on the host: (query start, document end, document start) of every
    `block_m`-row tile of every document, then empty tiles (0, 0, 0) up to `tiles`."""
    rows: list[tuple[int, int, int]] = []
    start = 0
    for n in doc_lens:
        rows.extend((q, start + n, start) for q in range(start, start + n, block_m))
        start += n
    if tiles is not None:
        if len(rows) > tiles:
            raise ValueError(f"{len(rows)} tiles do not fit a table of {tiles}")
        rows.extend([(0, 0, 0)] * (tiles - len(rows)))
    return torch.tensor(rows, dtype=torch.int32).reshape(-1, 3)


def max_tiles(num_docs: int, max_rows: int, block_m: int = BLOCK_M) -> int:
    """Tiles any layout of `num_docs` documents over `max_rows` rows can need."""
    return math.ceil(max_rows / block_m) + num_docs


def attend(tiles: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
           out: torch.Tensor | None = None, *, block_m: int = BLOCK_M, block_n: int = BLOCK_N,
           num_warps: int = NUM_WARPS, num_stages: int = NUM_STAGES) -> torch.Tensor:
    """q (S, Hq, D), k and v (S, Hkv, D) (any row and head strides, unit last stride) ->
    (S, Hq, D): each row attends to the rows of its document, as `tiles` lays them out."""
    seq, hq, dim = q.shape
    hkv = k.shape[1]
    if out is None:
        out = q.new_empty(seq, hq, dim)
    if seq == 0 or tiles.shape[0] == 0:
        return out
    assert q.stride(2) == k.stride(2) == v.stride(2) == out.stride(2) == 1 and hq % hkv == 0
    _doc_attention_kernel[(tiles.shape[0], hq)](
        q, k, v, out, tiles, float(scale * math.log2(math.e)),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        GROUP=hq // hkv, D=dim, BM=block_m, BN=block_n, num_warps=num_warps, num_stages=num_stages,
    )
    return out


# Programs of the normalising kernel: each takes BLOCK_M rows of GQA_HEADS q heads sharing a kv
# head, with NORMED_WARPS warps (chosen on an H200 by `python -m bench.normed_attention_sweep`).
GQA_HEADS = 2
NORMED_WARPS = 8
NORMED_STAGES = 2


def attend_normed(tiles: torch.Tensor, qkv: torch.Tensor, norms: torch.Tensor, pos: torch.Tensor,
                  num_q_heads: int, num_kv_heads: int, eps: float, theta: float, scale: float,
                  out: torch.Tensor | None = None, *, block_m: int = BLOCK_M, block_n: int = BLOCK_N,
                  heads: int = GQA_HEADS, num_warps: int = NORMED_WARPS,
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


class TritonPlan:
    """One step's tile table on the device, and the attention over it (`run`, as FlashInfer's
    wrappers are called)."""

    def __init__(self, tiles: torch.Tensor, scale: float):
        self.tiles = tiles
        self.scale = scale

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return attend(self.tiles, q, k, v, self.scale, out)

    def run_normed(self, qkv: torch.Tensor, norms: torch.Tensor, pos: torch.Tensor, num_q_heads: int,
                   num_kv_heads: int, eps: float, theta: float) -> torch.Tensor:
        return attend_normed(self.tiles, qkv, norms, pos, num_q_heads, num_kv_heads, eps, theta, self.scale)


def _to_device(table: torch.Tensor, device: torch.device, dst: torch.Tensor | None = None) -> torch.Tensor:
    """Copy a host table without waiting for the device: from page-locked memory, which the
    caching host allocator keeps until the copy has run (so planning ahead is safe)."""
    if device.type == "cuda":
        table = table.pin_memory()
    if dst is None:
        return table.to(device, non_blocking=True)
    dst.copy_(table, non_blocking=True)
    return dst


class TritonAttention:
    """Plans for the kernel above: one per eager step, one static table per graph bucket."""

    name = "triton"

    def __init__(self, device: torch.device, scale: float):
        self.device = torch.device(device)
        self.scale = scale

    def plan(self, doc_lens: list[int]) -> TritonPlan:
        return TritonPlan(_to_device(tile_table(doc_lens), self.device), self.scale)

    def attend(self, plan: TritonPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               out: torch.Tensor | None = None) -> torch.Tensor:
        return plan.run(q, k, v, out)

    def graph_planner(self, num_docs: int, max_rows: int) -> TritonGraphPlanner:
        return TritonGraphPlanner(self, num_docs, max_rows)


class TritonGraphPlanner:
    """A static tile table for exactly `num_docs` documents over `max_rows` rows: a graph
    captured with its plan replays whatever layout `plan` wrote there last."""

    def __init__(self, attn: TritonAttention, num_docs: int, max_rows: int):
        self.num_docs, self.max_rows = num_docs, max_rows
        self.tiles = torch.zeros(max_tiles(num_docs, max_rows), 3, dtype=torch.int32, device=attn.device)
        self._plan = TritonPlan(self.tiles, attn.scale)
        self._layout: tuple[int, ...] | None = None

    def plan(self, doc_lens: list[int]) -> TritonPlan:
        layout = graph_layout(doc_lens, self.num_docs, self.max_rows)
        if layout != self._layout:  # queued on the stream after every replay already launched
            _to_device(tile_table(doc_lens, tiles=self.tiles.shape[0]), self.tiles.device, self.tiles)
            self._layout = layout
        return self._plan


def check(device, dtype: torch.dtype, num_q_heads: int, num_kv_heads: int, head_dim: int,
          doc_lens: tuple[int, ...] = (287, 250, 1, 70)) -> float:
    """Relative error of the kernel against per-document SDPA in float32 on random data
    (half-precision rounding is about 4e-3 in bfloat16); raises when the kernel cannot run."""
    gen = torch.Generator(device="cpu").manual_seed(2)
    seq, scale = sum(doc_lens), head_dim**-0.5
    q, k, v = (torch.randn(seq, h, head_dim, generator=gen) for h in (num_q_heads, num_kv_heads, num_kv_heads))
    ref_attn = TorchAttention(scale)
    ref = ref_attn.attend(ref_attn.plan(list(doc_lens)), q, k, v)
    attn = TritonAttention(device, scale)
    out = attn.attend(attn.plan(list(doc_lens)), *(t.to(device, dtype) for t in (q, k, v))).float().cpu()
    return float((out - ref).norm() / ref.norm())


def check_normed(device, dtype: torch.dtype, num_q_heads: int, num_kv_heads: int, head_dim: int, eps: float,
                 theta: float, doc_lens: tuple[int, ...] = (287, 250, 1, 70)) -> float:
    """Relative error of `attend_normed` against the float32 q/k norm + RoPE
    (`qk_norm_rope.reference`) and per-document SDPA on random data; raises when the kernel
    cannot run."""
    from server.engine import qk_norm_rope

    gen = torch.Generator(device="cpu").manual_seed(3)
    seq, scale = sum(doc_lens), head_dim**-0.5
    qkv = torch.randn(seq, num_q_heads + 2 * num_kv_heads, head_dim, generator=gen) * 3
    norms = 1 + 0.1 * torch.randn(2, head_dim, generator=gen)
    pos = torch.cat([torch.arange(n) for n in doc_lens])
    q, k = qk_norm_rope.reference(qkv, norms, pos, num_q_heads, num_kv_heads, eps, theta)
    ref_attn = TorchAttention(scale)
    ref = ref_attn.attend(ref_attn.plan(list(doc_lens)), q, k, qkv[:, num_q_heads + num_kv_heads:])
    attn = TritonAttention(device, scale)
    out = attn.plan(list(doc_lens)).run_normed(qkv.to(device, dtype), norms.to(device, dtype), pos.to(device),
                                               num_q_heads, num_kv_heads, eps, theta)
    return float((out.float().cpu() - ref).norm() / ref.norm())
