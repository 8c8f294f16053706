"""cuBLAS's own choice against every cuBLASLt candidate, per projection and row count (CUDA).

`python -m microbench.gemm_algos --out algos.json`: for the full-size model's four projections at
row counts from a fast-start chunk's 128 to the graph limit's 8192 and two eager sizes,
`F.linear` and each algorithm cuBLASLt's heuristics list (`microbench/cublaslt.py`), one call per
layer's weight (28; 4 above 8192 rows) replayed from a CUDA graph so weights stream from
memory as in a step; microseconds a call, the fastest candidate's configuration and whether
it gives F.linear's bits, and what the fastest candidates would save per step (x 28 layers).
Its result is why the engine keeps `F.linear` (`microbench/results/*-gemm-algos.json`).
"""

from __future__ import annotations

import torch

from microbench.sweeps import cuda_sweep_parser, run_cuda_sweep

HIDDEN, HQ, HKV, D, INTER, LAYERS = 1024, 16, 8, 128, 3072, 28
PROJECTIONS = {"qkv": ((HQ + 2 * HKV) * D, HIDDEN), "o": (HIDDEN, HQ * D),
               "gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}
ROWS = (128, 192, 256, 320, 384, 448, 544, 576, 640, 768, 1024, 1280, 1536, 1792, 2048, 2560, 3072,
        3584, 4096, 5120, 6144, 8192, 17152, 34304)


def sweep(rows_list=ROWS) -> dict:
    from microbench.cublaslt import CublasLt, tune

    torch.manual_seed(0)
    dev, dtype = torch.device("cuda"), torch.bfloat16
    lt = CublasLt(dev)
    weights = {name: [torch.randn(n, k, device=dev, dtype=dtype) * k**-0.5 for _ in range(LAYERS)]
               for name, (n, k) in PROJECTIONS.items()}
    rows_out, per_step = [], {}
    for m in rows_list:
        saved = 0.0
        for name, ws in weights.items():
            r = tune(lt, ws if m <= 8192 else ws[:4], m)
            finite = [round(t, 2) for t in r.candidates_us if t != float("inf")]
            rows_out.append({"rows": m, "gemm": name, "n": r.n, "k": r.k, "cublas_us": round(r.default_us, 2),
                             "best_lt_us": round(r.best_us, 2), "best_index": r.best_index,
                             "speedup": round(r.speedup, 3), "config": r.config, "bitwise_equal": r.bitwise_equal,
                             "candidates": len(r.candidates_us), "candidates_us": finite})
            saved += max(0.0, r.default_us - r.best_us) * LAYERS
            print(f"{m:6d} {name:8s} cublas {r.default_us:8.2f} us  best {r.best_us:8.2f} us "
                  f"(#{r.best_index} of {len(r.candidates_us)}) x{r.speedup:.3f} "
                  f"{r.config} eq={r.bitwise_equal}", flush=True)
        per_step[m] = round(saved, 1)
    return {"meta": {"gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "library": lt.path,
                     "cublaslt_version": lt.version, "layers": LAYERS},
            "summary": {"saved_us_per_step": per_step}, "gemms": rows_out}


def main(argv: list[str] | None = None) -> int:
    p = cuda_sweep_parser("microbench.gemm_algos", __doc__)
    p.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    args = p.parse_args(argv)
    return run_cuda_sweep(p.prog, lambda: sweep(tuple(args.rows)), args.out)


if __name__ == "__main__":
    raise SystemExit(main())
