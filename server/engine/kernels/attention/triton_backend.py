"""Attention within each document of a small packed row, in one short Triton kernel.

A program takes `BLOCK_M` query rows of one document and one head and runs the online softmax
over its document's keys; a tile table made on the host replaces planning, and a graph planner
keeps it in a static buffer. On Hopper, larger steps load tiles by TMA, smaller ones by pointers:
the same arithmetic in the same order (docs/architecture.md, "Kernels").
"""

from __future__ import annotations

import functools
import math

import torch

from server.engine.kernels.attention.base import graph_layout
from server.engine.kernels.attention.torch_backend import TorchAttention
from server.engine.kernels.triton_env import kernels_can_run

try:  # Triton is optional: CPU installs and machines without it use the other backends
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001
    triton = None
try:  # host-side tensor descriptors (TMA), in Triton from 3.3
    from triton.tools.tensor_descriptor import TensorDescriptor
except Exception:  # noqa: BLE001
    TensorDescriptor = None

# Tiles, warps and pipeline stages as the sweeps on Hopper chose them (docs/performance.md):
# pointer loads up to `POINTER_ROWS`, where TMA gains nothing in a whole forward.
BLOCK_M = 64
BLOCK_N = 64
NUM_WARPS = 4
NUM_STAGES = 3  # pointer loads
POINTER_ROWS = 1024  # steps of up to this many rows load by pointers on any GPU
TMA_STAGES = ((2048, 2), (1 << 62, 3))  # (up to this many rows, pipeline stages) with TMA loads


if triton is not None:

    @triton.jit
    def _softmax_block(s, col_ok, m_i, l_i):
        """One key block's log2-scaled scores `s` into the online softmax (keys past the
        document's end dropped): its weights, the rescale of what came before, the new row
        maxima and sums. Both loops below take it, in the same place."""
        s = tl.where(col_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)

    @triton.jit
    def _attend_tile(q, k, v, q_start, q_end, kv_start, kv_end, head, scale_log2,
                     sq_t, sq_h, sk_t, sk_h, sv_t, sv_h,
                     GROUP: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                     FUSED_ACC: tl.constexpr):
        """By pointer loads, the q tile of rows `q_start`.. (those before `q_end`) of one head
        against keys `kv_start`..`kv_end` of its kv head: the unnormalised output, the rows'
        log2-scaled maxima and sums, for the caller to divide or to merge with other key
        ranges. `FUSED_ACC`: the second product accumulates into the rescaled output."""
        rows = q_start + tl.arange(0, BM)
        row_ok = rows < q_end
        d = tl.arange(0, D)[None, :]
        kv_head = head // GROUP
        qt = tl.load(q + rows.to(tl.int64)[:, None] * sq_t + head * sq_h + d, mask=row_ok[:, None], other=0.0)
        m_i = tl.full([BM], float("-inf"), tl.float32)
        l_i = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, D], tl.float32)
        for n0 in range(kv_start, kv_end, BN):
            cols = n0 + tl.arange(0, BN)
            col_ok = cols < kv_end
            cols64 = cols.to(tl.int64)[:, None]
            kt = tl.load(k + cols64 * sk_t + kv_head * sk_h + d, mask=col_ok[:, None], other=0.0)
            s = tl.dot(qt, tl.trans(kt)) * scale_log2  # log2-scaled scores: exp2 below
            p, alpha, m_i, l_i = _softmax_block(s, col_ok, m_i, l_i)
            vt = tl.load(v + cols64 * sv_t + kv_head * sv_h + d, mask=col_ok[:, None], other=0.0)
            if FUSED_ACC:
                acc = tl.dot(p.to(vt.dtype), vt, acc * alpha[:, None])
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
        return acc, m_i, l_i

    @triton.jit
    def _doc_attention_kernel(q, k, v, o, tiles, scale_log2,
                              sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, so_t, so_h,
                              GROUP: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
        tile = tl.program_id(0)
        head = tl.program_id(1).to(tl.int64)
        q_start = tl.load(tiles + 3 * tile)
        doc_end = tl.load(tiles + 3 * tile + 1)
        doc_start = tl.load(tiles + 3 * tile + 2)
        acc, _maxima, l_i = _attend_tile(q, k, v, q_start, doc_end, doc_start, doc_end, head, scale_log2,
                                         sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, GROUP, D, BM, BN, False)
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # 0 only in a table's empty tiles
        rows = q_start + tl.arange(0, BM)
        d = tl.arange(0, D)[None, :]
        tl.store(o + rows.to(tl.int64)[:, None] * so_t + head * so_h + d, out.to(o.dtype.element_ty),
                 mask=(rows < doc_end)[:, None])

    @triton.jit
    def _doc_attention_tma_kernel(q_desc, k_desc, v_desc, o, tiles, scale_log2, so_t, so_h,
                                  GROUP: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                                  STAGES: tl.constexpr):
        tile = tl.program_id(0)
        head = tl.program_id(1)
        q_start = tl.load(tiles + 3 * tile)
        doc_end = tl.load(tiles + 3 * tile + 1)
        doc_start = tl.load(tiles + 3 * tile + 2)
        kv_col = (head // GROUP) * D
        qt = q_desc.load([q_start, head * D])
        m_i = tl.full([BM], float("-inf"), tl.float32)
        l_i = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, D], tl.float32)
        for n0 in tl.range(doc_start, doc_end, BN, num_stages=STAGES):
            kt = k_desc.load([n0, kv_col])
            s = tl.dot(qt, tl.trans(kt)) * scale_log2  # log2-scaled scores: exp2 below
            p, alpha, m_i, l_i = _softmax_block(s, (n0 + tl.arange(0, BN)) < doc_end, m_i, l_i)
            vt = v_desc.load([n0, kv_col])
            acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # 0 only in a table's empty tiles
        rows = q_start + tl.arange(0, BM)
        d = tl.arange(0, D)[None, :]
        tl.store(o + rows.to(tl.int64)[:, None] * so_t + head.to(tl.int64) * so_h + d, out.to(o.dtype.element_ty),
                 mask=(rows < doc_end)[:, None])


