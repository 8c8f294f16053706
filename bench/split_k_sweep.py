"""Split-K narrow projections with the reduction in the norm, against cuBLAS + FlashInfer (CUDA).

`python -m bench.split_k_sweep --out sweep.json`: at the packed row counts of small and
middling steps, a layer's O and down projection each followed by its residual add + RMSNorm,
28 calls on 28 weight copies replayed from one CUDA graph (`bench.sweeps.per_layer_us`):
cuBLAS's GEMM then FlashInfer's `fused_add_rmsnorm` (the engine's path) against
`server.engine.kernels.split_k` at every split of the inner dimension (a strided-batched GEMM with
float32 partials, summed by the norm). Also each half alone, the wide projections (QKV,
gate-up) split for comparison, and the largest difference of the split path's outputs from the
engine's. The summary gives the best split per row count and what it saves a step (both
projections, 28 layers).

`python -m bench.split_k_sweep --norm-shapes --out shapes.json`: only the norm, at the
engine's split of each small step's row count, by program shape (rows a program, warps):
microseconds a call from a CUDA graph of 28 calls, and whether its output equals the
default shape's bit for bit.
"""

from __future__ import annotations

import json

import torch

from bench.sweeps import LAYERS, cuda_sweep_parser, per_layer_us, run_cuda_sweep, variant_timings

HIDDEN, EPS = 1024, 1e-6
NARROW = {"o": 2048, "down": 3072}  # inner dimension; 1024 output columns
WIDE = {"qkv": 4096, "gate_up": 6144}  # output columns; inner dimension 1024
ROWS = (128, 160, 272, 544, 1088, 1605, 2144, 3216)
SPLITS = (2, 3, 4, 6, 8)


def _narrow(rows: int, k: int, fi_add_norm) -> dict:
    from server.engine.kernels.split_k import split_add_rmsnorm, split_linear

    dev, dtype = torch.device("cuda"), torch.bfloat16
    weights = [torch.randn(HIDDEN, k, device=dev, dtype=dtype) * k**-0.5 for _ in range(LAYERS)]
    x = torch.randn(rows, k, device=dev, dtype=dtype)
    residual = torch.randn(rows, HIDDEN, device=dev, dtype=dtype)
    ln = (1 + 0.1 * torch.randn(HIDDEN, device=dev)).to(dtype)
    h = torch.empty(rows, HIDDEN, device=dev, dtype=dtype)
    res = residual.clone()

    def engine(i):
        torch.matmul(x, weights[i].t(), out=h)
        fi_add_norm(h, res, ln, EPS)

    row = {"cublas_us": per_layer_us(lambda i: torch.matmul(x, weights[i].t(), out=h)),
           "engine_pair_us": per_layer_us(engine)}
    want_res = residual.clone()
    want = torch.matmul(x, weights[0].t())
    fi_add_norm(want, want_res, ln, EPS)
    for s in SPLITS:
        if k % s:
            continue
        parts = split_linear(x, weights[0], s)
        got_res = residual.clone()
        got = split_add_rmsnorm(parts, got_res, ln, EPS)
        row[f"split{s}"] = {
            "gemm_us": per_layer_us(lambda i, s=s: split_linear(x, weights[i], s)),
            "norm_us": per_layer_us(lambda i, p=parts: split_add_rmsnorm(p, res, ln, EPS, out=h)),
            "pair_us": per_layer_us(lambda i, s=s: split_add_rmsnorm(split_linear(x, weights[i], s), res, ln, EPS,
                                                                     out=h)),
            "max_abs_normed": float((got.float() - want.float()).abs().max()),
            "max_abs_residual": float((got_res.float() - want_res.float()).abs().max()),
        }
    row["fi_norm_us"] = per_layer_us(lambda i: fi_add_norm(h, res, ln, EPS))
    splits = [key for key in row if key.startswith("split")]
    best = min(splits, key=lambda key: row[key]["pair_us"])
    row["best"] = {"splits": int(best[5:]), "pair_us": row[best]["pair_us"],
                   "saving_us": round(row["engine_pair_us"] - row[best]["pair_us"], 2)}
    return row


