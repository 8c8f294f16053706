"""Graph token buckets, coarse against fine: what padding costs a step between 1k and 8k rows (CUDA).

`python -m bench.bucket_sweep --checkpoint DIR --out buckets.json`: on the full-size checkpoint,
steps of 1-15 ten-second lines and a seeded set of mixed steps replay their CUDA graphs (median
of 40 each, `hidden_states` as the engine calls it) under two grids of token buckets:

- `coarse`: 64 apart below 1024, 256 apart to 4096, 512 apart to 8192 (the engine's grid);
- `fine`: 64 apart below 1024, 128 apart to 4096, 256 apart to 8192.

A step pads to its bucket, and the padded rows are real work, so a grid's spacing is a step's
cost: on average half a spacing's rows. Finer grids mean more graphs to capture at start: on an
H200 the fine grid's 372 (104 more) made steps 1.2% faster on average, a gain the loaded p95
could not tell apart, so the engine keeps the coarse one.
Each grid is measured twice in turn; the summary gives each step's ratio fine / coarse, and each
grid's graphs, capture seconds and the GPU memory its graphs hold.
"""

from __future__ import annotations

import json
import random
import statistics

import torch

from bench.attention_ab import LINE, forward_ms
from bench.sweeps import run_checkpoint_sweep
from server.engine.model.cuda_graphs import GRAPH_TOKEN_BUCKETS

GRIDS = {
    "coarse": GRAPH_TOKEN_BUCKETS,
    "fine": tuple(range(128, 1024, 64)) + tuple(range(1024, 4096, 128)) + tuple(range(4096, 8193, 256)),
}
ORDER = ("coarse", "fine", "coarse", "fine")


def layouts(seed: int = 0, mixed: int = 12) -> dict[str, list[tuple[int, int, float]]]:
    """n ten-second lines for n = 1..15, and `mixed` steps of 2-12 requests of 2-16 s."""
    out = {f"lines_{n}": [LINE] * n for n in range(1, 16)}
    rng = random.Random(seed)
    for i in range(mixed):
        frames = [rng.randint(50, 400) for _ in range(rng.randint(2, 12))]
        out[f"mixed_{i}"] = [(max(2, f // 12), f, 2.0) for f in frames]
    return out


def run(checkpoint: str) -> dict:
    from bench.parity import random_items
    from server.checkpoint import load_omnivoice
    from server.engine.kernels.attention.flashinfer_backend import FlashInferAttention
    from server.engine.model.canvas import build_packed_canvas
    from server.engine.model.cuda_graphs import choose_bucket
    from server.engine.model.fused_backbone import FusedBackbone

    torch.set_grad_enabled(False)
    model = load_omnivoice(checkpoint, "cuda", "bfloat16")
    c = model.llm.config
    canvases = {name: build_packed_canvas(random_items(model, specs, 0, "cuda"), "cuda")
                for name, specs in layouts().items()}
    canvases = {name: cv for name, cv in canvases.items()  # the steps both grids can replay
                if all(choose_bucket(cv.total_len, len(cv.doc_lens), grid) for grid in GRIDS.values())}
    runs: dict[str, list[dict]] = {name: [] for name in GRIDS}
    grids: dict[str, list[dict]] = {name: [] for name in GRIDS}
    for label in ORDER:
        attn = FlashInferAttention(model.device, torch.bfloat16, c.head_dim ** -0.5, c.num_attention_heads,
                                   c.num_key_value_heads, c.head_dim)
        backbone = FusedBackbone(model, attn, graphs=True, token_buckets=GRIDS[label])
        torch.cuda.synchronize()
        reserved = torch.cuda.memory_reserved()
        graphs = backbone.capture()
        grids[label].append({"graphs": graphs, "capture_s": round(backbone.graphs.capture_seconds, 2),
                             "graph_mem_gib": round((torch.cuda.memory_reserved() - reserved) / 2**30, 3)})
        row = {}
        for name, canvas in canvases.items():
            bucket = backbone.graphs.bucket_for(canvas)
            row[name] = {"rows": canvas.total_len, "docs": len(canvas.doc_lens), "bucket": list(bucket),
                         "ms": forward_ms(backbone, canvas, reps=40)}
        runs[label].append(row)
        print(label, json.dumps(grids[label][-1]), json.dumps(row), flush=True)
        del backbone, attn
        torch.cuda.empty_cache()
    steps = {}
    for name, canvas in canvases.items():
        ms = {label: statistics.mean(r[name]["ms"] for r in runs[label]) for label in GRIDS}
        steps[name] = {"rows": canvas.total_len, "docs": len(canvas.doc_lens),
                       "bucket_coarse": runs["coarse"][0][name]["bucket"][0],
                       "bucket_fine": runs["fine"][0][name]["bucket"][0],
                       "ms_coarse": round(ms["coarse"], 4), "ms_fine": round(ms["fine"], 4),
                       "ratio_fine_vs_coarse": round(ms["fine"] / ms["coarse"], 4)}
    ratios = [s["ratio_fine_vs_coarse"] for s in steps.values()]
    return {"summary": {"mean_ratio_fine_vs_coarse": round(statistics.mean(ratios), 4),
                        "min_ratio": min(ratios), "max_ratio": max(ratios),
                        "grids": {label: grids[label][-1] for label in GRIDS}},
            "steps": steps, "runs": runs, "grids": grids}


def main(argv: list[str] | None = None) -> int:
    return run_checkpoint_sweep("bench.bucket_sweep", __doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
