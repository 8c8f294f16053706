"""Small steps with the next projections' weights prefetched into L2, against without.

`python -m bench.l2_prefetch_ab --checkpoint ckpt-full --out prefetch.json` (Hopper): three
fused backbones over one model, `CHORUS_L2_PREFETCH` off, `same` (the prefetch kernel on the
step's stream) and `side` (on a side stream joined at the end of the forward), prefetching at
every step size; GPU ms a forward (graphed up to 8192 rows, eager above), twice each, and
each forward's hidden states against the one without prefetching (bit for bit).
"""

from __future__ import annotations

import json
import os

import torch

from bench.lanes import step_ms
from bench.sweeps import cuda_sweep_parser, run_cuda_sweep

CASES = {"fast_start": [(6, 50, 2.0)], "lone": [(20, 250, 2.0)], "two": [(20, 250, 2.0)] * 2,
         "four": [(20, 250, 2.0)] * 4, "eight": [(20, 250, 2.0)] * 8, "sixteen_eager": [(20, 250, 2.0)] * 16,
         "sixtyfour_eager": [(20, 250, 2.0)] * 64}


def sweep(checkpoint: str) -> dict:
    from bench.metrics import Arch
    from bench.parity import random_items
    from server.checkpoint import load_omnivoice
    from server.engine.canvas import build_packed_canvas
    from server.engine.flashinfer_attention import FlashInferAttention
    from server.engine.fused_backbone import FusedBackbone

    model = load_omnivoice(checkpoint, "cuda", "bfloat16")
    dev, arch = model.device, Arch.of(model)
    backbones = {}
    for mode in ("off", "same", "side"):
        os.environ.update(CHORUS_L2_PREFETCH=mode, CHORUS_L2_PREFETCH_ROWS="40000")
        fi = FlashInferAttention(dev, torch.bfloat16, arch.head_dim ** -0.5, arch.q_heads, arch.kv_heads,
                                 arch.head_dim)
        backbones[mode] = FusedBackbone(model, fi, graphs=True)
    out = {}
    with torch.inference_mode():
        for name, specs in CASES.items():
            canvas = build_packed_canvas(random_items(model, specs, seed=0, device=dev), dev)
            row = {"tokens": canvas.total_len}
            ref = backbones["off"].hidden_states(canvas).clone()
            for _ in range(2):
                for mode, bb in backbones.items():
                    row.setdefault(mode, []).append(step_ms(lambda: bb.hidden_states(canvas), iters=30, pipelined=20))
            for mode, bb in backbones.items():
                row[f"{mode}_equal_to_off"] = bool(torch.equal(bb.hidden_states(canvas), ref))
            print(name, json.dumps(row), flush=True)
            out[name] = row
    return out


def main(argv=None) -> int:
    p = cuda_sweep_parser("bench.l2_prefetch_ab", __doc__)
    p.add_argument("--checkpoint", required=True, help="a checkpoint folder (`chorus make-checkpoint --size full`)")
    args = p.parse_args(argv)
    return run_cuda_sweep(p.prog, lambda: sweep(args.checkpoint), args.out)


if __name__ == "__main__":
    raise SystemExit(main())
