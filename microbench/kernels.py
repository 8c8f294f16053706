"""The step's kernels one by one, on the GPU: what a kernel change would buy.

Shapes are the full-size model's (Qwen3-0.6B body) at the packed-token counts a step sees:
a lone 10 s line (544, its graph bucket) up to the 256 mix's ~34k. For each it times

- the four projections (`F.linear`) under cuBLAS and under cuBLASLt, as TFLOP/s;
- the q/k norm + RoPE kernel (`server/engine/kernels/qk_norm_rope.py`) at several program shapes
  (`python -m microbench.qk_rope_sweep`'s, from CUDA graphs), each checked bit for bit against the
  default shape;
- FlashInfer's fused add + RMSNorm and SiLU gate, as achieved memory bandwidth.

    python -m microbench.kernels --out kernels.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.forward import cuda_ms
from microbench import qk_rope_sweep

HIDDEN, Q_HEADS, KV_HEADS, HEAD_DIM, INTER = 1024, 16, 8, 128, 3072
PROJECTIONS = {  # name: (out features, in features)
    "qkv": ((Q_HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN),
    "o": (HIDDEN, Q_HEADS * HEAD_DIM),
    "gate_up": (2 * INTER, HIDDEN),
    "down": (HIDDEN, INTER),
}
TOKENS = (544, 1152, 2304, 4608, 8576, 34256)


REPEAT = 20  # calls back to back per timing, so small shapes measure the kernel, not one launch


def _timed(fn, iters: int) -> float:
    """Median ms of one call, from `REPEAT` calls between two CUDA events."""
    return cuda_ms(lambda: [fn() for _ in range(REPEAT)], warmup=2, iters=iters)["median"] / REPEAT


def gemms(device, tokens: tuple[int, ...], iters: int) -> list[dict]:
    rows = []
    weights = {name: torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
               for name, (n, k) in PROJECTIONS.items()}
    for m in tokens:
        for name, (n, k) in PROJECTIONS.items():
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            row = {"tokens": m, "gemm": name, "n": n, "k": k}
            for lib in ("cublas", "cublaslt"):
                torch.backends.cuda.preferred_blas_library(lib)
                ms = _timed(lambda: F.linear(x, weights[name]), iters)
                row[f"{lib}_us"] = round(ms * 1000, 2)
                row[f"{lib}_tflops"] = round(2 * m * n * k / ms / 1e9, 1)
            torch.backends.cuda.preferred_blas_library("cublas")
            rows.append(row)
    return rows


def elementwise(device, tokens: tuple[int, ...], iters: int) -> list[dict]:
    from flashinfer.activation import silu_and_mul
    from flashinfer.norm import fused_add_rmsnorm

    rows = []
    for m in tokens:
        x = torch.randn(m, HIDDEN, device=device, dtype=torch.bfloat16)
        res = torch.randn(m, HIDDEN, device=device, dtype=torch.bfloat16)
        w = torch.ones(HIDDEN, device=device, dtype=torch.bfloat16)
        ms = _timed(lambda: fused_add_rmsnorm(x, res, w, 1e-6), iters)
        rows.append({"tokens": m, "kernel": "fused_add_rmsnorm", "us": round(ms * 1000, 2),
                     "gb_per_s": round(4 * m * HIDDEN * 2 / ms / 1e6, 1)})
        gu = torch.randn(m, 2 * INTER, device=device, dtype=torch.bfloat16)
        ms = _timed(lambda: silu_and_mul(gu), iters)
        rows.append({"tokens": m, "kernel": "silu_and_mul", "us": round(ms * 1000, 2),
                     "gb_per_s": round(3 * m * INTER * 2 / ms / 1e6, 1)})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m microbench.kernels", description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("microbench.kernels needs a CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    tokens = tuple(args.tokens)
    report = {
        "meta": {"command": "python -m microbench.kernels " + " ".join(argv or sys.argv[1:]),
                 "gpu": torch.cuda.get_device_name(device), "torch": torch.__version__},
        "gemm": gemms(device, tokens, args.iters),
        "qk_norm_rope": qk_rope_sweep.sweep(tokens)["rows"],
        "elementwise": elementwise(device, tokens, args.iters),
    }
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