available = kernels_can_run  # whether this kernel can run on a device


@functools.cache
def tma_loads(device: torch.device) -> bool:
    """Whether the GPU has TMA (Hopper and later) and this Triton has host tensor descriptors."""
    return (triton is not None and TensorDescriptor is not None and device.type == "cuda"
            and torch.cuda.get_device_capability(device)[0] >= 9)


def tma_stages(rows: int) -> int:
    return next(stages for most_rows, stages in TMA_STAGES if rows <= most_rows)


def _descriptor_fits(x: torch.Tensor) -> bool:
    """Whether (S, H, D) can be read as 2D rows of H * D through a tensor descriptor."""
    return x.stride(1) == x.shape[2] and x.data_ptr() % 16 == 0 and x.stride(0) * x.element_size() % 16 == 0


def _rows_desc(x: torch.Tensor, block_rows: int):
    """(S, H, D) with head stride D -> a descriptor over the 2D (S, H * D), tiles of one head."""
    s, h, d = x.shape
    return TensorDescriptor(x, [s, h * d], [x.stride(0), 1], [block_rows, d])


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
           num_warps: int = NUM_WARPS, num_stages: int | None = None, tma: bool | None = None) -> torch.Tensor:
    """q (S, Hq, D), k and v (S, Hkv, D) (any row and head strides, unit last stride) ->
    (S, Hq, D): each row attends to the rows of its document, as `tiles` lays them out.
    `tma`: load through tensor descriptors (default: above `POINTER_ROWS` rows where the GPU
    has TMA and q, k and v have head stride D and 16-byte aligned rows); `num_stages`
    default: by loads and rows."""
    seq, hq, dim = q.shape
    hkv = k.shape[1]
    if out is None:
        out = q.new_empty(seq, hq, dim)
    if seq == 0 or tiles.shape[0] == 0:
        return out
    assert q.stride(2) == k.stride(2) == v.stride(2) == out.stride(2) == 1 and hq % hkv == 0
    scale_log2 = float(scale * math.log2(math.e))
    if tma is None:
        tma = seq > POINTER_ROWS and tma_loads(q.device) and all(_descriptor_fits(x) for x in (q, k, v))
    if tma:
        _doc_attention_tma_kernel[(tiles.shape[0], hq)](
            _rows_desc(q, block_m), _rows_desc(k, block_n), _rows_desc(v, block_n), out, tiles, scale_log2,
            out.stride(0), out.stride(1), GROUP=hq // hkv, D=dim, BM=block_m, BN=block_n,
            STAGES=num_stages or tma_stages(seq), num_warps=num_warps,
        )
        return out
    _doc_attention_kernel[(tiles.shape[0], hq)](
        q, k, v, out, tiles, scale_log2,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        GROUP=hq // hkv, D=dim, BM=block_m, BN=block_n, num_warps=num_warps, num_stages=num_stages or NUM_STAGES,
    )
    return out


class TritonPlan:
    """One step's tile table on the device, and the attention over it (`run`, as FlashInfer's
    wrappers are called)."""

    def __init__(self, tiles: torch.Tensor, scale: float, tma: bool = False):
        self.tiles = tiles
        self.scale = scale
        self.tma = tma

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        # with TMA: for enough rows, where the operands fit a descriptor (`attend` decides)
        return attend(self.tiles, q, k, v, self.scale, out, tma=None if self.tma else False)


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

    def __init__(self, device: torch.device, scale: float, tma: bool | None = None):
        self.device = torch.device(device)
        self.scale = scale
        self.tma = tma_loads(self.device) if tma is None else tma  # else pointer loads

    def plan(self, doc_lens: list[int]) -> TritonPlan:
        return TritonPlan(_to_device(tile_table(doc_lens), self.device), self.scale, self.tma)

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
        self._plan = TritonPlan(self.tiles, attn.scale, attn.tma)
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
    (half-precision rounding is about 4e-3 in bfloat16), the larger of its two loads where the
    device has TMA; raises when the kernel cannot run."""
    gen = torch.Generator(device="cpu").manual_seed(2)
    seq, scale = sum(doc_lens), head_dim**-0.5
    q, k, v = (torch.randn(seq, h, head_dim, generator=gen) for h in (num_q_heads, num_kv_heads, num_kv_heads))
    ref_attn = TorchAttention(scale)
    ref = ref_attn.attend(ref_attn.plan(list(doc_lens)), q, k, v)
    device = torch.device(device)
    tiles = _to_device(tile_table(list(doc_lens)), device)
    qd, kd, vd = (t.to(device, dtype) for t in (q, k, v))
    errors = []
    for tma in (False, True) if tma_loads(device) else (False,):
        out = attend(tiles, qd, kd, vd, scale, tma=tma).float().cpu()
        errors.append(float((out - ref).norm() / ref.norm()))
    return max(errors)
