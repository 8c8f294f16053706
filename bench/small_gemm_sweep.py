"""The small-step Triton GEMM against cuBLAS, projection by projection, then in the forward.

`python -m bench.small_gemm_sweep --out sweep.json` (CUDA): for each of a layer's four
projections (OmniVoice's Qwen3 body, bf16) at the packed row counts of small steps (a
fast-start chunk's 160, a lone line's 544, two lines' 1088), 28 calls on 28 different
weight copies (as a forward's layers: the weights come from memory, not the L2 cache)
replayed from one CUDA graph, cuBLAS (`torch.matmul`) against `bench.small_gemm` at every
tile of `WIDE` or `NARROW`; microseconds a call and the relative (L2) difference from
cuBLAS. Then the table of winners (tiles at least `--min-gain` faster than cuBLAS) drives
the fused forward of the `--checkpoint`: graphed forward time with and without it,
alternated, and the target logits of each against the reference forward. On an H200 no
tile won anywhere (`bench/results/2026-12-01-h200-small-gemm-sweep.json`): the table was
empty and both forwards the same.
"""

from __future__ import annotations

import json
import statistics

import torch

from bench.sweeps import LAYERS, cuda_sweep_parser, per_layer_us, run_cuda_sweep

HIDDEN, Q_DIM, KV_DIM, INTER = 1024, 2048, 1024, 3072
SHAPES = {"qkv": (Q_DIM + 2 * KV_DIM, HIDDEN), "o": (HIDDEN, Q_DIM), "gate_up": (2 * INTER, HIDDEN),
          "down": (HIDDEN, INTER)}
ROWS = (160, 544, 1088)


WIDE = ((64, 64, 128, 1, 4, 3), (128, 64, 128, 1, 4, 3), (64, 128, 64, 1, 4, 4), (128, 128, 64, 1, 8, 4),
        (64, 64, 64, 2, 4, 4), (64, 32, 128, 1, 4, 3), (128, 32, 128, 1, 4, 3))
NARROW = ((64, 64, 128, 2, 4, 3), (64, 64, 128, 4, 4, 3), (64, 128, 64, 4, 4, 4), (128, 64, 128, 4, 4, 3),
          (64, 32, 128, 4, 4, 3), (64, 64, 64, 8, 4, 4), (128, 128, 64, 2, 8, 4))


