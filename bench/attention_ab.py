"""Whole graphed forwards with the small-step attention loading by pointers or by TMA (CUDA).

`python -m bench.attention_ab --checkpoint DIR --out ab.json`: on the full-size checkpoint,
four step shapes (a fast-start chunk, a lone 10 s line, three and eight of them) replay their
CUDA graphs, median of 60 each, with the Triton attention (a) loading by pointers for steps of
up to 1024 rows (FlashInfer above) and (b) loading by TMA for steps of up to 4608 rows, twice
in turn; and the relative difference of (b)'s hidden states from (a)'s. The per-call sweep
(`bench.attention_sweep --tma`) times one kernel alone; this times it in the forward it serves.
"""

from __future__ import annotations

import json

import torch

from bench.forward import cuda_ms
from bench.sweeps import run_checkpoint_sweep

LINE = (20, 250, 2.0)  # (words, target frames, guidance): a 10 s line
LAYOUTS = {"fast_start": [(8, 50, 2.0)], "lone": [LINE], "three": [LINE] * 3, "eight": [LINE] * 8}
VARIANTS = (("pointers_1024", 1024, False), ("tma_4608", 4608, True),
            ("pointers_1024_again", 1024, False), ("tma_4608_again", 4608, True))


def forward_ms(backbone, canvas, reps: int = 60) -> float:
    """Median ms of the step's forward as the engine runs it (planning, copies, graph replay)."""
    return cuda_ms(lambda: backbone.hidden_states(canvas), warmup=5, iters=reps)["median"]


def run(checkpoint: str) -> dict:
    from bench.parity import random_items
    from server.checkpoint import load_omnivoice
    from server.engine.kernels.attention.flashinfer_backend import FlashInferAttention
    from server.engine.model.canvas import build_packed_canvas
    from server.engine.model.fused_backbone import FusedBackbone

    torch.set_grad_enabled(False)
    model = load_omnivoice(checkpoint, "cuda", "bfloat16")
    c = model.llm.config
    canvases = {name: build_packed_canvas(random_items(model, specs, 0, "cuda"), "cuda")
                for name, specs in LAYOUTS.items()}
    out: dict = {}
    hidden: dict = {}
    for label, small_rows, tma in VARIANTS:
        attn = FlashInferAttention(model.device, torch.bfloat16, c.head_dim ** -0.5, c.num_attention_heads,
                                   c.num_key_value_heads, c.head_dim, small_rows=small_rows)
        attn.small.tma = tma
        backbone = FusedBackbone(model, attn, graphs=True)
        backbone.capture([backbone.graphs.bucket_for(canvas) for canvas in canvases.values()])
        row = {}
        for name, canvas in canvases.items():
            hidden.setdefault(name, {})[label] = backbone.hidden_states(canvas).float().clone()
            row[name] = {"rows": canvas.total_len, "ms": forward_ms(backbone, canvas)}
        out[label] = row
        print(label, json.dumps(row), flush=True)
        del backbone, attn
        torch.cuda.empty_cache()
    out["hidden_rel_diff_tma_vs_pointers"] = {
        name: float((h["tma_4608"] - h["pointers_1024"]).norm() / h["pointers_1024"].norm())
        for name, h in hidden.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    return run_checkpoint_sweep("bench.attention_ab", __doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
