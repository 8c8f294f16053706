"""Does splitting a document's keys across programs shorten the small-step attention? (CUDA)

`python -m bench.split_kv_sweep --out sweep.json`. At a lone 10 s line's 537 rows the Triton
attention takes ~10 us a layer, at a fast-start chunk's 135 rows ~4.6: about 1.8 us for each
64-key block a program walks, whatever the tile shape (`-attention-sweep*.json`), so the
kernel looks bound by the length of one program's loop, not by the GPU's rate. Here the
keys of each long document are split into parts of at most `max_blocks` blocks, one program
a part (as flash-decoding splits a long cache); each part writes its softmax state (row
maxima, sums, float32 outputs) to a scratch buffer and bumps a counter, and the program that
bumps it last merges the parts and writes the rows, so it stays one kernel (a graph node).
Also timed: the engine's kernel with its second product accumulating into the rescaled
output (`tl.dot(p, v, acc)`, as FlashAttention's tutorials write it) instead of adding a
fresh product. One layer's call (16 q / 8 kv heads of 128, bf16) replayed 28 times from a
CUDA graph; microseconds a call and the largest difference from the engine's kernel.
"""

from __future__ import annotations

import json
import math

import torch

from bench.attention_sweep import HKV, HQ, LAYOUTS as SWEEP_LAYOUTS, D
from bench.sweeps import cuda_sweep_parser, per_call_us, run_cuda_sweep

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001
    triton = None

LAYOUTS = {name: SWEEP_LAYOUTS[name] for name in ("fast_start_135", "lone_537", "lone_bucket_544")}
LAYOUTS |= {"two_1074": [287, 250] * 2} | {name: SWEEP_LAYOUTS[name] for name in ("three_1611", "eight_4296")}
COLUMNS = 7  # query start, document end, key start, key end, merge slot (-1: alone), part, parts

if triton is not None:
    from server.engine.kernels.attention.triton_backend import _attend_tile  # the engine kernel's tile and key loop

    COLUMNS_C = tl.constexpr(COLUMNS)

    @triton.jit
    def _split_kv_kernel(q, k, v, o, tiles, part_ml, part_acc, counters, scale_log2,
                         sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, so_t, so_h,
                         HQ: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, BM: tl.constexpr,
                         BN: tl.constexpr, MAX_PARTS: tl.constexpr, FUSED_ACC: tl.constexpr):
        tile = tl.program_id(0)
        head = tl.program_id(1)
        row = tiles + COLUMNS_C * tile
        q_start = tl.load(row)
        doc_end = tl.load(row + 1)
        kv_lo = tl.load(row + 2)
        kv_hi = tl.load(row + 3)
        slot = tl.load(row + 4)
        part = tl.load(row + 5)
        parts = tl.load(row + 6)
        h64 = head.to(tl.int64)
        acc, m_i, l_i = _attend_tile(q, k, v, q_start, doc_end, kv_lo, kv_hi, h64, scale_log2,
                                     sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, GROUP, D, BM, BN, FUSED_ACC)
        rows = q_start + tl.arange(0, BM)
        row_ok = rows < doc_end
        d = tl.arange(0, D)[None, :]
        r = tl.arange(0, BM)
        out_ptrs = o + rows.to(tl.int64)[:, None] * so_t + h64 * so_h + d
        if parts == 1:
            tl.store(out_ptrs, (acc / tl.where(l_i > 0, l_i, 1.0)[:, None]).to(o.dtype.element_ty),
                     mask=row_ok[:, None])
        else:
            group = slot.to(tl.int64) * HQ + h64
            mine = group * MAX_PARTS + part
            tl.store(part_ml + mine * 2 * BM + r, m_i)
            tl.store(part_ml + mine * 2 * BM + BM + r, l_i)
            tl.store(part_acc + mine * BM * D + r[:, None] * D + d, acc)
            tl.debug_barrier()  # every thread's partial stored before the count says so
            done = tl.atomic_add(counters + group, 1, sem="acq_rel", scope="gpu")
            if done == parts - 1:  # the last part of this tile and head: merge them all
                for other in range(0, parts):
                    if other != part:
                        theirs = group * MAX_PARTS + other
                        m_o = tl.load(part_ml + theirs * 2 * BM + r, cache_modifier=".cg")
                        l_o = tl.load(part_ml + theirs * 2 * BM + BM + r, cache_modifier=".cg")
                        a_o = tl.load(part_acc + theirs * BM * D + r[:, None] * D + d, cache_modifier=".cg")
                        m_new = tl.maximum(m_i, m_o)
                        x = tl.exp2(m_i - m_new)
                        y = tl.exp2(m_o - m_new)
                        l_i = l_i * x + l_o * y
                        acc = acc * x[:, None] + a_o * y[:, None]
                        m_i = m_new
                tl.store(out_ptrs, (acc / tl.where(l_i > 0, l_i, 1.0)[:, None]).to(o.dtype.element_ty),
                         mask=row_ok[:, None])
                tl.atomic_xchg(counters + group, 0)  # ready for the next call