def configs(n: int, k: int, rows: int) -> list:
    """The tiles tried: (bn, bm, bk, split_k, warps, stages); inner splits for the narrow
    projections (a few dozen column tiles), none or two for the wide ones."""
    from bench.small_gemm import GemmTile

    tiles = [GemmTile(*c) for c in (NARROW if n <= 2048 else WIDE)]
    return [t for t in tiles if t.bm <= 2 * rows and t.fits(n, k) and k // (t.split_k * t.bk) >= 2]


def sweep_gemms(min_gain: float) -> tuple[dict, dict]:
    from bench.small_gemm import small_linear

    torch.manual_seed(0)
    dev, dtype = torch.device("cuda"), torch.bfloat16
    counters = torch.zeros(1 << 16, dtype=torch.int32, device=dev)
    result, table = {}, {}
    for name, (n, k) in SHAPES.items():
        weights = [torch.randn(n, k, device=dev, dtype=dtype) / k**0.5 for _ in range(LAYERS)]
        entries = []
        for rows in ROWS:
            x = torch.randn(rows, k, device=dev, dtype=dtype)
            out = torch.empty(rows, n, device=dev, dtype=dtype)
            ref = torch.matmul(x, weights[0].t())
            row = {"cublas_us": per_layer_us(lambda i: torch.matmul(x, weights[i].t(), out=out)), "tiles": {}}
            best = None
            for tile in configs(n, k, rows):
                key = f"bn{tile.bn}_bm{tile.bm}_bk{tile.bk}_s{tile.split_k}_w{tile.warps}_st{tile.stages}"
                try:
                    got = small_linear(x, weights[0], tile, counters)
                    err = float((got.float() - ref.float()).norm() / ref.float().norm())
                    us = per_layer_us(lambda i, t=tile: small_linear(x, weights[i], t, counters, out))
                except Exception as exc:  # noqa: BLE001 - a tile the compiler refuses
                    row["tiles"][key] = {"error": str(exc)[:200]}
                    continue
                row["tiles"][key] = {"us": us, "rel_vs_cublas": round(err, 6)}
                if err < 1e-2 and (best is None or us < best[1]):
                    best = (tile, us, key)
            if best is not None:
                row["best"] = {"tile": best[2], "us": best[1], "speedup": round(row["cublas_us"] / best[1], 3)}
                if best[1] * (1 + min_gain) <= row["cublas_us"]:
                    entries.append((rows, best[0]))
            result[f"{name}_{rows}"] = row
            print(name, rows, json.dumps({"cublas_us": row["cublas_us"], "best": row.get("best")}), flush=True)
        # a bucket without a winner ends the table for that shape: bigger steps go to cuBLAS
        kept = []
        for rows in ROWS:
            hit = [t for r, t in entries if r == rows]
            if not hit:
                break
            kept.append((rows, hit[0]))
        if kept:
            table[(n, k)] = tuple(kept)
    return result, table


def forward_ab(table: dict, checkpoint: str) -> dict:
    """Graphed forward with and without the table, alternated; target logits against the
    reference forward."""
    from bench.forward import cuda_ms
    from bench.metrics import Arch
    from bench.parity import compare, random_items, reference_target_logits
    from bench.small_gemm import SmallGemm
    from server.checkpoint import load_omnivoice
    from server.engine.kernels.attention.flashinfer_backend import FlashInferAttention
    from server.engine.model.canvas import build_packed_canvas
    from server.engine.model.fused_backbone import FusedBackbone

    model = load_omnivoice(checkpoint, "cuda", "bfloat16")
    arch = Arch.of(model)
    fi = FlashInferAttention(model.device, torch.bfloat16, arch.head_dim ** -0.5, arch.q_heads, arch.kv_heads,
                             arch.head_dim)
    without = FusedBackbone(model, fi, graphs=True)  # graphs are captured at each bucket's first step
    with_tiles = FusedBackbone(model, fi, graphs=True)
    with_tiles.linear = SmallGemm(model.device, table)
    out = {}
    for label, specs in {"fast_start_50_frames": [(26, 50, 2.0)], "lone_10s": [(26, 250, 2.0)],
                         "two_10s": [(26, 250, 2.0)] * 2, "three_10s": [(26, 250, 2.0)] * 3}.items():
        canvas = build_packed_canvas(random_items(model, specs, seed=1, device=model.device), model.device)
        ref = reference_target_logits(model, canvas)
        row = {"tokens": canvas.total_len, "off_ms": [], "on_ms": []}
        for _ in range(3):
            row["off_ms"].append(cuda_ms(lambda: without(canvas), 3, 20)["median"])
            row["on_ms"].append(cuda_ms(lambda: with_tiles(canvas), 3, 20)["median"])
        row["off_vs_reference"] = compare(without(canvas), ref)
        row["on_vs_reference"] = compare(with_tiles(canvas), ref)
        row["off_median_ms"], row["on_median_ms"] = statistics.median(row["off_ms"]), statistics.median(row["on_ms"])
        out[label] = row
        print(label, json.dumps(row), flush=True)
    return out


def main(argv=None) -> int:
    p = cuda_sweep_parser("bench.small_gemm_sweep", __doc__)
    p.add_argument("--min-gain", type=float, default=0.03, help="keep a tile this much faster than cuBLAS")
    p.add_argument("--checkpoint", default=None, help="also time the forward of this checkpoint with the table")
    args = p.parse_args(argv)

    def run() -> dict:
        gemms, table = sweep_gemms(args.min_gain)
        result = {"gemms": gemms,
                  "table": {f"{n}x{k}": [[rows, vars(t)] for rows, t in entries] for (n, k), entries in table.items()}}
        print("table", json.dumps(result["table"]), flush=True)
        if args.checkpoint:
            result["forward"] = forward_ab(table, args.checkpoint)
        return result

    return run_cuda_sweep(p.prog, run, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