def _wide(rows: int, n: int) -> dict:
    from server.engine.kernels.split_k import split_linear

    dev, dtype = torch.device("cuda"), torch.bfloat16
    weights = [torch.randn(n, HIDDEN, device=dev, dtype=dtype) * HIDDEN**-0.5 for _ in range(LAYERS)]
    x = torch.randn(rows, HIDDEN, device=dev, dtype=dtype)
    out = torch.empty(rows, n, device=dev, dtype=dtype)
    row = {"cublas_us": per_layer_us(lambda i: torch.matmul(x, weights[i].t(), out=out))}
    for s in (2, 4):
        row[f"split{s}_gemm_us"] = per_layer_us(lambda i, s=s: split_linear(x, weights[i], s))
    return row


def sweep() -> dict:
    from server.engine.kernels.layer_ops import FlashInferOps

    torch.manual_seed(0)
    fi = FlashInferOps()
    result: dict = {"narrow": {}, "wide": {}}
    for name, k in NARROW.items():
        for rows in ROWS:
            result["narrow"][f"{name}_{rows}"] = row = _narrow(rows, k, fi.fused_add_rmsnorm)
            print(name, rows, json.dumps(row), flush=True)
    for name, n in WIDE.items():
        for rows in ROWS[:5]:
            result["wide"][f"{name}_{rows}"] = row = _wide(rows, n)
            print(name, rows, json.dumps(row), flush=True)
    narrow = result["narrow"]
    result["summary"] = {
        "saving_us_per_step": {rows: round(LAYERS * sum(max(0.0, narrow[f"{name}_{rows}"]["best"]["saving_us"])
                                                         for name in NARROW), 1) for rows in ROWS},
        "best_splits": {key: row["best"]["splits"] for key, row in narrow.items()},
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
    }
    return result


NORM_ROWS = (135, 160, 272, 544, 800, 1024)
NORM_SHAPES = ((1, 1), (1, 2), (1, 4), (1, 8), (2, 2), (2, 4), (2, 8), (4, 4), (4, 8), (8, 8))


def norm_shapes() -> dict:
    from server.engine.kernels.split_k import norm_shape, split_add_rmsnorm, splits_for

    dev, dtype = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    result: dict = {"rows": {}}
    for rows in NORM_ROWS:
        splits = splits_for(rows, tuple(NARROW.values()))
        parts = torch.randn(splits, rows, HIDDEN, device=dev) / splits
        residual = torch.randn(rows, HIDDEN, device=dev, dtype=dtype)
        ln = (1 + 0.1 * torch.randn(HIDDEN, device=dev)).to(dtype)
        base = split_add_rmsnorm(parts, residual.clone(), ln, EPS)
        res, out = residual.clone(), torch.empty_like(residual)
        row = {"splits": splits, "default": "{}x_w{}".format(*norm_shape(rows))}
        row.update(variant_timings(
            {f"{per_program}x_w{warps}": (per_program, warps) for per_program, warps in NORM_SHAPES},
            lambda shape, parts=parts, res=res, ln=ln, out=out: split_add_rmsnorm(parts, res, ln, EPS, out=out,
                                                                                  shape=shape),
            lambda shape, parts=parts, residual=residual, ln=ln, base=base: torch.equal(
                split_add_rmsnorm(parts, residual.clone(), ln, EPS, shape=shape), base)))
        result["rows"][str(rows)] = row
        print(rows, json.dumps(row), flush=True)
    result["gpu"] = torch.cuda.get_device_name()
    return result


def main(argv=None) -> int:
    p = cuda_sweep_parser("bench.split_k_sweep", __doc__)
    p.add_argument("--norm-shapes", action="store_true", help="sweep only the norm's program shapes")
    args = p.parse_args(argv)
    return run_cuda_sweep(p.prog, norm_shapes if args.norm_shapes else sweep, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
