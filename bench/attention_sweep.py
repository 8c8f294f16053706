"""The small-step Triton attention against FlashInfer's Hopper kernel, call by call (CUDA).

`python -m bench.attention_sweep --out sweep.json`: for packed layouts from a fast-start
first chunk (135 rows) to sixteen 10 s requests (8.6k rows), one layer's attention call
(16 q / 8 kv heads of 128, bf16) replayed 28 times from a CUDA graph, FlashInfer against
the Triton kernel at several tile shapes; microseconds a call and the largest difference
from FlashInfer's output. It is how `triton_attention.BLOCK_*` and
`flashinfer_attention.SMALL_ROWS` were chosen.
"""

from __future__ import annotations

import json

import torch

from bench.sweeps import cuda_sweep_parser, per_call_us, run_cuda_sweep

LAYOUTS = {
    "fast_start_135": [85, 50],
    "lone_537": [287, 250],
    "lone_bucket_544": [287, 250, 1, 1, 5],
    "three_1611": [287, 250] * 3,
    "eight_4296": [287, 250] * 8,
    "sixteen_8592": [287, 250] * 16,
    "mix_8k_long_docs": [650, 560] * 7,
}
# (block_m, block_n, warps, stages)
CONFIGS = [(64, 64, 4, 2), (64, 64, 4, 3), (32, 64, 4, 2), (64, 32, 4, 2), (128, 64, 8, 2), (64, 128, 4, 2),
           (128, 32, 4, 2), (32, 32, 2, 2), (64, 64, 8, 2)]
HQ, HKV, D = 16, 8, 128


def sweep() -> dict:
    from server.engine import triton_attention as ta
    from server.engine.flashinfer_attention import FlashInferAttention

    torch.manual_seed(0)
    dev, dtype, scale = torch.device("cuda"), torch.bfloat16, D**-0.5
    fi = FlashInferAttention(dev, dtype, scale, HQ, HKV, D, small_rows=0)
    out = {}
    for name, docs in LAYOUTS.items():
        qkv = torch.randn(sum(docs), HQ + 2 * HKV, D, device=dev, dtype=dtype)
        q, k, v = qkv[:, :HQ].contiguous(), qkv[:, HQ:HQ + HKV].contiguous(), qkv[:, HQ + HKV:]
        o = torch.empty_like(q)
        plan = fi.plan(docs)
        ref = plan.run(q, k, v)
        row: dict = {"rows": sum(docs), "docs": len(docs),
                     "flashinfer_us": per_call_us(lambda: plan.run(q, k, v, out=o))}
        for bm, bn, warps, stages in CONFIGS:
            tiles = ta._to_device(ta.tile_table(docs, bm), dev)
            kw = dict(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)
            got = ta.attend(tiles, q, k, v, scale, **kw)
            row[f"triton_{bm}_{bn}_w{warps}_s{stages}"] = {
                "us": per_call_us(lambda: ta.attend(tiles, q, k, v, scale, o, **kw)),
                "max_abs_vs_fi": round(float((got.float() - ref.float()).abs().max()), 5)}
        out[name] = row
        print(name, json.dumps(row), flush=True)
    return out


def main(argv=None) -> int:
    p = cuda_sweep_parser("bench.attention_sweep", __doc__)
    args = p.parse_args(argv)
    return run_cuda_sweep(p.prog, sweep, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
