"""The small-step Triton attention against FlashInfer's Hopper kernel, call by call (CUDA).

`python -m microbench.attention_sweep --out sweep.json`: for packed layouts from a fast-start
first chunk (135 rows) to sixty 10 s requests (32k rows, a full step of the 256 mix), one layer's attention call
(16 q / 8 kv heads of 128, bf16) replayed 28 times from a CUDA graph, FlashInfer against
the Triton kernel at several tile shapes; microseconds a call and the largest difference
from FlashInfer's output. It is how `triton_attention.BLOCK_*` and
`flashinfer_attention.SMALL_ROWS` were chosen. Each shape is timed with pointer loads
(`triton_*`), and with `--tma` also on tensor descriptors (`tma_*`, the engine's loads on
Hopper) at their own shapes; `--layouts` picks layouts.
"""

from __future__ import annotations

import json

import torch

from microbench.sweeps import cuda_sweep_parser, per_call_us, run_cuda_sweep

LAYOUTS = {
    "fast_start_135": [85, 50],
    "lone_537": [287, 250],
    "lone_bucket_544": [287, 250, 1, 1, 5],
    "three_1611": [287, 250] * 3,
    "eight_4296": [287, 250] * 8,
    "sixteen_8592": [287, 250] * 16,
    "mix_8k_long_docs": [650, 560] * 7,
    "thirty_16110": [287, 250] * 30,
    "sixty_32220": [287, 250] * 60,
}
# (block_m, block_n, warps, stages)
CONFIGS = [(64, 64, 4, 2), (64, 64, 4, 3), (32, 64, 4, 2), (64, 32, 4, 2), (128, 64, 8, 2), (64, 128, 4, 2),
           (128, 32, 4, 2), (32, 32, 2, 2), (64, 64, 8, 2)]
TMA_CONFIGS = [(64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 2), (64, 128, 8, 2), (128, 64, 8, 2),
               (128, 64, 8, 3), (128, 128, 8, 2)]
HQ, HKV, D = 16, 8, 128


def sweep(layouts: dict[str, list[int]] = LAYOUTS, configs=CONFIGS, tma_configs=()) -> dict:
    from server.engine.kernels.attention import triton_backend as ta
    from server.engine.kernels.attention.flashinfer_backend import FlashInferAttention

    torch.manual_seed(0)
    dev, dtype, scale = torch.device("cuda"), torch.bfloat16, D**-0.5
    fi = FlashInferAttention(dev, dtype, scale, HQ, HKV, D, small_rows=0)
    out = {}
    for name, docs in layouts.items():
        qkv = torch.randn(sum(docs), HQ + 2 * HKV, D, device=dev, dtype=dtype)
        q, k, v = qkv[:, :HQ].contiguous(), qkv[:, HQ:HQ + HKV].contiguous(), qkv[:, HQ + HKV:]
        o = torch.empty_like(q)
        plan = fi.plan(docs)
        ref = plan.run(q, k, v)
        row: dict = {"rows": sum(docs), "docs": len(docs),
                     "flashinfer_us": per_call_us(lambda: plan.run(q, k, v, out=o))}
        for prefix, tma, shapes in (("triton", False, configs), ("tma", True, tma_configs)):
            for bm, bn, warps, stages in shapes:
                tiles = ta.tile_table(docs, bm).to(dev)
                kw = dict(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages, tma=tma)
                got = ta.attend(tiles, q, k, v, scale, **kw)
                row[f"{prefix}_{bm}_{bn}_w{warps}_s{stages}"] = {
                    "us": per_call_us(lambda tiles=tiles, kw=kw: ta.attend(tiles, q, k, v, scale, o, **kw)),
                    "max_abs_vs_fi": round(float((got.float() - ref.float()).abs().max()), 5)}
        out[name] = row
        print(name, json.dumps(row), flush=True)
    return out


def main(argv=None) -> int:
    p = cuda_sweep_parser("microbench.attention_sweep", __doc__)
    p.add_argument("--tma", action="store_true", help="also the kernel on tensor descriptors")
    p.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma-separated, of {', '.join(LAYOUTS)}")
    args = p.parse_args(argv)
    layouts = {name: LAYOUTS[name] for name in args.layouts.split(",")}
    return run_cuda_sweep(p.prog, lambda: sweep(layouts, CONFIGS, TMA_CONFIGS if args.tma else ()), args.out)


if __name__ == "__main__":
    raise SystemExit(main())
