"""The small-step attention kernel against per-document SDPA, on the CPU through Triton's
interpreter (in a subprocess: the interpreter is chosen when Triton is imported), and its
tile tables."""

from __future__ import annotations

import textwrap

import pytest
import torch

pytest.importorskip("triton")

from server.engine import triton_attention as ta
from tests.triton_interpreter import run_in_triton_interpreter

SCRIPT = textwrap.dedent("""
    import torch
    from server.engine import triton_attention as ta
    from server.engine.attention import TorchAttention

    torch.manual_seed(0)
    hq, hkv, d = 4, 2, 32
    scale = d ** -0.5
    ref = TorchAttention(scale)
    attn = ta.TritonAttention("cpu", scale)
    # one row, documents shorter and longer than a tile, length-1 pad documents
    for docs in ([1], [5], [70, 3, 1, 64], [130, 1, 1]):
        seq = sum(docs)
        qkv = torch.randn(seq, hq + 2 * hkv, d) * 2
        q, k = qkv[:, :hq].contiguous(), qkv[:, hq:hq + hkv].contiguous()
        v = qkv[:, hq + hkv:]  # a strided view of the fused QKV output, as the backbone passes it
        want = ref.attend(ref.plan(docs), q, k, v)
        got = attn.attend(attn.plan(docs), q, k, v)
        assert float((got - want).abs().max()) < 1e-5, docs
        # a graph planner's static table: any layout of its documents and rows, re-planned
        planner = attn.graph_planner(len(docs), seq)
        for layout in (docs, [seq - len(docs) + 1] + [1] * (len(docs) - 1), docs):
            want = ref.attend(ref.plan(layout), q, k, v)
            out = torch.empty_like(q)
            attn.attend(planner.plan(layout), q, k, v, out)
            assert float((out - want).abs().max()) < 1e-5, layout
    assert ta.check("cpu", torch.float32, hq, hkv, d) < 1e-5
    print("ok")
""")


@pytest.mark.skipif(tuple(int(x) for x in __import__("triton").__version__.split(".")[:2]) < (3, 7),
                    reason="Triton 3.6's interpreter cannot take a loaded scalar as a loop bound")
def test_kernel_in_the_interpreter():
    run_in_triton_interpreter(SCRIPT)


def test_tile_table_covers_every_row_once():
    docs = [1, 64, 65, 200, 3]
    table = ta.tile_table(docs, block_m=64, tiles=ta.max_tiles(len(docs), sum(docs), 64))
    covered = torch.zeros(sum(docs), dtype=torch.int32)
    start = 0
    bounds = {}
    for n in docs:
        bounds.update({row: (start, start + n) for row in range(start, start + n)})
        start += n
    for q_start, doc_end, doc_start in table.tolist():
        if doc_end == 0:
            continue  # an empty tile
        rows = range(q_start, min(q_start + 64, doc_end))
        assert all(bounds[row] == (doc_start, doc_end) for row in rows)
        covered[list(rows)] += 1
    assert bool((covered == 1).all())
    assert table.shape[0] == ta.max_tiles(len(docs), sum(docs), 64)


def test_a_table_too_small_is_refused():
    with pytest.raises(ValueError):
        ta.tile_table([64, 64], block_m=64, tiles=1)


def test_graph_planner_refuses_another_shape():
    planner = ta.TritonAttention("cpu", 1.0).graph_planner(2, 10)
    with pytest.raises(ValueError):
        planner.plan([5, 6])
