"""The fused GEMM epilogues against cuBLAS plus the separate kernel, call by call (CUDA).

`python -m bench.epilogue_sweep --out sweep.json`: at packed-row counts from a fast-start
first chunk (135) to the 256 mix's ~34k, the full-size model's QKV projection followed by
the q/k norm + RoPE kernel, and its gate-up projection followed by FlashInfer's SiLU gate,
each against the one-kernel Triton GEMM of `bench/gemm_epilogues.py` at several tile shapes;
microseconds a call (28 calls replayed from a CUDA graph) and the largest relative
difference from the unfused path. Its result is why the engine keeps cuBLAS and the
separate kernels (`bench/results/*-epilogue-sweep.json`).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from bench.sweeps import cuda_sweep_parser, per_call_us, run_cuda_sweep

HIDDEN, HQ, HKV, D, INTER = 1024, 16, 8, 128, 3072
EPS, THETA = 1e-6, 1e6
ROWS = (135, 544, 1088, 1605, 2304, 4296, 8592, 17000, 34256)
QKV_SHAPES = [(bm, 64, bk, w, s) for bm, bk, w, s in itertools.product((64, 128), (64, 128), (4, 8), (3, 4))]
GATE_UP_SHAPES = [(bm, bn, 64, w, s) for bm, bn, w, s in itertools.product((64, 128), (64, 128), (4, 8), (3, 4))]


def _silu_and_mul():
    try:
        from flashinfer.activation import silu_and_mul

        return silu_and_mul, "flashinfer"
    except Exception:  # noqa: BLE001
        from server.engine.kernels.layer_ops import TorchOps

        return TorchOps.silu_and_mul, "torch"


@dataclass
class Projections:
    """The full-size model's QKV and gate-up weights and q/k norms (random, bf16, on CUDA),
    and the SiLU gate the engine runs after the gate-up GEMM."""

    w_qkv: torch.Tensor
    w_gu: torch.Tensor
    norms: torch.Tensor
    silu_and_mul: Callable
    silu_lib: str

    @classmethod
    def make(cls) -> Projections:
        torch.manual_seed(0)
        dev, dtype = torch.device("cuda"), torch.bfloat16
        w_qkv = torch.randn((HQ + 2 * HKV) * D, HIDDEN, device=dev, dtype=dtype) * HIDDEN**-0.5
        w_gu = torch.randn(2 * INTER, HIDDEN, device=dev, dtype=dtype) * HIDDEN**-0.5
        norms = (1 + 0.1 * torch.randn(2, D, device=dev)).to(dtype)
        return cls(w_qkv, w_gu, norms, *_silu_and_mul())

    def inputs(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Random normed rows and their positions, as a step of `rows` packed rows has."""
        return (torch.randn(rows, HIDDEN, device=self.w_qkv.device, dtype=self.w_qkv.dtype),
                torch.randint(0, 2048, (rows,), device=self.w_qkv.device))

    def unfused_qkv(self, x: torch.Tensor, pos: torch.Tensor):
        """What the engine runs: cuBLAS, then the q/k norm + RoPE kernel -> q, k, v."""
        from server.engine.kernels.qk_norm_rope import qk_norm_rope

        qkv = F.linear(x, self.w_qkv).view(x.shape[0], HQ + 2 * HKV, D)
        q, k = qk_norm_rope(qkv, self.norms, pos, HQ, HKV, EPS, THETA)
        return q, k, qkv[:, HQ + HKV:]

    def unfused_gate_up(self, x: torch.Tensor):
        """What the engine runs: cuBLAS, then the SiLU gate."""
        return self.silu_and_mul(F.linear(x, self.w_gu))


def time_case(fn, want, into: dict, name: str) -> None:
    """`into[name]`: microseconds a call of `fn` and the largest relative difference of its
    output(s) from `want`, or the error that kept it from running (a tile the card cannot
    hold, a Triton refusal)."""
    from bench.gemm_epilogues import relative_error

    try:
        got = fn()
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        error = max(relative_error(g, w) for g, w in zip(got, want))
        into[name] = {"us": per_call_us(fn), "rel_vs_unfused": round(error, 6)}
    except Exception as exc:  # noqa: BLE001 - recorded, the sweep goes on
        into[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def fastest(cases: dict) -> tuple[str, float] | None:
    """(name, microseconds) of the fastest case that ran, None when none did."""
    timed = {k: v["us"] for k, v in cases.items() if "us" in v}
    if not timed:
        return None
    best = min(timed, key=timed.get)
    return best, timed[best]


def sweep(rows_list=ROWS) -> dict:
    from bench import gemm_epilogues as ge

    p = Projections.make()
    w_qkv, w_gu, norms = p.w_qkv, p.w_gu, p.norms
    out = {"silu_and_mul": p.silu_lib, "rows": {}}
    for rows in rows_list:
        x, pos = p.inputs(rows)
        unfused_qkv, unfused_gate_up = partial(p.unfused_qkv, x, pos), partial(p.unfused_gate_up, x)
        ref_qkv, ref_gu = unfused_qkv(), unfused_gate_up()
        row: dict = {"qkv_unfused_us": per_call_us(unfused_qkv), "gate_up_unfused_us": per_call_us(unfused_gate_up),
                     "qkv": {}, "gate_up": {}}
        for shape in QKV_SHAPES:
            cfg = ge.TileConfig(*shape)
            time_case(lambda: ge.qkv_norm_rope(x, w_qkv, norms, pos, HQ, HKV, EPS, THETA, cfg), ref_qkv, row["qkv"],
                      "x".join(map(str, shape)))
        for shape in GATE_UP_SHAPES:
            cfg = ge.TileConfig(*shape)
            time_case(lambda: ge.gate_up_silu(x, w_gu, cfg), ref_gu, row["gate_up"], "x".join(map(str, shape)))
        for kind in ("qkv", "gate_up"):
            if best := fastest(row[kind]):
                row[f"{kind}_best"] = {"shape": best[0], "us": best[1],
                                       "saving_us": round(row[f"{kind}_unfused_us"] - best[1], 2)}
        for kind, w in (("qkv", w_qkv), ("gate_up", w_gu)):  # the GEMM's rate at the best fused time
            if best := row.get(f"{kind}_best"):
                best["tflops"] = round(2 * rows * HIDDEN * w.shape[0] / best["us"] / 1e6, 1)
        out["rows"][rows] = row
        print(rows, json.dumps({k: v for k, v in row.items() if k not in ("qkv", "gate_up")}), flush=True)
    return out


def main(argv=None) -> int:
    p = cuda_sweep_parser("bench.epilogue_sweep", __doc__)
    p.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated packed-row counts")
    args = p.parse_args(argv)

    def run() -> dict:
        result = sweep(tuple(int(r) for r in args.rows.split(",")))
        result["hidden"], result["inter"], result["log2_theta"] = HIDDEN, INTER, math.log2(THETA)
        return result

    return run_cuda_sweep(p.prog, run, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
