"""The sampler's CFG scoring kernel by block shape and warps a program, from CUDA graphs (CUDA).

`python -m bench.sampler_sweep --out sampler.json`: `server/engine/kernels/cfg_scores.py`'s kernel on
random bf16 logits of the full-size model's head (8 codebooks of 1025) at the conditional
target rows of a fast-start chunk (50), a lone 10 s line (250), eight lines (2000) and the 256
mix's step (16000), with each row as a head block and a tail (`split`: 1024 + 1 lanes) or as
one block of 2048 lanes (`whole`, the kernel's earlier shape), at each `num_warps`: microseconds
a call (28 calls in one graph), and whether its confidences and ids equal the default's bit for
bit.
"""

from __future__ import annotations

import json

import torch

from bench.sweeps import run_plain_sweep, variant_timings

CODEBOOKS, VOCAB, MASK_ID = 8, 1025, 1024
ROWS = (50, 250, 2000, 16000)
WARPS = (1, 2, 4, 8, 16)


def sweep() -> dict:
    from server.engine.kernels.cfg_scores import cfg_scores, warps_for

    torch.manual_seed(0)
    result: dict = {"default_warps": {str(rows): warps_for(rows * CODEBOOKS) for rows in ROWS}, "rows": {}}
    for rows in ROWS:
        logits = (torch.randn(2 * rows, CODEBOOKS, VOCAB, device="cuda") * 4).to(torch.bfloat16)
        scale = torch.full((rows,), 2.0, device="cuda")
        base = cfg_scores(logits, rows, scale, MASK_ID)

        def scores(shape, logits=logits, rows=rows, scale=scale):
            split, warps = shape
            return cfg_scores(logits, rows, scale, MASK_ID, num_warps=warps, split=split)

        variants = {f"{'split' if split else 'whole'}_w{warps}": (split, warps)
                    for split in (True, False) for warps in WARPS}
        row = variant_timings(variants, scores, lambda shape, base=base: all(map(torch.equal, scores(shape), base)))
        result["rows"][str(rows)] = row
        print(rows, json.dumps(row), flush=True)
    result["gpu"] = torch.cuda.get_device_name()
    return result


def main(argv=None) -> int:
    return run_plain_sweep("bench.sampler_sweep", __doc__, sweep, argv)


if __name__ == "__main__":
    raise SystemExit(main())
