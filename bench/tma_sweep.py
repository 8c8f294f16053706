"""The TMA-loaded fused GEMMs against cuBLAS plus the separate kernel, call by call (CUDA).

`python -m bench.tma_sweep --out sweep.json`: at packed-row counts from a lone line (544) to
the 256 mix's ~34k, the full-size model's projections as `bench/tma_gemm.py` does them, at
several tile shapes, against cuBLAS (`F.linear`) and cuBLAS followed by the separate kernel
(the q/k norm + RoPE pass, the SiLU gate): microseconds a call (28 calls replayed from a CUDA
graph) and the relative difference from the unfused path.
"""

from __future__ import annotations

import json
from functools import partial

import torch.nn.functional as F

from bench.epilogue_sweep import EPS, HKV, HQ, THETA, Projections, fastest, time_case
from bench.gemm_epilogues import TileConfig as Tile
from bench.sweeps import cuda_sweep_parser, per_call_us, run_cuda_sweep

ROWS = (544, 1605, 4296, 8592, 17000, 34256)


def _tiles_gate_up():
    return [Tile(128, 64, 64, 4, 3), Tile(128, 64, 64, 4, 3, 4), Tile(128, 64, 64, 4, 3, 16),
            Tile(128, 128, 64, 8, 3), Tile(128, 128, 64, 8, 3, 4), Tile(128, 128, 64, 8, 3, 16),
            Tile(128, 128, 64, 8, 4), Tile(64, 128, 64, 4, 4)]


def _tiles_qkv():
    """(tile, heads a program): 0 is the two-halves kernel, one head a program."""
    return [(Tile(64, 64, 64, 4, 4), 0), (Tile(128, 256, 64, 8, 3), 2), (Tile(128, 256, 64, 8, 4), 2),
            (Tile(128, 256, 64, 8, 3, 4), 2), (Tile(64, 256, 64, 4, 3), 2), (Tile(64, 256, 64, 4, 4), 2),
            (Tile(128, 128, 64, 8, 3), 1), (Tile(128, 128, 64, 4, 3), 1), (Tile(64, 128, 64, 4, 4), 1)]


def _tiles_linear():
    return [Tile(128, 128, 64, 8, 3), Tile(128, 256, 64, 8, 3)]


def _persistent():
    return [(Tile(128, 128, 64, 8, 3), False, True), (Tile(128, 128, 64, 8, 4), False, True),
            (Tile(128, 128, 64, 8, 3, 4), False, True), (Tile(128, 64, 64, 4, 3), False, True)]


def sweep(rows_list=ROWS, out_path: str | None = None) -> dict:
    from bench import tma_gemm as tg

    p = Projections.make()
    w_qkv, w_gu, norms = p.w_qkv, p.w_gu, p.norms
    result = {"silu_and_mul": p.silu_lib, "rows": {}}
    for rows in rows_list:
        x, pos = p.inputs(rows)
        unfused_qkv, unfused_gate_up = partial(p.unfused_qkv, x, pos), partial(p.unfused_gate_up, x)
        ref_qkv, ref_gu = unfused_qkv(), unfused_gate_up()
        row: dict = {
            "cublas_qkv_us": per_call_us(lambda: F.linear(x, w_qkv)),
            "cublas_gate_up_us": per_call_us(lambda: F.linear(x, w_gu)),
            "qkv_unfused_us": per_call_us(unfused_qkv), "gate_up_unfused_us": per_call_us(unfused_gate_up),
            "linear_qkv": {}, "linear_gate_up": {}, "gate_up": {}, "gate_up_persistent": {}, "qkv": {},
        }
        for tile in _tiles_linear():
            time_case(lambda: tg.linear(x, w_qkv, tile), F.linear(x, w_qkv), row["linear_qkv"], tile.name)
            time_case(lambda: tg.linear(x, w_gu, tile), F.linear(x, w_gu), row["linear_gate_up"], tile.name)
        for tile in _tiles_gate_up():
            time_case(lambda: tg.gate_up_silu(x, w_gu, tile), ref_gu, row["gate_up"], tile.name)
        for tile, flatten, ws in _persistent():
            time_case(lambda: tg.gate_up_silu_persistent(x, w_gu, tile, flatten=flatten, warp_specialize=ws), ref_gu,
                      row["gate_up_persistent"], f"{tile.name}{'f' if flatten else ''}{'ws' if ws else ''}")
        for tile, hp in _tiles_qkv():
            if hp:
                time_case(lambda: tg.qkv_heads(x, w_qkv, norms, pos, HQ, HKV, EPS, THETA, tile, hp), ref_qkv,
                          row["qkv"], f"{tile.name}h{hp}")
            else:
                time_case(lambda: tg.qkv_norm_rope(x, w_qkv, norms, pos, HQ, HKV, EPS, THETA, tile), ref_qkv,
                          row["qkv"], f"{tile.name}halves")
        for kind in ("linear_qkv", "linear_gate_up", "gate_up", "gate_up_persistent", "qkv"):
            best = fastest(row[kind])
            row[f"{kind}_best"] = best and {"tile": best[0], "us": best[1]}
        result["rows"][rows] = row
        print(rows, json.dumps({k: v for k, v in row.items() if not isinstance(v, dict) or k.endswith("best")}),
              flush=True)
        if out_path:  # what is measured survives a run cut short
            with open(out_path, "w") as f:
                json.dump(result, f, indent=1)
    return result


def main(argv=None) -> int:
    p = cuda_sweep_parser("bench.tma_sweep", __doc__)
    p.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated packed-row counts")
    args = p.parse_args(argv)
    return run_cuda_sweep(p.prog, lambda: sweep(tuple(int(r) for r in args.rows.split(",")), args.out), args.out)


if __name__ == "__main__":
    raise SystemExit(main())
