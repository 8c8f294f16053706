"""What a small-step attention call's time is made of: the cost of a program, of each key
block it walks, and of more programs than the GPU has SMs. (CUDA)

`python -m microbench.attention_grid_probe --out probe.json`. The engine's kernel (pointer loads,
64-row q tiles, 64-key blocks, 16 q / 8 kv heads of 128, bf16), one layer's call replayed 28
times from a CUDA graph, on `docs` documents of `64 * blocks` rows each: every program then
walks exactly `blocks` key blocks, and there are `16 * docs * blocks` programs. Holding the
programs under the GPU's SM count and varying the blocks gives a program's fixed cost and its
cost per block; holding the blocks and doubling the programs shows how much two programs
sharing an SM overlap. A lone 10 s line is 144 programs of 4-5 blocks on 132 SMs.
"""

from __future__ import annotations

import torch

from microbench.attention_sweep import HKV, HQ, LAYOUTS, D
from microbench.sweeps import per_call_us, run_plain_sweep

BLOCKS = (1, 2, 4, 5, 8)
DOCS = (1, 2, 4, 8, 16)
STAGES = (3, 2)  # the engine's pipeline depth for pointer loads, and one less (less shared memory)


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y on x."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - slope * mx, slope


def _key(stages: int, blocks: int, programs: int) -> str:
    return f"s{stages}_blocks{blocks}_programs{programs}"


def _time_layout(lens: list[int], dev: torch.device, stages: int | None = None):
    """One layer's call on documents of `lens` rows (random bf16 q/k/v as views of one QKV
    tensor, as the backbone passes them): its programs, and microseconds a call."""
    from server.engine.kernels.attention import triton_backend as ta
    qkv = torch.randn(sum(lens), HQ + 2 * HKV, D, device=dev, dtype=torch.bfloat16)
    q, k, v = qkv[:, :HQ], qkv[:, HQ:HQ + HKV], qkv[:, HQ + HKV:]
    out = torch.empty_like(q)
    tiles = ta.tile_table(lens).to(dev)
    us = per_call_us(lambda: ta.attend(tiles, q, k, v, D**-0.5, out, tma=False, num_stages=stages))
    return tiles.shape[0] * HQ, us


def sweep() -> dict:
    from server.engine.kernels.attention import triton_backend as ta
    torch.manual_seed(0)
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    calls: dict = {}
    for stages in STAGES:
        for blocks in BLOCKS:
            for docs in DOCS:
                programs, us = _time_layout([ta.BLOCK_N * blocks] * docs, dev, stages)
                calls[_key(stages, blocks, programs)] = us
                print(stages, blocks, programs, us, flush=True)
    programs, us = _time_layout(LAYOUTS["lone_537"], dev)  # for comparison: a lone line's step, the engine's stages
    summary: dict = {"sms": sms, "lone_537_programs": programs, "lone_537_us": us}
    for stages in STAGES:
        fixed, per_block = fit_line([(b, calls[_key(stages, b, HQ * d * b)]) for b in BLOCKS for d in DOCS
                                     if HQ * d * b <= sms])
        doubled = {b: [calls[_key(stages, b, 2 * HQ * d * b)] / calls[_key(stages, b, HQ * d * b)]
                       for d in DOCS if HQ * d * b <= sms and 2 * d in DOCS] for b in BLOCKS}
        summary[f"s{stages}"] = {"fixed_us": round(fixed, 2), "per_block_us": round(per_block, 3),
                                 "time_ratio_twice_the_programs_by_blocks": {
                                     str(b): round(sum(r) / len(r), 2) for b, r in doubled.items() if r}}
    meta = {"command": "python -m microbench.attention_grid_probe", "gpu": torch.cuda.get_device_name()}
    return {"summary": summary, "meta": meta, "calls_us": calls}


def main(argv=None) -> int:
    return run_plain_sweep("microbench.attention_grid_probe", __doc__, sweep, argv)


if __name__ == "__main__":
    raise SystemExit(main())
