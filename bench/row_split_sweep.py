"""Are a small step's GEMMs bound by whole waves of tiles? Row counts around a lone line's, and
its rows split in two on two streams. (CUDA)

`python -m bench.row_split_sweep --out sweep.json`. A lone 10 s line's step packs 537 rows
(its graph bucket 544); cuBLAS runs the QKV projection on 128-row tiles, five of them down
the rows, the last a quarter full. If a projection's time went by whole waves of tiles over
the GPU's 132 SMs, 512 rows would take about half of 544's, and 544 rows split into 512 + 32
on two streams (branches of one CUDA graph) would fill the idle SMs of the first wave with the
remainder's tiles. Timed for each of a layer's four projections (OmniVoice's Qwen3 body, bf16,
as `torch.mm` into rows of one output), 28 calls on 28 weight copies (a forward's layers)
replayed from one CUDA graph, in microseconds a call; the narrow O and down projections also
as the engine's two-slice split-K (`split_k.split_linear`). `rows_equal_split_vs_full`: whether
cuBLAS gives the first 512 rows and the last 32 alone the same bits as all 544 at once.
"""

from __future__ import annotations

import json

import torch

from bench.small_gemm_sweep import SHAPES
from bench.sweeps import LAYERS, per_layer_us, run_plain_sweep

ROWS = (512, 528, 544, 576, 1088, 1152)
CUTS = ((544, 512), (544, 384), (544, 272), (1088, 1024), (1088, 768))  # (rows, first block's rows)


def sweep() -> dict:
    from server.engine.kernels.split_k import split_linear

    torch.manual_seed(0)
    dev, dtype = torch.device("cuda"), torch.bfloat16
    side = [torch.cuda.Stream() for _ in range(2)]
    result = {}
    for name, (n, k) in SHAPES.items():
        weights = [torch.randn(n, k, device=dev, dtype=dtype) * 0.02 for _ in range(LAYERS)]
        x = torch.randn(max(ROWS), k, device=dev, dtype=dtype)
        out = torch.empty(max(ROWS), n, device=dev, dtype=dtype)
        row: dict = {}
        for m in ROWS:
            row[f"mm_{m}"] = per_layer_us(lambda i, m=m: torch.mm(x[:m], weights[i].t(), out=out[:m]))
            if n <= 1024:  # the narrow projections: as the engine runs them at these rows
                row[f"split_k2_{m}"] = per_layer_us(lambda i, m=m: split_linear(x[:m], weights[i], 2))
        for m, cut in CUTS:
            def two_streams(i, m=m, cut=cut):
                here = torch.cuda.current_stream()
                for s in side:
                    s.wait_stream(here)
                for s, (lo, hi) in zip(side, ((0, cut), (cut, m)), strict=True):
                    with torch.cuda.stream(s):
                        torch.mm(x[lo:hi], weights[i].t(), out=out[lo:hi])
                for s in side:
                    here.wait_stream(s)

            def one_stream(i, m=m, cut=cut):
                for lo, hi in ((0, cut), (cut, m)):
                    torch.mm(x[lo:hi], weights[i].t(), out=out[lo:hi])

            row[f"two_streams_{m}_cut{cut}"] = per_layer_us(two_streams)
            row[f"one_stream_{m}_cut{cut}"] = per_layer_us(one_stream)
        whole = torch.mm(x[:544], weights[0].t())
        parts = torch.cat([torch.mm(x[:512], weights[0].t()), torch.mm(x[512:544], weights[0].t())])
        row["rows_equal_split_vs_full"] = bool(torch.equal(whole, parts))
        result[name] = row
        print(name, json.dumps(row), flush=True)
    meta = {"command": "python -m bench.row_split_sweep", "gpu": torch.cuda.get_device_name()}
    return {"meta": meta, "projections": result}


def main(argv=None) -> int:
    return run_plain_sweep("bench.row_split_sweep", __doc__, sweep, argv)


if __name__ == "__main__":
    raise SystemExit(main())
