"""Small steps split over concurrent CUDA-graph lanes, against one graph over the whole step.

`python -m bench.lanes --checkpoint ckpt-full --out lanes.json` (CUDA). A small step's
forward is a chain of ~265 short kernels whose time is their latency, not the GPU's
throughput; its documents are independent until the sampler. So one could split a step's
documents over two or four lanes (each its own CUDA graph, captured on its own stream, with
its own attention workspace) and replay them side by side, hoping that one lane's kernels
fill the SMs the other's leave idle. This measures that, per step shape (a fast-start
chunk, 1-8 lone lines, a mix): one graph over the step (the engine's path) against 2 and 4
lanes split at document boundaries, GPU time per step with the host a step ahead
(`pipelined_ms`) and with a wait after each (`synced_ms`), and the lanes' hidden states
against the single graph's. On an H200 the lanes lost at every shape
(`bench/results/2026-12-01-h200-lanes.json`): cuBLAS's and the attention kernels' grids
already spread over every SM, so two lanes' kernels mostly queue behind each other.
"""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import torch

from bench.forward import cuda_ms
from bench.sweeps import run_checkpoint_sweep

# (words of text, target frames, guidance) per request, as `bench.parity.random_items` takes them
CASES = {
    "fast_start_chunk": [(6, 50, 2.0)],
    "lone_10s": [(20, 250, 2.0)],
    "two_10s": [(20, 250, 2.0)] * 2,
    "three_10s": [(20, 250, 2.0)] * 3,
    "four_10s": [(20, 250, 2.0)] * 4,
    "eight_10s": [(20, 250, 2.0)] * 8,
    "mixed_six": [(20, 250, 2.0), (6, 50, 2.0), (12, 150, 2.0), (30, 375, 2.0), (20, 250, 2.0), (6, 75, 2.0)],
}


def split_documents(doc_lens: list[int], lanes: int) -> list[tuple[int, int]] | None:
    """Document ranges [a, b) of `lanes` consecutive non-empty groups, each boundary at the
    document edge nearest an even share of the tokens; None with fewer documents than lanes."""
    if len(doc_lens) < lanes:
        return None
    cum, total, bounds = list(itertools.accumulate(doc_lens)), sum(doc_lens), [0]
    for k in range(1, lanes):
        share = total * k / lanes
        edges = range(bounds[-1] + 1, len(doc_lens) - (lanes - k) + 1)  # documents before the edge
        bounds.append(min(edges, key=lambda j: abs(cum[j - 1] - share)))
    return list(itertools.pairwise([*bounds, len(doc_lens)]))


def sub_canvas(canvas, first_doc: int, end_doc: int) -> SimpleNamespace:
    """Documents [first_doc, end_doc) of a packed canvas, as the graph replay reads one (their
    positions already restart per document, so a slice is exactly their own step)."""
    starts = [0]
    for n in canvas.doc_lens:
        starts.append(starts[-1] + n)
    a, b = starts[first_doc], starts[end_doc]
    return SimpleNamespace(total_len=b - a, doc_lens=list(canvas.doc_lens[first_doc:end_doc]),
                           packed_ids=canvas.packed_ids[:, a:b], audio_mask=canvas.audio_mask[a:b],
                           position_ids=canvas.position_ids[a:b])


def step_ms(fn, iters: int = 60, pipelined: int = 40) -> dict:
    """GPU time of fn() on the current stream: the median with a wait after each call
    (`bench.forward.cuda_ms`), and the mean of `pipelined` calls queued back to back."""
    synced = cuda_ms(fn, warmup=5, iters=iters)["median"]
    main = torch.cuda.current_stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(main)
    for _ in range(pipelined):
        fn()
    end.record(main)
    end.synchronize()
    return {"synced_ms": synced, "pipelined_ms": round(start.elapsed_time(end) / pipelined, 4)}


def sweep(checkpoint: str) -> dict:
    from bench.metrics import Arch
    from bench.parity import random_items
    from server.checkpoint import load_omnivoice
    from server.engine.kernels.attention.flashinfer_backend import FlashInferAttention
    from server.engine.model.canvas import build_packed_canvas
    from server.engine.model.cuda_graphs import ForwardStats, StepGraphs, choose_bucket
    from server.engine.model.fused_backbone import FusedBackbone

    model = load_omnivoice(checkpoint, "cuda", "bfloat16")
    dev, arch = model.device, Arch.of(model)

    def attention():  # each lane its own FlashInfer workspace: lanes run at the same time
        return FlashInferAttention(dev, torch.bfloat16, arch.head_dim ** -0.5, arch.q_heads, arch.kv_heads,
                                   arch.head_dim)

    backbone = FusedBackbone(model, attention(), graphs=True)  # the engine's path
    lanes = [(StepGraphs(backbone._embed_and_layers, attention(), dev, backbone.num_codebooks, backbone.mask_id,
                         ForwardStats(), capture_stream=stream), stream)
             for stream in (torch.cuda.Stream(dev) for _ in range(4))]

    def run_lanes(parts):
        main = torch.cuda.current_stream()
        outs = []
        for (graphs, stream), part in zip(lanes, parts):
            stream.wait_stream(main)
            with torch.cuda.stream(stream):
                outs.append(graphs.replay(part, choose_bucket(part.total_len, len(part.doc_lens))))
        for _, stream in lanes[:len(parts)]:
            main.wait_stream(stream)
        return torch.cat(outs, 0)

    out = {}
    with torch.inference_mode():
        for name, specs in CASES.items():
            canvas = build_packed_canvas(random_items(model, specs, seed=0, device=dev), dev)
            row = {"tokens": canvas.total_len, "doc_lens": list(canvas.doc_lens),
                   "one_graph": step_ms(lambda: backbone.hidden_states(canvas))}
            single = backbone.hidden_states(canvas).float()
            for n in (2, 4):
                ranges = split_documents(list(canvas.doc_lens), n)
                if ranges is None:
                    continue
                parts = [sub_canvas(canvas, a, b) for a, b in ranges]
                lane_row = step_ms(lambda: run_lanes(parts))
                diff = (run_lanes(parts).float() - single).abs().max()
                lane_row.update(rows=[p.total_len for p in parts], max_abs_diff_vs_one_graph=float(diff))
                row[f"{n}_lanes"] = lane_row
            print(name, json.dumps(row), flush=True)
            out[name] = row
    ratios = {name: round(min(r[k]["pipelined_ms"] for k in ("2_lanes", "4_lanes") if k in r)
                          / r["one_graph"]["pipelined_ms"], 3)
              for name, r in out.items() if "2_lanes" in r}
    return {"summary": {"gpu": torch.cuda.get_device_name(dev),
                        "best_lanes_over_one_graph_pipelined": ratios},
            "steps": out}


def main(argv: list[str] | None = None) -> int:
    return run_checkpoint_sweep("bench.lanes", __doc__, sweep, argv)


if __name__ == "__main__":
    raise SystemExit(main())
