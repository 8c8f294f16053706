"""The small-step attention that normalises q/k as it loads them, against the two kernels it
replaces (the q/k norm + RoPE pass, then attention), call by call (CUDA).

`python -m bench.normed_attention_sweep --out sweep.json`: for the packed layouts a small
step has (a fast-start first chunk of 135 rows to ~1k rows, the Triton attention's limit),
one layer's work (16 q / 8 kv heads of 128, bf16) replayed 28 times from a CUDA graph: the
two-pass path (and each of its kernels alone) against `attend_normed` at several program
shapes; microseconds a call and the largest difference from the two-pass output
(`bench/normed_attention.py` says what it found).
"""

from __future__ import annotations

import json

import torch

from bench.sweeps import per_call_us, run_plain_sweep

LAYOUTS = {
    "fast_start_135": [85, 50],
    "fast_start_bucket_144": [85, 50, 1, 1, 7],
    "two_fast_starts_270": [85, 50, 85, 50],
    "lone_537": [287, 250],
    "lone_bucket_544": [287, 250, 1, 1, 5],
    "lone_and_fast_start_672": [287, 250, 85, 50],
    "mixed_974": [287, 250, 287, 150],
}
# (q heads per program, block_m, block_n, warps, stages)
CONFIGS = [(1, 64, 64, 4, 3), (1, 64, 64, 4, 2), (1, 32, 64, 4, 2), (2, 64, 64, 8, 2), (2, 64, 64, 8, 3),
           (2, 64, 64, 4, 2), (2, 32, 64, 4, 2), (2, 32, 64, 4, 3), (2, 64, 32, 8, 2), (2, 32, 32, 4, 2),
           (2, 16, 64, 4, 2)]
HQ, HKV, D, EPS, THETA = 16, 8, 128, 1e-6, 1e6


def sweep() -> dict:
    from bench import normed_attention as na
    from server.engine.kernels import qk_norm_rope as qr
    from server.engine.kernels.attention import triton_backend as ta
    torch.manual_seed(0)
    dev, dtype, scale = torch.device("cuda"), torch.bfloat16, D**-0.5
    norms = (1 + 0.1 * torch.randn(2, D)).to(dev, dtype)
    out = {}
    for name, docs in LAYOUTS.items():
        seq = sum(docs)
        qkv = (torch.randn(seq, HQ + 2 * HKV, D) * 3).to(dev, dtype)
        pos = torch.cat([torch.arange(n) for n in docs]).to(dev)
        q, k = qr.qk_norm_rope(qkv, norms, pos, HQ, HKV, EPS, THETA)
        v = qkv[:, HQ + HKV:]
        o = torch.empty(seq, HQ, D, device=dev, dtype=dtype)
        tiles = ta._to_device(ta.tile_table(docs), dev)
        ref = ta.attend(tiles, q, k, v, scale)

        def qk_pass():
            return qr.qk_norm_rope(qkv, norms, pos, HQ, HKV, EPS, THETA, q, k)

        def two_pass():
            ta.attend(tiles, *qk_pass(), v, scale, o)

        row: dict = {"rows": seq, "docs": len(docs), "two_pass_us": per_call_us(two_pass),
                     "qk_norm_rope_us": per_call_us(qk_pass),
                     "attention_us": per_call_us(lambda: ta.attend(tiles, q, k, v, scale, o))}
        for heads, bm, bn, warps, stages in CONFIGS:
            t = ta._to_device(ta.tile_table(docs, bm), dev)
            kw = dict(block_m=bm, block_n=bn, heads=heads, num_warps=warps, num_stages=stages)

            def normed(dst=None):
                return na.attend_normed(t, qkv, norms, pos, HQ, HKV, EPS, THETA, scale, dst, **kw)

            try:
                got = normed()
                row[f"normed_h{heads}_{bm}_{bn}_w{warps}_s{stages}"] = {
                    "us": per_call_us(lambda: normed(o)),
                    "max_abs_vs_two_pass": round(float((got.float() - ref.float()).abs().max()), 5)}
            except Exception as exc:  # noqa: BLE001 - a shape that does not compile is a result too
                row[f"normed_h{heads}_{bm}_{bn}_w{warps}_s{stages}"] = {"error": str(exc)[:200]}
        best = min((v["us"], k) for k, v in row.items() if isinstance(v, dict) and "us" in v)
        row["best"] = {"config": best[1], "us": best[0], "saving_us": round(row["two_pass_us"] - best[0], 2)}
        out[name] = row
        print(name, json.dumps(row), flush=True)
    return {"layouts": out, "gpu": torch.cuda.get_device_name(), "summary": {
        name: {"two_pass_us": r["two_pass_us"], **r["best"]} for name, r in out.items()}}


def main(argv=None) -> int:
    return run_plain_sweep("bench.normed_attention_sweep", __doc__, sweep, argv)


if __name__ == "__main__":
    raise SystemExit(main())