def split_table(doc_lens: list[int], block_m: int, block_n: int, max_blocks: int) -> tuple[torch.Tensor, int, int]:
    """(rows, 7) int32 tile table, the merge slots it uses and the most parts of one tile: a
    document of more than `max_blocks` key blocks has its keys split into that many parts
    of at most `max_blocks` blocks (0: never split)."""
    rows, slots, most, start = [], 0, 1, 0
    for n in doc_lens:
        blocks = math.ceil(n / block_n)
        parts = max(1, math.ceil(blocks / max_blocks)) if max_blocks else 1
        per = math.ceil(blocks / parts) * block_n
        for q in range(start, start + n, block_m):
            if parts == 1:
                rows.append((q, start + n, start, start + n, -1, 0, 1))
                continue
            for part in range(parts):
                lo = start + part * per
                rows.append((q, start + n, lo, min(start + n, lo + per), slots, part, parts))
            slots += 1
            most = max(most, parts)
        start += n
    return torch.tensor(rows, dtype=torch.int32).reshape(-1, COLUMNS), slots, most


class SplitAttention:
    """One layout's table and scratch; `__call__(q, k, v, out)` runs the kernel."""

    def __init__(self, doc_lens: list[int], device, max_blocks: int, block_m: int = 64, block_n: int = 64,
                 num_warps: int = 4, num_stages: int = 3, fused_acc: bool = False):
        table, slots, most = split_table(doc_lens, block_m, block_n, max_blocks)
        self.tiles = table.to(device)
        self.parts = most
        self.part_ml = torch.empty(max(slots, 1) * HQ * most * 2 * block_m, device=device, dtype=torch.float32)
        self.part_acc = torch.empty(max(slots, 1) * HQ * most * block_m * D, device=device, dtype=torch.float32)
        self.counters = torch.zeros(max(slots, 1) * HQ, device=device, dtype=torch.int32)
        self.kw = dict(HQ=HQ, GROUP=HQ // HKV, D=D, BM=block_m, BN=block_n, MAX_PARTS=most, FUSED_ACC=fused_acc,
                       num_warps=num_warps, num_stages=num_stages)

    def __call__(self, q, k, v, out):
        scale_log2 = float(D**-0.5 * math.log2(math.e))
        _split_kv_kernel[(self.tiles.shape[0], HQ)](
            q, k, v, out, self.tiles, self.part_ml, self.part_acc, self.counters, scale_log2,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
            **self.kw)
        return out


# (label, max key blocks a part walks (0: no split), fused accumulate, stages)
VARIANTS = [("nosplit_s3", 0, False, 3), ("nosplit_fused_s3", 0, True, 3), ("nosplit_fused_s2", 0, True, 2),
            ("split3_s3", 3, False, 3), ("split3_fused_s2", 3, True, 2), ("split2_s2", 2, False, 2),
            ("split2_fused_s2", 2, True, 2), ("split1_fused_s2", 1, True, 2)]


def sweep(layouts: dict[str, list[int]] = LAYOUTS) -> dict:
    from server.engine.kernels.attention import triton_backend as ta
    torch.manual_seed(0)
    dev, dtype, scale = torch.device("cuda"), torch.bfloat16, D**-0.5
    result = {}
    for name, docs in layouts.items():
        qkv = torch.randn(sum(docs), HQ + 2 * HKV, D, device=dev, dtype=dtype)
        q, k, v = qkv[:, :HQ].contiguous(), qkv[:, HQ:HQ + HKV].contiguous(), qkv[:, HQ + HKV:]
        o = torch.empty_like(q)
        tiles = ta._to_device(ta.tile_table(docs), dev)
        ref = ta.attend(tiles, q, k, v, scale, tma=False)
        row: dict = {"rows": sum(docs), "docs": len(docs),
                     "engine_us": per_call_us(lambda: ta.attend(tiles, q, k, v, scale, o, tma=False))}
        for label, max_blocks, fused, stages in VARIANTS:
            attn = SplitAttention(docs, dev, max_blocks, fused_acc=fused, num_stages=stages)
            diffs = []
            for _ in range(3):  # repeated calls: the counters must be back at 0 each time
                got = attn(q, k, v, torch.full_like(q, float("nan")))
                diffs.append(float((got.float() - ref.float()).abs().max()))
            row[label] = {"us": per_call_us(lambda attn=attn: attn(q, k, v, o)), "programs": attn.tiles.shape[0] * HQ,
                          "max_abs_vs_engine": round(max(diffs), 5)}
        after = attn(q, k, v, torch.full_like(q, float("nan")))  # after the graph replays too
        row["last_after_replays_max_abs_vs_engine"] = round(float((after.float() - ref.float()).abs().max()), 5)
        result[name] = row
        print(name, json.dumps(row), flush=True)
    meta = {"command": "python -m bench.split_kv_sweep", "gpu": torch.cuda.get_device_name()}
    return {"meta": meta, "layouts": result}


def main(argv=None) -> int:
    p = cuda_sweep_parser("bench.split_kv_sweep", __doc__)
    p.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma-separated, of {', '.join(LAYOUTS)}")
    args = p.parse_args(argv)
    layouts = {name: LAYOUTS[name] for name in args.layouts.split(",")}
    return run_cuda_sweep(p.prog, lambda: sweep(layouts), args.out)


if __name__ == "__main__":
    raise SystemExit(main())
